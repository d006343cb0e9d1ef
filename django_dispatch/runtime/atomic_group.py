"""Atomic jobs run back to back on one job thread share one transaction and one commit.

Alone, an atomic job is a writing transaction of its own (``atomic``): its
commit waits for a WAL flush, and its success is an UPDATE of its own, where a
wave of plain successes shares one of each among many jobs. A job thread that
finds another atomic job waiting when one ends runs it in the same
transaction, its body behind a savepoint of its own, and the group's
successes go with one fenced statement and one COMMIT (``store.atomic_group``).

What each job is promised stays what ``atomic`` promises:

- its writes commit only with its success, fenced by its lease. If any
  member's lease was lost, the whole group rolls back, and the others go back
  to the queue without spending an attempt (``outcomes.release``): they run
  again, as after a crash, their writes never kept twice;
- a body that raises, returns what is not JSON, marks its transaction for
  rollback, or is stopped, is undone alone (its savepoint, and the
  ``on_commit`` callbacks it registered); the members before it commit, then
  its failure is written as any other, in its own transaction;
- nothing locks a job's row before the group's last statement: the heartbeat
  renews the members' leases while they wait, and a frozen thread blocks no
  reclaim. A thread given up on (``JobThreads.retire``), or one whose
  members have waited past ``MAX_WAIT_SECONDS`` for a later member's body
  (``stuck``: the control loop looks every turn), has its members handed back
  and its transaction ended on the server (``forsake``): their successes
  would wait on that body, and their writes hold row locks. The body then
  running goes back too, unspent, once it returns: its writes went with the
  transaction, through no fault of its own.

A success waits for its commit only briefly: a group takes only short jobs
(every recent job under ``SHORT_JOB_SECONDS``, the slowest decaying as
claiming ahead's measure does: ``Slots.ran``), at most ``MAX_MEMBERS`` (each
member is a subtransaction, and past 64 that wrote PostgreSQL's snapshots get
slower for every session), for at most ``MAX_SECONDS`` (a job that finds its
group full, old or broken opens the next one), and it commits as soon
as its thread finds no job waiting (or, while the last claim took all it asked
for, none within ``WAIT_SECONDS``). A member's row locks last until that
commit: two groups that write the same rows in opposite orders can deadlock,
and the member the server then fails goes back to the queue, no attempt spent,
when grouping may have caused it (its group held earlier members' writes).
A ``task_started`` receiver of the site's keeps a task out of groups: it runs
before the body, and would write inside the group's transaction.

Unkeyed jobs on PostgreSQL with psycopg 3 only: a keyed job (its partition's
lock and promotion), SQLite (one writer: a long transaction would hold it)
and psycopg 2 take ``atomic``'s path, one transaction per job.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, InterfaceError, connections, transaction
from django.db.transaction import TransactionManagementError

from ..compat import task_started
from ..conf import usage_recorded
from ..store import atomic_finish, atomic_group
from ..store.usage import UsageEntry
from ..tasks.results import only_own_receivers, signal_sender
from . import attempt, metering
from .connections import contention, lost_connection
from .executor import Outcome
from .running import RunningJob
from .slots import Slots

logger = logging.getLogger("django_dispatch.worker")

#: The most jobs one group holds.
MAX_MEMBERS = 16
#: The longest a group stays open (from its first body's start) before it
#: takes no more members: a success waits for its group's commit about that
#: long at most, plus the length of the job it then waits for.
MAX_SECONDS = 0.1
#: The slowest recent job (``Slots.job_seconds``, decaying) that lets a group
#: form, which bounds that last wait. Above claiming ahead's 50 ms: on a busy
#: machine a short job's wall time, waits for a core included, often passes
#: that, and each time grouping stopped for a few dozen jobs.
SHORT_JOB_SECONDS = 0.1
#: How long a thread with an open group waits for its next job before it
#: commits, while jobs are left in the queue: the claim that refills the
#: slots the members freed comes within a round trip, and each member that
#: joins shares the group's one statement and commit.
WAIT_SECONDS = 0.01
#: How often a thread looks for its next job meanwhile.
PATIENCE_POLL = 0.002
#: The longest a member's success may wait for the bodies after it in its
#: group (past ``MAX_SECONDS``, when no member joins any more): a group only
#: forms while jobs run short, but one that turns out long (a hung HTTP call)
#: would hold the others' commits, and their row locks, for as long as it runs.
MAX_WAIT_SECONDS = 1.0
#: The most job ids kept to run alone (``_SOLO``): a member handed back may run
#: on another worker and never come back here.
SOLO_MAX = 10_000
#: What ``AtomicGroup.next_from`` returns when no job came.
NOTHING = object()
#: Why a member goes back unspent (its log line).
FORSAKEN = "its group of atomic jobs was given up on, its transaction ended under it"
CONTENDED = "deadlock or serialization failure behind its group's writes; runs alone next"


@dataclass(eq=False)
class Member:
    """A success waiting in its thread's group for the group's commit."""

    running: RunningJob
    outcome: Outcome
    meter: metering.Meter | None
    entry: UsageEntry | None


class AtomicGroup:
    """One job thread's group: its open transaction and the successes waiting in it."""

    def __init__(self, db: str, slots: Slots) -> None:
        self.db = db
        self.slots = slots
        self.block: transaction.Atomic | None = None
        self.members: list[Member] = []
        self.opened_at = 0.0
        #: Nothing in the transaction may commit: an undo failed (the
        #: connection broke), or the thread was given up on (``forsake``).
        self.broken = False
        #: ``forsake`` ended the transaction under a running body: that body's
        #: job goes back unspent, whatever its body then did.
        self.forsaken = False
        #: ``forsake`` against the thread's own ``settle`` and joins.
        self.lock = threading.Lock()
        #: The server process of the open transaction (``forsake`` ends it).
        self.backend: int | None = None
        #: The last commit's ``on_commit`` callbacks, for ``run_callbacks``.
        self.callbacks: list[Any] = []
        #: Members' savepoints numbered so far: each gets a name of its own.
        self.savepoints = 0
        #: The number of the open transaction's first savepoint taken (``_taken``).
        self.first_savepoint: int | None = None

    @property
    def open(self) -> bool:
        return self.block is not None

    def accepts(self, running: RunningJob) -> bool:
        """Whether ``running`` may run in this group now (opening it if none is open)."""
        return self.eligible(running) and self.has_room()

    def eligible(self, running: RunningJob) -> bool:
        """Whether ``running`` may run in a group at all: in this one if it has
        room, else in the next, once this one is settled."""
        seconds = self.slots.job_seconds  # the cheap test first: per job
        if seconds is None or seconds >= SHORT_JOB_SECONDS:
            return False
        task = attempt.resolve(running)
        if (
            task is None
            or not getattr(task, "atomic", False)
            or running.claimed.row["partition_key"]
            or not atomic_finish.fast_path_available(self.db, running.claimed.lease)
            # Above it, later members would read the group's first snapshot.
            or not atomic_group.read_committed(self.db)
            # ``task_started`` receivers (user code) run before the body; in a
            # group their writes would join its transaction.
            or not only_own_receivers(task_started, signal_sender(task))
        ):
            return False
        if _SOLO and running.claimed.id in _SOLO:  # runs alone once: see ``settle``
            _SOLO.discard(running.claimed.id)
            return False
        return True

    def has_room(self) -> bool:
        """Whether another member may join: none open yet, or the open group
        neither broken, full, nor past ``MAX_SECONDS``."""
        if self.block is None:
            return True
        return (
            not self.broken
            and len(self.members) < MAX_MEMBERS
            and time.monotonic() - self.opened_at < MAX_SECONDS
        )

    def patience(self) -> float:
        """How long the thread may wait for a next member before committing:
        only while the last claim took all it asked for (``Slots.backlog``),
        never past ``MAX_SECONDS``. Without a backlog a success does not wait for
        a job that may never come."""
        if not self.slots.backlog:
            return 0.0
        return max(0.0, min(WAIT_SECONDS, self.opened_at + MAX_SECONDS - time.monotonic()))

    def next_from(self, inbox: queue.SimpleQueue[Any]) -> Any:
        """The inbox's next item within ``patience``, else ``NOTHING``.

        Polled, not ``inbox.get(timeout=...)``: a timed get on a queue that
        several threads wait on can miss its deadline and wait for ever (it
        did, on CPython 3.12, holding a worker's last jobs unsettled in its
        group), and a group must never wait past its patience.
        """
        deadline = time.monotonic() + self.patience()
        while True:
            try:
                return inbox.get_nowait()
            except queue.Empty:
                if time.monotonic() >= deadline:
                    return NOTHING
                time.sleep(PATIENCE_POLL)

    def execute(self, running: RunningJob) -> Outcome:
        """``attempt.execute`` for a job ``accepts`` took: a success joins the group
        (``RunningJob.grouped``); anything else left nothing behind and is the caller's to write,
        once the group is settled."""
        claimed = running.claimed
        prepared = attempt.prepare(claimed, running)
        if isinstance(prepared, Outcome):
            return prepared
        if self.block is None:
            block = transaction.atomic(using=self.db)
            block.__enter__()
            self.block, self.opened_at = block, time.monotonic()
            self.broken = self.forsaken = False
            self.savepoints, self.first_savepoint = 0, None
            self.backend = atomic_group.backend_pid(self.db)
        connection = connections[self.db]
        hooks = len(connection.run_on_commit)
        self.savepoints += 1
        try:
            savepoint = atomic_group.member_savepoint(self.db, self.savepoints)
        except (DatabaseError, InterfaceError):  # its code has not started
            self.broken = True
            return Outcome(kind="released")
        begin = (
            savepoint
            if savepoint is not None
            else atomic_finish.begin_with_first_statement(self.db)
        )
        try:
            with begin:
                value = prepared.task.func(*prepared.args, **prepared.kwargs)
            if savepoint is not None and atomic_group.ended(self.db, savepoint):
                raise TransactionManagementError(atomic_group.ENDED)
            if connection.needs_rollback or atomic_group.aborted(self.db):
                raise TransactionManagementError(atomic_finish.MARKED_FOR_ROLLBACK)
        except BaseException as e:
            self._taken(savepoint)
            self._undo(connection, savepoint, hooks)
            if self.forsaken:  # its error may be the ended transaction's: not its own
                return Outcome(kind="released", why=FORSAKEN)
            if savepoint is not None and contention(e):  # earlier members' writes held locks
                _run_alone([claimed.id])  # alone next time: a deadlock of its own then counts
                return Outcome(kind="released", why=CONTENDED)
            if self.broken and savepoint is not None:  # its undo failed: the group rolls back
                _run_alone([claimed.id])  # and its retry must not take another one with it
            return attempt.conclude(claimed, running, prepared, error=e)
        self._taken(savepoint)
        try:  # nothing the body wrote may stay behind unless its success joins
            outcome = attempt.conclude(claimed, running, prepared, value=value)
            if outcome.kind == "succeeded":
                self._join(running, outcome)
                return outcome
        except BaseException:
            self._undo(connection, savepoint, hooks)
            raise
        self._undo(connection, savepoint, hooks)
        return outcome

    def _taken(self, savepoint: atomic_group.MemberSavepoint | None) -> None:
        """Keep the number of the transaction's first savepoint taken: the
        group's commit releases it, which fails if a body ended the
        transaction meanwhile (``commit_successes_if_leased``)."""
        if self.first_savepoint is None and savepoint is not None and savepoint.taken:
            self.first_savepoint = savepoint.number

    def _join(self, running: RunningJob, outcome: Outcome) -> None:
        """The success waits for the group's commit; its slot counts free meanwhile."""
        claimed = running.claimed
        meter = metering.METERS.get(claimed.id)
        if meter is not None:
            meter.stop()  # the record measures the body, not the wait
        entry = metering.entry(claimed, "succeeded") if usage_recorded("succeeded") else None
        with self.lock:
            running.finished, running.grouped = outcome, True
            self.members.append(Member(running, outcome, meter, entry))

    def _undo(
        self, connection: Any, savepoint: atomic_group.MemberSavepoint | None, hooks: int
    ) -> None:
        """Undo one member's writes and the ``on_commit`` callbacks it registered."""
        try:
            atomic_group.member_undo(self.db, savepoint)
        except (DatabaseError, InterfaceError):
            self.broken = True  # the group rolls back whole when settled
            return
        connection.needs_rollback = False
        del connection.run_on_commit[hooks:]

    def stuck(self, now: float) -> bool:
        """Whether members waited past ``MAX_WAIT_SECONDS`` (read unlocked: a
        ``settle`` meanwhile leaves ``forsake`` no member, and it ends nothing)."""
        return bool(self.members) and now - self.opened_at > MAX_SECONDS + MAX_WAIT_SECONDS

    def settle(self) -> tuple[list[Member], bool]:
        """Commit the members' successes with their writes, or roll all back.

        The members, and whether they won (committed); never raises. Not won:
        nothing committed, and the caller hands each back (fenced: a member
        whose lease was lost meanwhile is left to whoever holds it now). When
        the commit failed on what a member wrote (a deferred constraint checked
        at COMMIT), the group cannot tell which: each member then runs alone
        next time (``_SOLO``), where the culprit's attempt fails as a lone
        atomic job's would, and no member loops back to the queue for ever.
        """
        with self.lock:
            block, members, broken = self.block, self.members, self.broken
            first_savepoint = self.first_savepoint
            self.block, self.members = None, []
        if block is None:
            return members, False
        # Without members nothing in the transaction may commit.
        won, error = bool(members) and not broken, None
        if members and not broken:
            results = [(m.running.claimed.lease, m.outcome.return_value) for m in members]
            usage = {m.running.claimed.id: m.entry for m in members if m.entry is not None}
            try:
                won = atomic_group.commit_successes_if_leased(
                    results, usage or None, db=self.db, first_savepoint=first_savepoint
                )
            except Exception as e:  # nothing committed, or (connection lost) not known
                logger.warning(
                    "a group of atomic jobs (%s) could not commit: each goes back to the "
                    "queue without spending an attempt%s",
                    ", ".join(str(m.running.claimed.id) for m in members),
                    "" if lost_connection(e) else ", and runs alone next time in this process",
                    exc_info=True,
                )
                won, error = False, e
                if not lost_connection(e):
                    _run_alone(m.running.claimed.id for m in members)
        self.callbacks = atomic_group.leave_block(block, self.db, won, error)
        return members, won

    def run_callbacks(self) -> None:
        """The committed members' ``on_commit`` callbacks, each on its own (one
        that raises is logged; the others still run), after ``settle``: user
        code, which must not keep the members from being ended."""
        callbacks, self.callbacks = self.callbacks, []
        for func in callbacks:
            try:
                func()
            except Exception:
                logger.exception("an on_commit callback of an atomic task failed")

    def forsake(self) -> list[Member]:
        """From another thread, when this one is given up on or ``stuck``: its
        members, taken out to be handed back. Its own ``settle`` then commits
        nothing, and the open transaction's server process is ended: the
        members' writes would otherwise hold their row locks, against the
        members' own next runs, for as long as the stuck body runs. The lock
        is held until then: released earlier, the thread could settle, open
        its next group on the same connection, and lose that one's work too."""
        with self.lock:
            members, self.members = self.members, []
            backend = self.backend if self.block is not None else None
            if backend is None:
                return members
            self.broken = True
            if not members:
                return members
            self.forsaken = True
            try:
                atomic_group.end_backend(self.db, backend)
            except (DatabaseError, InterfaceError):
                logger.warning(
                    "could not end the transaction of a stuck group of atomic jobs: the "
                    "row locks of its writes stay until its body returns",
                    exc_info=True,
                )
        return members


#: Jobs whose group failed to commit for a reason none of them could be told
#: from, or that met a deadlock or serialization failure behind the group's
#: earlier writes: each runs alone once (``AtomicGroup.eligible``). Shared by
#: the process's threads (set operations are atomic under the GIL).
_SOLO: set[int] = set()


def _run_alone(job_ids: Iterable[int]) -> None:
    if len(_SOLO) > SOLO_MAX:  # ids of jobs that ran elsewhere since
        _SOLO.clear()
    _SOLO.update(job_ids)
