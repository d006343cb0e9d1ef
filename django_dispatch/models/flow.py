"""Flow control state (paused queues, concurrency and rate counters); see issue #17."""

from __future__ import annotations

__all__: list[str] = []
