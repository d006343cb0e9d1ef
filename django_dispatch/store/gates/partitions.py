"""The partition gate: of a partition's candidates, only its head, and only while
nothing else of it runs.

Jobs sharing a partition key run one at a time, in order (``partitions``
holds the heads and the locks). Candidates that wait behind their head are
demoted (pending -> blocked, out of the claim index) in the claim's own
transaction, so later claims do not read them again.
"""

from __future__ import annotations

from typing import Any

from ..partitions import partition_heads, partitions_demote


def sort_out_partitions(
    db: str,
    rows: list[dict[str, Any]],
    chosen: list[dict[str, Any]],
    passed: list[int],
    namespace: str = "",
) -> tuple[list[dict[str, Any]], int]:
    """Split locked candidates into runnable ones and ones to demote.

    A first look at the keys' heads, without locks, picks the runnable heads
    (leasing one takes no key lock: a key with a running job is not stalled)
    and the jobs that wait behind something. Those are demoted in this transaction by
    ``partitions_demote``, which takes their keys' locks without waiting and
    checks again under them; jobs of a busy key, or found runnable after all,
    are added to ``passed``. Returns (runnable rows, number demoted).
    """
    heads = partition_heads(db, [r["partition_key"] for r in rows if r["partition_key"]], namespace)
    taken = {r["partition_key"] for r in chosen if r["partition_key"]}
    runnable, blocked = [], []
    for row in rows:
        key = row["partition_key"]
        if key is None:
            runnable.append(row)
        elif key not in taken and heads[key].runnable(row["id"]):
            runnable.append(row)
            taken.add(key)
        else:
            blocked.append(row)
    if not blocked:
        return runnable, 0
    demoted = partitions_demote(db, [(row["id"], row["partition_key"]) for row in blocked])
    passed += [row["id"] for row in blocked if row["id"] not in demoted]
    return runnable, len(demoted)
