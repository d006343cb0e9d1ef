"""A worker's whole wave as one statement: its successes, the claim that refills
their slots, in one round trip and one implicit transaction.

A wave written as a transaction takes four round trips (``BEGIN``, the
successes' ``UPDATE``, the claim, ``COMMIT``), and between them the server
session sits idle in a transaction while the worker waits for a CPU: behind
a pooler in transaction mode, 50 busy processes kept 18 of 20 pool sessions
idle that way (docs/performance.md, "Fleet"). Here the fenced finish with
its usage records, the claim's scan and its lease (the functions of
migrations 0027, 0030 and 0032, planned once per server session) are one
statement, sent in autocommit: PostgreSQL runs it as its own transaction,
so the successes and the leases commit together, or neither, as in
``BatchCompleter.write_wave``'s transaction.

Partitions too: a wave whose successes hold partition keys takes the keys'
locks, finishes, and promotes the next job of each key it freed, in that
order, inside ``django_dispatch_finish_keyed_wave``, before the claim locks
any row (key locks before row locks, as every transition of a key takes
them). The lease (``django_dispatch_lease_runnable``) leases unkeyed rows
and keyed rows that are their partition's runnable head (the partition
gate's rule), and demotes keyed rows that wait behind something, where
their key's lock is free. What it neither leases nor demotes (a job of a
concurrency group, a key whose lock is busy) is passed by, its lock ending
with the statement: the result says how many (``WaveResult.passed``), for
the caller to claim them through the gates in a transaction of their own.

While the worker leases step jobs, the wave also claims their steps
(``workflows.preclaim``, the function of migrations 0035 and 0038), committed with
the leases: a step job then sends no claim of its own.

The caller (``runtime.completer``) sends a wave here only in the plain
case: no placement, no queue limits, no concurrency group waiting (due
staging runs first, in a statement of its own).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import connections, transaction

from .base import hot_cursor, job_sql, notify_channel
from .finish import MeasuredUsage, finish_params
from .partitions import lock_partitions, partitions_promote
from .sources.fused_pg import claim_sql, claimed_records
from .sql import text_array
from .types import ClaimedJob, Lease
from .workflows import mapwave, preclaim

_FINISH_ARGS = (
    "%(ids)s::bigint[], %(workers)s::text[],"
    " %(epochs)s::bigint[], %(values)s::jsonb[], %(metered)s::boolean[],"
    " %(walls)s::float8[], %(cpus)s::float8[], %(rss)s::float8[], %(host)s::text,"
    " %(outcome)s::text"
)
#: The finish of the wave's successes and their usage records: the function
#: of migration 0032 (``django_dispatch_finish_wave``), planned once per
#: server session; it reaches the job table by primary key only, in id order,
#: whatever the table held when the session's plan was made
#: (the heartbeat's renewal locks the same rows in the same order). One row:
#: the winners' ids (``won``) and the partition keys they freed (``freed``),
#: each NULL for none. Without usage records the usage arrays are NULL. The
#: casts pick the function's signature.
_FINISH_CALL = "django_dispatch_finish_wave(" + _FINISH_ARGS + ")"
#: The same for a wave whose successes hold partition keys
#: (``django_dispatch_finish_keyed_wave``): the keys' locks first, then the
#: finish, then the promotion of each freed key's next job (and a NOTIFY);
#: ``freed`` is then only the keys it could not promote (not in ``keys``).
_FINISH_KEYED_CALL = (
    "django_dispatch_finish_keyed_wave("
    + _FINISH_ARGS
    + ", %(keys)s::text[], %(key_namespace)s::text, %(channel)s::text)"
)
#: The same for a wave that carries map children's successes (``mapwave``,
#: ``django_dispatch_finish_map_wave``): the children's runs and steps
#: first, then either finish above (``p_keys`` NULL: the plain one); its
#: ``mapped`` says which children it wrote.
_FINISH_MAP_CALL = (
    "django_dispatch_finish_map_wave("
    + _FINISH_ARGS
    + ", %(keys)s::text[], %(key_namespace)s::text, %(channel)s::text, %(map_runs)s::bigint[],"
    " %(map_steps)s::bigint[], %(map_claims)s::text[], %(map_outputs)s::jsonb[])"
)
#: The wave: the finish (``f``), the claim's scan (``candidates``:
#: ``django_dispatch_claim_scan``, 0027's, ``sources.fused_pg.CANDIDATES_CTE``'s
#: filters as an ordered scan of the claim index), then the lease
#: (``django_dispatch_lease_runnable``). One row per candidate, in claim
#: order, each with whether it was leased and how many candidates were
#: demoted, the winners and the keys left to promote on one row only (the
#: candidate with the highest id); one row (the candidate's columns NULL)
#: when the claim found none.
#:
#: Each volatile function runs exactly once whatever the plan: the scan and
#: the lease in MATERIALIZED CTEs (a CTE inlined into a join may be rescanned;
#: ``(l.r).leased`` and ``(l.r).demoted`` read the one result the lease's CTE
#: holds, where ``(f(...)).*`` would call the function once per column), the
#: finish as a function in FROM, whose scan keeps its result and rewinds it
#: when rescanned. Each function's statements take their own snapshots and
#: see what the statement wrote before them. ``candidates`` holds the values
#: from before the lease (``leasing.claimed_job`` applies it); a row counts as
#: leased only if the lease function says so (it leases only rows still
#: pending, keyed ones only as their partition's runnable head). Its ids come
#: in id order (migration 0032), and each candidate is found among them by a
#: binary search (``width_bucket``: the index of the last id not above it;
#: NULL, or 0 whose element is NULL, when none): ``= ANY`` would read the
#: whole array for each candidate, a million comparisons for a wave of a
#: thousand claims, and a join would cost every wave planning. Candidates
#: of a concurrency group are left to the gates. The winners and the freed
#: keys come on one row only: on every row, a wave of a thousand
#: successes and a thousand claims (the asyncio executor's) would send and
#: parse a million ids, hundreds of milliseconds on each side.
_WAVE_SQL = """
WITH <FINISH_CTE>candidates AS MATERIALIZED (
    SELECT {fields}, now() AS db_now
    FROM django_dispatch_claim_scan({namespace}, <WINDOW>, %(queues)s::text[], %(paused)s::text[])
),
lease AS MATERIALIZED (
    SELECT django_dispatch_lease_runnable(array_agg(id), array_agg(partition_key),
        %(worker_id)s::text, %(lease_seconds)s::float8, max(db_now), {namespace}) AS r
    FROM candidates WHERE concurrency_key IS NULL
)<STEPS_CTE>
SELECT CASE WHEN c.id IS NOT DISTINCT FROM (SELECT max(id) FROM candidates) THEN f.won END,
    CASE WHEN c.id IS NOT DISTINCT FROM (SELECT max(id) FROM candidates) THEN f.freed END,
    cardinality((l.r).demoted), <MAPPED><STEP_COLUMNS>c.*,
    c.id = (l.r).leased[width_bucket(c.id, (l.r).leased)]
FROM <FINISH> AS f CROSS JOIN lease AS l LEFT JOIN candidates AS c ON true<STEP_JOIN>
ORDER BY c.priority DESC, c.run_after, c.id
"""
#: With the claim of the leased step jobs' steps (``workflows.preclaim``), or
#: without: each record then leads with ``preclaim.COLUMNS`` more columns.
_STEPS = {
    False: {"<STEPS_CTE>": "", "<STEP_COLUMNS>": "", "<STEP_JOIN>": ""},
    True: {
        "<STEPS_CTE>": preclaim.steps_cte(preclaim.WAVE_LEASED),
        "<STEP_COLUMNS>": "s.*, ",
        "<STEP_JOIN>": " LEFT JOIN steps AS s ON s.o_job = c.id",
    },
}
#: By the wave's finish: plain, keyed, or carrying map children. A keyed
#: wave's finish takes the keys' locks, and a map wave's the children's row
#: locks, which must come before any row lock of the scan: its finish is a
#: MATERIALIZED CTE (``fin``) the scan reads its window from, which runs it
#: first. A plain wave's finish takes no such lock, and is left in FROM: the
#: CTE and the scan's dependency on it cost a plain wave about 0.025 ms of
#: planning and execution in a ~1.2 ms statement. A map wave's records carry
#: one more column (``mapped``, on the winners' row) ahead of the rest.
_WAVE_FINISH = {
    "plain": {
        "<FINISH_CTE>": "",
        "<WINDOW>": "%(window)s::integer",
        "<FINISH>": _FINISH_CALL,
        "<MAPPED>": "",
    },
    "keyed": {
        "<FINISH_CTE>": "fin AS MATERIALIZED (SELECT won, freed FROM "
        + _FINISH_KEYED_CALL
        + "),\n",
        "<WINDOW>": "(SELECT %(window)s::integer FROM fin)",
        "<FINISH>": "fin",
        "<MAPPED>": "",
    },
    "map": {
        "<FINISH_CTE>": "fin AS MATERIALIZED (SELECT won, freed, mapped FROM "
        + _FINISH_MAP_CALL
        + "),\n",
        "<WINDOW>": "(SELECT %(window)s::integer FROM fin)",
        "<FINISH>": "fin",
        "<MAPPED>": "CASE WHEN c.id IS NOT DISTINCT FROM (SELECT max(id) FROM candidates)"
        " THEN f.mapped END, ",
    },
}


def _rendered(*parts: dict[str, str]) -> str:
    """``_WAVE_SQL`` with each part's marks replaced."""
    text = _WAVE_SQL
    for part in parts:
        for mark, value in part.items():
            text = text.replace(mark, value)
    return text


#: By (finish, claiming steps).
_WAVE = {
    (finish, steps): _rendered(_WAVE_FINISH[finish], _STEPS[steps])
    for finish in _WAVE_FINISH
    for steps in (False, True)
}
#: The wave without a claim (no slot to fill).
_FINISH_ONLY = {
    "plain": "SELECT won, freed FROM " + _FINISH_CALL,
    "keyed": "SELECT won, freed FROM " + _FINISH_KEYED_CALL,
    "map": "SELECT won, freed, mapped FROM " + _FINISH_MAP_CALL,
}
#: The function's usage parameters when the wave writes no usage record.
_NO_USAGE = {
    "metered": None,
    "walls": None,
    "cpus": None,
    "rss": None,
    "host": None,
    "outcome": None,
}


@dataclass(frozen=True, slots=True)
class WaveClaim:
    """What the wave's claim takes: up to ``limit`` jobs for ``worker_id``."""

    worker_id: str
    limit: int
    lease_seconds: float
    namespace: str = ""
    queues: Sequence[str] = ()
    #: Paused queues among those served (``flow.claimable_queues``).
    paused: Sequence[str] = ()


@dataclass(slots=True)
class WaveResult:
    """What the wave's statement did, once it committed."""

    won: set[int] = field(default_factory=set)
    claimed: list[ClaimedJob] = field(default_factory=list)
    #: Candidates the claim locked but neither leased nor demoted: the gates decide.
    passed: int = 0
    #: Of those, the jobs of a concurrency group (only the gates may lease them).
    grouped: int = 0
    #: Keyed candidates demoted behind their partition's head (out of the claim index).
    demoted: int = 0
    #: Partition keys its winners freed that their leases did not carry: promote
    #: them (``wave_promote_freed``) once the statement has committed.
    freed: set[str] = field(default_factory=set)
    namespace: str = ""
    #: What the map children it wrote leave to do once it committed (their
    #: sets' counts, the general path of a child it did not write):
    #: ``mapwave.committed``'s, for the caller to run off its hot path.
    after: list[Callable[[], None]] = field(default_factory=list)


def jobs_finish_many_and_claim(
    results: Sequence[tuple[Lease, Any]],
    *,
    db: str,
    claim: WaveClaim | None,
    usage: MeasuredUsage | None = None,
) -> WaveResult:
    """running -> succeeded for ``results`` (fenced, with the winners' ``usage``,
    the keys they free promoted) and the claim of ``claim.limit`` jobs, in one
    statement on PostgreSQL.

    Run outside a transaction, it is one: the successes, the promotions and
    the leases commit together. A winner whose lease did not carry its key
    has its partition promoted after the commit, under the key's lock.
    """
    connection = connections[db]
    claiming = claim is not None and claim.limit > 0
    keys = sorted({lease.partition_key for lease, _ in results if lease.partition_key})
    # In autocommit only: the claims are kept once the statement returns,
    # which must mean they committed (``preclaim``); so are the children.
    autocommit = connection.get_autocommit()
    steps = claiming and autocommit and preclaim.STEP_JOBS.expected()
    children = _children(db, results, autocommit)
    finish = "map" if children else "keyed" if keys else "plain"
    template = _WAVE[finish, steps] if claiming else _FINISH_ONLY[finish]
    params = finish_params(results, usage)
    if not usage:
        params.update(_NO_USAGE)
    if keys or children:
        namespace = results[0][0].namespace
        params.update(
            keys=text_array(keys) if keys else None,
            key_namespace=namespace,
            channel=notify_channel(namespace),
        )
    if children:
        params.update(mapwave.params(db, children))
    if claim is not None and claiming:
        sql = claim_sql(
            queues=bool(claim.queues),
            exclude=False,
            db=db,
            namespace=claim.namespace,
            paused=bool(claim.paused),
            template=template,
        )
        params.update(
            window=claim.limit,
            worker_id=claim.worker_id,
            lease_seconds=claim.lease_seconds,
            queues=list(claim.queues) or None,  # NULL: every queue
            paused=list(claim.paused) or None,
            step_task=preclaim.STEP_TASK,
        )
    else:
        sql = job_sql(connection, template)
    with hot_cursor(connection) as cursor:
        cursor.execute(sql, params)
        records = cursor.fetchall()
    result = _result(records, claim if claiming else None, steps, bool(children), db)
    if children:  # committed: the children are written, or left to their fallback
        at = 3 if claiming else 2
        mapped = next((record[at] for record in records if record[at] is not None), None)
        result.after = mapwave.committed(db, children, mapped)
    if result.freed:
        result.namespace = results[0][0].namespace
    return result


def _children(
    db: str, results: Sequence[tuple[Lease, Any]], autocommit: bool
) -> list[tuple[int, mapwave.Deferred]]:
    """The map children's successes left to this wave (``mapwave``). Outside
    autocommit, a caller's rollback could still undo the wave: they are
    written first, by the general path, as for a wave in a transaction."""
    children = mapwave.pending(db, [(lease.job_id, lease.epoch) for lease, _ in results])
    if children and not autocommit:
        for job, d in children:
            mapwave.flush(db, job, d.epoch)
        return []
    return children


def _result(
    records: Sequence[Sequence[Any]],
    claim: WaveClaim | None,
    steps: bool,
    mapped: bool,
    db: str,
) -> WaveResult:
    """The committed statement's ``records``, read: winners, claims, keys freed."""
    won = next((record[0] for record in records if record[0] is not None), None)
    freed = next((record[1] for record in records if record[1] is not None), None)
    result = WaveResult(won=set(won or ()), freed=set(freed or ()))
    base = 3 + mapped
    skip = base + (preclaim.COLUMNS if steps else 0)
    if claim is not None and records[0][skip] is not None:
        result.claimed, locked = claimed_records(records, skip, claim.worker_id, claim.namespace)
        if steps:  # committed: the jobs' attempts may take them
            preclaim.keep(db, records, base, {job.id: job.lease.epoch for job in result.claimed})
        preclaim.STEP_JOBS.saw(job.row for job in result.claimed)
        result.demoted = records[0][2] or 0
        result.passed = len(locked) - result.demoted
        result.grouped = sum(1 for row in locked if row["concurrency_key"] is not None)
    return result


def wave_promote_freed(result: WaveResult, *, db: str) -> None:
    """Promote the next job of each partition ``result``'s winners freed, under
    the keys' locks. Separate from the wave: the wave has committed by then,
    so a failure here must not be taken for the wave's (its successes are
    written, its claims leased); the leader's sweep promotes a stalled
    partition (``partitions_promote_stalled``) if this never runs."""
    if result.freed:
        with transaction.atomic(using=db):
            lock_partitions(db, result.freed)
            partitions_promote(db, result.freed, result.namespace)
