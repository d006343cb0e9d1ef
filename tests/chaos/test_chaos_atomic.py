"""Exactly-once database effects under faults: atomic tasks and steps against their plain twins.

Each execution of the load's task inserts one ``note="effect"`` row with no
unique key (``atomic_tasks._effect``), so every execution that committed is
counted. The atomic task must end with exactly one row per job under random
SIGKILLs, a worker frozen past its lease and then woken, and a PostgreSQL
crash; the same task without ``atomic=True``, under the same faults, must
show duplicates, or the scenario proved nothing. The same holds for a
workflow step with ``atomic=True`` (``atomic_workflows.effect_once``, one
row per execution, keyed by its run) against the same step without it.
"""

from __future__ import annotations

import signal
import time
from collections import Counter

import pytest
from django.db.models import Count

from django_dispatch.core.states import JobState
from django_dispatch.core.workflow_states import RUN_ACTIVE, RunState
from django_dispatch.models import Job, WorkflowRun
from django_dispatch.workflows.testing import RUN_STEP_PATH
from tests.chaos.conftest import ROUNDS, SEED, Chaos, retry_db
from tests.testapp import atomic_tasks, atomic_workflows
from tests.testapp.models import SideEffect

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

#: The test settings' lease (tests/settings.py): faults are timed against it.
LEASE = 2.0

#: Each task with how long its jobs work: jobs of a few milliseconds run in
#: groups sharing one transaction (``runtime.atomic_group``), so a fault hits
#: successes that wait for their group's commit.
SECONDS = (0.05, 0.15)
SHORT = (0.001, 0.01)
TASKS = [
    pytest.param(atomic_tasks.effect_atomic, SECONDS, id="atomic"),
    pytest.param(atomic_tasks.effect_atomic, SHORT, id="atomic-grouped"),
    pytest.param(atomic_tasks.effect_plain, SECONDS, id="plain"),
]


def _effects(ids: list[int]) -> Counter[int]:
    rows = retry_db(
        lambda: list(
            SideEffect.objects.filter(job_id__in=[str(i) for i in ids], note="effect").values_list(
                "job_id", flat=True
            )
        )
    )
    return Counter(int(job_id) for job_id in rows)


def _check(chaos: Chaos, ids: list[int], task, name: str, started: float) -> None:
    """Every job succeeded; atomic: one effect each; plain: some job has more."""
    states = Counter(
        retry_db(lambda: list(Job.objects.filter(pk__in=ids).values_list("state", flat=True)))
    )
    assert states == {JobState.SUCCEEDED: len(ids)}, states
    counts = _effects(ids)
    duplicates = sum(n - 1 for n in counts.values() if n > 1)
    if task is atomic_tasks.effect_atomic:
        wrong = {job_id: counts[job_id] for job_id in ids if counts[job_id] != 1}
        assert not wrong, (
            f"jobs without exactly one effect (job: rows): {dict(list(wrong.items())[:20])}"
        )
    else:
        assert not [job_id for job_id in ids if not counts[job_id]]
        assert duplicates > 0, "the plain twin shows no duplicate: the faults tested nothing"
    print(
        f"chaos {name} ({task.name}, seed {SEED}): {len(ids)} jobs, {duplicates} duplicate "
        f"effects in {time.monotonic() - started:.1f} s"
    )


def _check_grouped(ids: list[int]) -> None:
    """Some jobs were finished by one statement (one ``finished_at``): groups formed."""
    shared = retry_db(
        lambda: (
            Job.objects.filter(pk__in=ids)
            .values("finished_at")
            .annotate(n=Count("id"))
            .filter(n__gt=1)
            .count()
        )
    )
    assert shared, "no two jobs committed together: no group formed, the scenario tested nothing"


def _freeze_past_the_lease(chaos: Chaos, victim, *, until_taken_over: bool = False) -> None:
    """SIGSTOP the victim with jobs running (bodies open), let others run them, SIGCONT.

    A step job's body is its step's: the same freeze serves steps, with
    ``until_taken_over``: thawed once another worker runs each of its jobs,
    not once they succeeded. The victim may be frozen inside a step's
    success, holding its run's lock, which the new attempt's success waits for.
    """

    def victim_jobs() -> list[int]:
        return list(
            Job.objects.filter(
                state=JobState.RUNNING, worker_id__contains=f":{victim.pid}:"
            ).values_list("id", flat=True)
        )

    chaos.wait(lambda: len(victim_jobs()) >= 2, 30, "the victim to run jobs")
    victim.signal(signal.SIGSTOP)
    chaos.killed_pids.add(victim.pid)
    held = victim_jobs()
    elsewhere = Job.objects.filter(pk__in=held, state=JobState.SUCCEEDED)
    if until_taken_over:
        others = Job.objects.filter(pk__in=held, state=JobState.RUNNING).exclude(
            worker_id__contains=f":{victim.pid}:"
        )
        elsewhere = elsewhere | others
    try:
        # The frozen bodies hold their transactions open: the reclaim must not
        # wait for them. A lease and a sweep take about 3 s; the rest is room
        # for a slow, loaded machine.
        chaos.wait(
            lambda: elsewhere.count() == len(held),
            LEASE * 15,
            "the frozen worker's jobs to be taken over elsewhere",
        )
    except AssertionError as e:
        rows = retry_db(
            lambda: list(
                Job.objects.filter(pk__in=held).values(
                    "id", "state", "worker_id", "lease_expires_at", "attempts"
                )
            )
        )
        raise AssertionError(f"{e}: the frozen worker's jobs now: {rows}") from None
    finally:
        victim.signal(signal.SIGCONT)
    time.sleep(LEASE)  # the woken worker finishes its bodies: fenced out, rolled back


@pytest.mark.parametrize(("task", "seconds"), TASKS)
def test_one_effect_per_job_under_sigkills_and_a_frozen_worker(chaos: Chaos, task, seconds):
    started = time.monotonic()
    chaos.start_workers(3)
    short = seconds == SHORT
    ids = chaos.enqueue((600 if short else 150) * ROUNDS, "kill", seconds=seconds, task=task)
    for round_ in range(2 * ROUNDS):
        chaos.wait_progress(ids, (round_ + 1) * len(ids) // (2 * ROUNDS + 2))
        chaos.kill(chaos.rng.choice(chaos.workers))
        chaos.start_worker()
    chaos.wait_finished(ids)
    for round_ in range(ROUNDS):
        # A short backlog per round, so that the frozen worker's jobs, once
        # reclaimed, are not queued behind many others.
        ids += chaos.enqueue(
            300 if short else 48,
            f"freeze-{round_}",
            seconds=SHORT if short else (0.3, 0.6),
            task=task,
        )
        _freeze_past_the_lease(chaos, chaos.workers[0])
    chaos.wait_finished(ids)
    lost = retry_db(
        lambda: sum(Job.objects.filter(pk__in=ids).values_list("worker_lost_count", flat=True))
    )
    assert lost > 0, "no fault hit a running job: the scenario tested nothing"
    _check(chaos, ids, task, "sigkills and a frozen worker", started)
    if short:
        _check_grouped(ids)
    chaos.stop_workers()


@pytest.mark.parametrize(("task", "seconds"), TASKS)
def test_one_effect_per_job_when_postgres_crashes_under_load(chaos: Chaos, task, seconds):
    started = time.monotonic()
    chaos.start_workers(3)
    count = (800 if seconds == SHORT else 200) * ROUNDS
    ids = chaos.enqueue(count, "crash", seconds=seconds, task=task)
    for round_ in range(ROUNDS):
        chaos.wait_progress(ids, (round_ + 1) * len(ids) // (ROUNDS + 2))
        chaos.crash_postgres(down_for=1.0)
    chaos.wait_finished(ids)
    chaos.assert_fault_seen()
    _check(chaos, ids, task, "postgres crash under load", started)
    if seconds == SHORT:
        _check_grouped(ids)
    chaos.stop_workers()


# --- atomic steps ------------------------------------------------------------------

STEPS = [
    pytest.param(atomic_workflows.effect_atomic, id="atomic-step"),
    pytest.param(atomic_workflows.effect_plain, id="plain-step"),
]


def _start_runs(chaos: Chaos, workflow, count: int, prefix: str, seconds) -> list[int]:
    """``count`` runs of the one-step effect workflow; their ids."""
    inputs = [
        {"key": f"{prefix}-{i}", "seconds": round(chaos.rng.uniform(*seconds), 3)}
        for i in range(count)
    ]
    return [retry_db(lambda value=value: workflow.start(value).pk) for value in inputs]


def _runs_succeeded(ids: list[int]) -> int:
    return retry_db(
        lambda: WorkflowRun.objects.filter(pk__in=ids, state=RunState.SUCCEEDED).count()
    )


def _wait_runs(chaos: Chaos, ids: list[int], done: int | None = None, timeout=120.0) -> None:
    if done is not None:
        chaos.wait(lambda: _runs_succeeded(ids) >= done, timeout, f"{done} runs to succeed")
        return
    unfinished = WorkflowRun.objects.filter(pk__in=ids, state__in=list(RUN_ACTIVE))
    try:
        chaos.wait(lambda: not unfinished.exists(), timeout, "every run to finish")
    except AssertionError:
        left = retry_db(lambda: list(unfinished.values("id", "state")[:10]))
        logs = "\n".join(w.output()[-3000:] for w in chaos.workers)
        raise AssertionError(f"runs left unfinished: {left}\n{logs}") from None


def _check_steps(ids: list[int], workflow, name: str, started: float) -> None:
    """Every run succeeded; atomic: one effect each; plain: some run has more."""
    states = Counter(
        retry_db(
            lambda: list(WorkflowRun.objects.filter(pk__in=ids).values_list("state", flat=True))
        )
    )
    assert states == {RunState.SUCCEEDED: len(ids)}, states
    rows = retry_db(
        lambda: list(
            SideEffect.objects.filter(job_id__in=[str(i) for i in ids], note="effect").values_list(
                "job_id", flat=True
            )
        )
    )
    counts = Counter(int(run_id) for run_id in rows)
    duplicates = sum(n - 1 for n in counts.values() if n > 1)
    if workflow is atomic_workflows.effect_atomic:
        wrong = {run_id: counts[run_id] for run_id in ids if counts[run_id] != 1}
        assert not wrong, (
            f"runs without exactly one effect (run: rows): {dict(list(wrong.items())[:20])}"
        )
    else:
        assert not [run_id for run_id in ids if not counts[run_id]]
        assert duplicates > 0, "the plain twin shows no duplicate: the faults tested nothing"
    print(
        f"chaos {name} ({workflow.name}, seed {SEED}): {len(ids)} runs, {duplicates} duplicate "
        f"effects in {time.monotonic() - started:.1f} s"
    )


@pytest.mark.parametrize("workflow", STEPS)
def test_one_effect_per_step_under_sigkills_and_a_frozen_worker(chaos: Chaos, workflow):
    started = time.monotonic()
    chaos.start_workers(3)
    ids = _start_runs(chaos, workflow, 120 * ROUNDS, "kill", (0.05, 0.15))
    for round_ in range(2 * ROUNDS):
        _wait_runs(chaos, ids, (round_ + 1) * len(ids) // (2 * ROUNDS + 2))
        chaos.kill(chaos.rng.choice(chaos.workers))
        chaos.start_worker()
    _wait_runs(chaos, ids)
    for round_ in range(ROUNDS):
        ids += _start_runs(chaos, workflow, 40, f"freeze-{round_}", (0.3, 0.6))
        _freeze_past_the_lease(chaos, chaos.workers[0], until_taken_over=True)
    _wait_runs(chaos, ids)
    step_jobs = Job.objects.filter(task_path=RUN_STEP_PATH)
    lost = retry_db(lambda: sum(step_jobs.values_list("worker_lost_count", flat=True)))
    assert lost > 0, "no fault hit a running step: the scenario tested nothing"
    _check_steps(ids, workflow, "sigkills and a frozen worker", started)
    chaos.stop_workers()


@pytest.mark.parametrize("workflow", STEPS)
def test_one_effect_per_step_when_postgres_crashes_under_load(chaos: Chaos, workflow):
    started = time.monotonic()
    chaos.start_workers(3)
    ids = _start_runs(chaos, workflow, 160 * ROUNDS, "crash", (0.05, 0.15))
    for round_ in range(ROUNDS):
        _wait_runs(chaos, ids, (round_ + 1) * len(ids) // (ROUNDS + 2))
        chaos.crash_postgres(down_for=1.0)
    _wait_runs(chaos, ids)
    chaos.assert_fault_seen()
    _check_steps(ids, workflow, "postgres crash under load", started)
    chaos.stop_workers()
