"""Artifacts and their links to owners; see issue #18."""

from __future__ import annotations

__all__: list[str] = []
