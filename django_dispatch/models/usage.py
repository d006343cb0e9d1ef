"""Per-attempt usage records (JobUsage); see issue #16."""

from __future__ import annotations

__all__: list[str] = []
