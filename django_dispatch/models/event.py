"""Events (publish/subscribe/ack) and what durable workflow waits need; see issue #15."""

from __future__ import annotations

__all__: list[str] = []
