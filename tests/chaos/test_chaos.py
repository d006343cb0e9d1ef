"""Faults injected into real workers and a real PostgreSQL, with counted side effects.

Run by ``make test-chaos`` (CHAOS_ROUNDS=3) and, bounded (CHAOS_ROUNDS=1), by
``make test``; never by the other runs (marker ``chaos``, DISPATCH_TEST_DB=chaos).
Every scenario runs three ``rundispatch`` processes of four job threads on
the suite's own server, and ends with the same checks (``Chaos.check``):
nothing lost, nothing finished twice, every job finished (successfully unless
the scenario says otherwise), a side effect repeated only for an attempt a
fault cut short, and no worker dead (each stops cleanly on SIGTERM).
"""

from __future__ import annotations

import signal
import time

import pytest

from django_dispatch.core.states import JobState
from django_dispatch.models import Job
from tests.chaos.conftest import ROUNDS, SEED, Chaos, retry_db
from tests.testapp import chaos_tasks
from tests.testapp.models import SideEffect

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

#: The test settings' lease (tests/settings.py): faults are timed against it.
LEASE = 2.0


def _report(name: str, chaos: Chaos, outcome, started: float) -> None:
    print(f"chaos {name} (seed {SEED}): {outcome.summary()} in {time.monotonic() - started:.1f} s")


def test_random_sigkills_of_workers_under_load(chaos: Chaos):
    """Workers SIGKILLed at random moments and restarted: only their attempts repeat."""
    started = time.monotonic()
    chaos.start_workers(3)
    ids = chaos.enqueue(300 * ROUNDS, "kill", seconds=(0.05, 0.15))
    for round_ in range(2 * ROUNDS):
        chaos.wait_progress(ids, (round_ + 1) * len(ids) // (2 * ROUNDS + 2))
        victim = chaos.rng.choice(chaos.workers)
        chaos.kill(victim)
        chaos.start_worker()
    chaos.wait_finished(ids)
    outcome = chaos.check(ids, faulted_pids=chaos.killed_pids)
    assert outcome.lost_attempts > 0, "no kill hit a running job: the scenario tested nothing"
    chaos.stop_workers()
    _report("sigkill", chaos, outcome, started)


@pytest.mark.parametrize(
    "task",
    [
        pytest.param(chaos_tasks.work, id="autocommit"),
        pytest.param(chaos_tasks.work_in_transaction, id="atomic"),
    ],
)
def test_postgres_crashed_under_load_and_restarted(chaos: Chaos, task):
    """``pg_ctl -m immediate stop`` while jobs run: every job still succeeds, once.

    The crash reaches tasks in the middle of their work: in autocommit, or
    inside ``transaction.atomic()``. Either way the attempt was cut by the
    database, so it runs again without spending an attempt.
    """
    started = time.monotonic()
    chaos.start_workers(3)
    ids = chaos.enqueue(300 * ROUNDS, "crash", seconds=(0.05, 0.15), task=task)
    for round_ in range(ROUNDS):
        chaos.wait_progress(ids, (round_ + 1) * len(ids) // (ROUNDS + 2))
        chaos.crash_postgres(down_for=1.0)
    chaos.wait_finished(ids)
    outcome = chaos.check(ids)
    chaos.assert_fault_seen()
    chaos.stop_workers()
    _report(f"postgres crash under load ({task.name})", chaos, outcome, started)


@pytest.mark.parametrize("fault", ["postgres-crash", "pgbouncer-restart"])
def test_idle_workers_survive_a_restart_and_every_new_job_succeeds(chaos: Chaos, fault: str):
    """Issue 11's headline: after a restart while workers were idle, 200 new jobs all succeed.

    Each job thread holds the connection the restart broke. None may hand it
    to a task: every job succeeds on its first attempt, none re-runs, none
    is dead-lettered. A PgBouncer restart (workers through it, LISTEN off)
    breaks the client connections the same way.
    """
    started = time.monotonic()
    via = "pgbouncer" if fault == "pgbouncer-restart" else "postgres"
    chaos.start_workers(3, via=via)
    warm_up = chaos.enqueue(48, "warm", seconds=(0.3, 0.3))
    chaos.wait_finished(warm_up, timeout=60)
    threads = {
        (job["worker_ids"][-1], job["return_value"]["thread"])
        for job in Job.objects.filter(pk__in=warm_up).values("worker_ids", "return_value")
    }
    assert len(threads) == 12, f"the warm-up used {len(threads)} of the 12 job threads"
    time.sleep(1.5)  # idle

    for round_ in range(ROUNDS):
        if fault == "postgres-crash":
            chaos.crash_postgres(down_for=0.5)
        else:
            chaos.restart_pgbouncer(down_for=0.5)
        ids = chaos.enqueue(200, f"after-{round_}", seconds=(0.0, 0.02))
        chaos.wait_finished(ids, timeout=60)
        outcome = chaos.check(ids, faulted_pids=set())
        strays = {
            job_id: (job["attempts"], job["worker_lost_count"], job["errors"])
            for job_id, job in outcome.jobs.items()
            if job["attempts"] != 1 or job["worker_lost_count"] or job["errors"]
        }
        assert not strays, f"jobs that did not succeed at the first go: {strays}"
        assert outcome.duplicates == 0
        chaos.assert_fault_seen()
        time.sleep(1.5)  # idle again before the next round
    chaos.stop_workers()
    _report(f"idle {fault}", chaos, outcome, started)


def test_a_worker_frozen_past_its_lease_is_fenced(chaos: Chaos):
    """SIGSTOP a worker with jobs running, past its lease; SIGCONT once others ran them.

    Its jobs are reclaimed and succeed on other workers while it is frozen;
    when it wakes, its late completions are rejected by the lease fence (its
    log says so), none of its results lands, and it goes on working.
    """
    started = time.monotonic()
    victim, *_ = chaos.start_workers(3)
    ids: list[int] = []
    for round_ in range(ROUNDS):
        # A short backlog per round, so that the frozen worker's jobs, once
        # reclaimed, are not queued behind hundreds of others.
        ids += chaos.enqueue(48, f"freeze-{round_}", seconds=(0.3, 0.6))
        _freeze_past_the_lease(chaos, victim)
    chaos.wait_finished(ids)
    outcome = chaos.check(ids, faulted_pids={victim.pid})

    # Awake again, the victim keeps working.
    more = chaos.enqueue(60, "after-freeze", seconds=(0.05, 0.1))
    chaos.wait_finished(more)
    chaos.check(more, faulted_pids=set())
    assert SideEffect.objects.filter(
        job_id__in=[str(i) for i in more], note="run", worker_pid=victim.pid
    ).exists(), "the woken worker claimed nothing afterwards"
    chaos.stop_workers()
    _report("sigstop past the lease", chaos, outcome, started)


def _freeze_past_the_lease(chaos: Chaos, victim) -> None:
    """One round: SIGSTOP with jobs running, their success elsewhere, SIGCONT, the fence."""

    def victim_jobs() -> list[int]:
        return list(
            Job.objects.filter(
                state=JobState.RUNNING, worker_id__contains=f":{victim.pid}:"
            ).values_list("id", flat=True)
        )

    chaos.wait(lambda: len(victim_jobs()) >= 2, 30, "the victim to run jobs")
    victim.signal(signal.SIGSTOP)
    chaos.killed_pids.add(victim.pid)
    held = victim_jobs()  # its rows stay running, leased to the frozen worker
    try:
        chaos.wait(
            lambda: Job.objects.filter(pk__in=held, state=JobState.SUCCEEDED).count() == len(held),
            LEASE * 6,
            "the frozen worker's jobs to succeed elsewhere",
        )
    except AssertionError as e:
        rows = list(
            Job.objects.filter(pk__in=held).values(
                "id", "state", "worker_id", "lease_expires_at", "worker_lost_count"
            )
        )
        logs = "\n".join(w.output()[-4000:] for w in chaos.workers if w is not victim)
        raise AssertionError(f"{e}: {rows}\n{logs}") from None
    finally:
        victim.signal(signal.SIGCONT)
    chaos.wait(
        lambda: all(f"job {job_id}: " in _lost_lines(victim.output()) for job_id in held),
        LEASE * 5,
        "the woken worker to find its late writes fenced",
    )
    for job in Job.objects.filter(pk__in=held):
        assert job.worker_lost_count >= 1 and f":{victim.pid}:" not in job.worker_ids[-1]
    late = SideEffect.objects.filter(
        job_id__in=[str(i) for i in held], note="finished", worker_pid=victim.pid
    )
    assert not late.exists(), "a fenced-out worker's success was recorded"


def _lost_lines(log: str) -> str:
    return "\n".join(line for line in log.splitlines() if "lost" in line)


def test_pgbouncer_restarted_under_load(chaos: Chaos):
    """Workers through PgBouncer (transaction mode, LISTEN off); it restarts mid-load."""
    started = time.monotonic()
    chaos.start_workers(3, via="pgbouncer")
    ids = chaos.enqueue(300 * ROUNDS, "bouncer", seconds=(0.05, 0.15))
    for round_ in range(ROUNDS):
        chaos.wait_progress(ids, (round_ + 1) * len(ids) // (ROUNDS + 2))
        chaos.restart_pgbouncer(down_for=0.5)
    chaos.wait_finished(ids)
    outcome = chaos.check(ids)
    chaos.assert_fault_seen()
    chaos.stop_workers()
    _report("pgbouncer restart under load", chaos, outcome, started)


@pytest.fixture
def low_server_timeouts(chaos: Chaos):
    """``idle_in_transaction_session_timeout`` and ``statement_timeout`` low, server-wide."""
    server = chaos.server
    server.execute("ALTER SYSTEM SET idle_in_transaction_session_timeout = '300ms'")
    server.execute("ALTER SYSTEM SET statement_timeout = '500ms'")
    server.execute("SELECT pg_reload_conf()")
    yield
    retry_db(lambda: server.execute("ALTER SYSTEM RESET idle_in_transaction_session_timeout"))
    server.execute("ALTER SYSTEM RESET statement_timeout")
    server.execute("SELECT pg_reload_conf()")


def test_low_server_timeouts_under_load(chaos: Chaos, low_server_timeouts):
    """The worker never idles in a transaction nor runs long statements.

    Beside the load, jobs whose own code breaks the limits fail (theirs is
    the fault), and the sessions the server ended under them never reach the
    next job on their thread: every other job succeeds at the first go.
    """
    started = time.monotonic()
    chaos.start_workers(3, overrides={"MAX_WORKER_LOST": 2})
    ids = chaos.enqueue(200 * ROUNDS, "load", seconds=(0.02, 0.08))
    slow_sql = chaos.enqueue(
        4 * ROUNDS, "slow-sql", seconds=(1.0, 1.0), task=chaos_tasks.over_statement_timeout
    )
    idle_tx = chaos.enqueue(
        4 * ROUNDS, "idle-tx", seconds=(0.8, 0.8), task=chaos_tasks.idle_in_transaction
    )
    chaos.wait_finished(ids + slow_sql + idle_tx)
    outcome = chaos.check(ids)
    strays = [i for i, job in outcome.jobs.items() if job["attempts"] != 1 or job["errors"]]
    assert not strays, f"load jobs hit by the timeouts: {strays}"
    offenders = chaos.check(slow_sql, expect=JobState.FAILED)
    for job in offenders.jobs.values():
        assert "statement timeout" in job["errors"][-1]["message"], job["errors"]
    idle = chaos.check(idle_tx, expect=JobState.FAILED)
    for job in idle.jobs.values():
        assert any("idle-in-transaction" in e["message"] for e in job["errors"]), job["errors"]
    chaos.stop_workers()
    _report("low server timeouts", chaos, outcome, started)
