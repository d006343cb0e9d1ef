"""What else the leader sweeps with each reclaim, registered by the features above.

``sweep(older_than_seconds, namespace)`` for each entry: features above the
runtime add theirs at startup (the workflows: their steps whose job ended
without finishing them), so the runtime imports none of them. A module of
its own, with no imports, so that registering costs a web process nothing.
"""

from __future__ import annotations

from collections.abc import Callable

RECLAIM_SWEEPS: list[Callable[[float, str], object]] = []
