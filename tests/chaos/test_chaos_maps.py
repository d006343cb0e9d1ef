"""``ctx.map`` under faults: every child runs its atomic step once, and the map gathers in order.

A map's children are workflow runs of their own, each a step and a job; the
one-step child's success and the parent's count take paths of their own
(PL/pgSQL functions on PostgreSQL). Under random SIGKILLs of workers and a
PostgreSQL crash, each child's effect (a row with no unique key, written by
an ``atomic=True`` step) must be there exactly once, and each parent step
must gather every child's output, in the order of its inputs: a child counted
twice or never would end the map early or never.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from django_dispatch.core.workflow_states import RUN_ACTIVE, RunState
from django_dispatch.models import Job, WorkflowRun
from django_dispatch.workflows.testing import RUN_STEP_PATH
from tests.chaos.conftest import ROUNDS, SEED, Chaos, retry_db
from tests.testapp import atomic_workflows
from tests.testapp.models import SideEffect

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CHILDREN = 120


def _start_maps(chaos: Chaos) -> dict[int, list[str]]:
    """Two parent runs (one without a cap, one with ``max_parallel``); their children's keys."""
    maps: dict[int, list[str]] = {}
    for index, max_parallel in enumerate([None, 6]):
        children = [
            {"key": f"map{index}-{n}", "n": n, "seconds": round(chaos.rng.uniform(0.02, 0.08), 3)}
            for n in range(CHILDREN * ROUNDS)
        ]
        value = {"children": children, "max_parallel": max_parallel}
        run_id = retry_db(lambda value=value: atomic_workflows.map_parent.start(value).pk)
        maps[run_id] = [child["key"] for child in children]
    return maps


def _effects() -> Counter[str]:
    keys = retry_db(
        lambda: list(SideEffect.objects.filter(note="effect").values_list("key", flat=True))
    )
    return Counter(keys)


def test_a_map_runs_each_child_once_and_gathers_in_order_under_kills_and_a_crash(chaos: Chaos):
    started = time.monotonic()
    chaos.start_workers(3)
    maps = _start_maps(chaos)
    total = sum(len(keys) for keys in maps.values())

    def reached(share: float) -> None:
        done = int(share * total)
        chaos.wait(lambda: sum(_effects().values()) >= done, 60, f"{done} children")

    # The crash first, while every worker is up: a worker started while the
    # server is down exits (the supervisor, not this test, restarts it).
    reached(0.2)
    chaos.crash_postgres(down_for=1.0)
    for round_ in range(2 * ROUNDS):
        reached(0.35 + 0.5 * round_ / (2 * ROUNDS))
        chaos.kill(chaos.rng.choice(chaos.workers))
        chaos.start_worker()
    parents = WorkflowRun.objects.filter(pk__in=list(maps))
    try:
        chaos.wait(
            lambda: not parents.filter(state__in=list(RUN_ACTIVE)).exists(),
            180,
            "both maps to finish",
        )
    except AssertionError:
        left = retry_db(
            lambda: list(WorkflowRun.objects.filter(state__in=list(RUN_ACTIVE)).values(
                "id", "state", "parent_run_id")[:10])
        )  # fmt: skip
        logs = "\n".join(w.output()[-3000:] for w in chaos.workers)
        raise AssertionError(f"runs left unfinished: {left}\n{logs}") from None
    chaos.assert_fault_seen()
    step_jobs = Job.objects.filter(task_path=RUN_STEP_PATH)
    lost = retry_db(lambda: sum(step_jobs.values_list("worker_lost_count", flat=True)))
    assert lost > 0, "no kill hit a running step: the scenario tested nothing"

    effects = _effects()
    for run_id, keys in maps.items():
        run = retry_db(lambda run_id=run_id: WorkflowRun.objects.get(pk=run_id))
        assert run.state == RunState.SUCCEEDED, (run_id, run.state)
        assert run.output == list(range(len(keys))), f"run {run_id} gathered {run.output!r}"
        wrong = {key: effects[key] for key in keys if effects[key] != 1}
        assert not wrong, f"children without exactly one effect (key: rows): {wrong}"
    children = WorkflowRun.objects.filter(parent_run_id__in=list(maps))
    states = Counter(retry_db(lambda: list(children.values_list("state", flat=True))))
    assert states == {RunState.SUCCEEDED: total}, states
    print(
        f"chaos map (seed {SEED}): {total} children over {len(maps)} maps, {lost} attempts "
        f"lost to kills, in {time.monotonic() - started:.1f} s"
    )
    chaos.stop_workers()
