"""Child runs whose parent step stopped waiting for them end cancelled, even
when the process that stopped it died before cancelling them.

A run's cancel commits first and cancels the children its steps waited for
after that commit (a child is locked after its parent, never before). The
tests kill the cancelling process with SIGKILL right after its commit, so
the children are left running, and count what the leader's sweep cancels.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from django.db import connection

from django_dispatch.core.workflow_states import RunState, StepState
from django_dispatch.models import Job, WorkflowRun, WorkflowTask
from django_dispatch.states import JobState
from django_dispatch.store import workflows as wf_store
from django_dispatch.workflows import cancel_run, replay_run, retry_run, run_now
from tests.conftest import ROOT, wait_until
from tests.testapp import map_workflows as mw
from tests.testapp import workflows as wfs

pytestmark = pytest.mark.django_db(transaction=True)

#: A delay that every parent step has waited out, even one written this very
#: millisecond (SQLite's clock goes by milliseconds).
NO_DELAY = -1.0

CANCEL_THEN_DIE = """
import os, signal, sys
import django
django.setup()
from django.db import transaction
from django_dispatch.workflows import cancel_run
with transaction.atomic():
    # Registered first, so run first once the cancel commits: the process dies
    # after the commit, before the cancel's own callback reaches the children.
    transaction.on_commit(lambda: os.kill(os.getpid(), signal.SIGKILL))
    print(cancel_run(int(sys.argv[1])), flush=True)
"""


def cancel_and_die(run: WorkflowRun) -> None:
    """Cancel ``run`` in another process, SIGKILLed as the cancel commits."""
    connection.ensure_connection()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DISPATCH_DB_NAME": str(connection.settings_dict["NAME"]),
    }
    done = subprocess.run(
        [sys.executable, "-c", CANCEL_THEN_DIE, str(run.pk)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr
    assert WorkflowRun.objects.get(pk=run.pk).state == RunState.CANCELLED


def children(run: WorkflowRun) -> list[WorkflowRun]:
    return list(WorkflowRun.objects.filter(parent_run=run).order_by("id"))


def live_jobs_of(runs: list[WorkflowRun]) -> int:
    steps = WorkflowTask.objects.filter(run__in=runs, job_id__isnull=False)
    job_ids = list(steps.values_list("job_id", flat=True))
    return Job.objects.filter(id__in=job_ids, state=JobState.PENDING).count()


def mapping(key: str, count: int, max_parallel: int) -> WorkflowRun:
    """A run whose first step waits for ``count`` children, ``max_parallel`` admitted."""
    run = mw.fan.start({"key": key, "count": count, "max_parallel": max_parallel})
    assert run_now(run.pk)  # the spread step only: the set is inserted, none of it runs
    assert WorkflowTask.objects.get(run=run, name="spread").state == StepState.WAITING
    return run


def delegating(key: str) -> WorkflowRun:
    """A run whose second step waits for a child run, inserted with its step's job."""
    run = wfs.parent.start({"key": key})
    assert run_now(run.pk) and run_now(run.pk)  # begin, then delegate
    return run


@pytest.mark.slow
def test_a_maps_children_left_by_a_cancel_that_died_are_cancelled_by_the_leader(start_worker):
    run = mapping("orphaned-map", 12, max_parallel=4)
    kids = children(run)
    cancel_and_die(run)
    # The gap: the run is cancelled, its children still run, four with jobs queued.
    assert {k.state for k in children(run)} == {RunState.RUNNING}
    assert live_jobs_of(kids) == 4
    # A worker that serves none of the children's queue: only its sweep acts.
    worker = start_worker("--queues", "elsewhere")
    wait_until(
        lambda: {k.state for k in children(run)} == {RunState.CANCELLED},
        timeout=30,
        what="the leader to cancel the orphaned children",
    )
    assert live_jobs_of(kids) == 0
    assert not WorkflowTask.objects.filter(run__in=kids).exclude(state=StepState.CANCELLED)
    worker.wait_for_output("whose parent step no longer waits for them")
    assert worker.popen.poll() is None


@pytest.mark.parametrize("how", ["start_child", "map"])
def test_the_sweep_cancels_orphans_once_their_parent_step_has_not_changed_for_a_while(how):
    if how == "start_child":
        run = delegating("orphaned-child")
        assert WorkflowTask.objects.get(run=run, name="delegate").state == StepState.WAITING
    else:
        run = mapping("orphaned-set", 5, max_parallel=2)
    kids = children(run)
    cancel_and_die(run)
    # Too recent: the cancel's own callback is left its time.
    assert wf_store.cancel_orphaned_children(60) == []
    assert wf_store.cancel_orphaned_children(NO_DELAY, max_seconds=-1) == []  # no time left
    assert wf_store.cancel_orphaned_children(NO_DELAY) == [k.pk for k in kids]
    assert {k.state for k in children(run)} == {RunState.CANCELLED}
    assert live_jobs_of(kids) == 0
    assert wf_store.cancel_orphaned_children(NO_DELAY) == []  # nothing twice


def test_children_their_parent_waits_for_and_a_child_replayed_by_hand_are_left_alone():
    waiting_set = mapping("waited-for", 5, max_parallel=2)
    waiting_child = delegating("waited-for-child")
    assert len(children(waiting_set)) == 5 and len(children(waiting_child)) == 1
    assert wf_store.cancel_orphaned_children(NO_DELAY) == []
    # A child cancelled with its parent, then replayed by hand: it runs on its own.
    assert cancel_run(waiting_child.pk)
    (kid,) = children(waiting_child)
    assert WorkflowRun.objects.get(pk=kid.pk).state == RunState.CANCELLED
    replay_run(kid.pk, "double")
    assert WorkflowRun.objects.get(pk=kid.pk).state == RunState.RUNNING
    assert wf_store.cancel_orphaned_children(NO_DELAY) == []
    # The sweep's cancel is fenced on the generation it read.
    assert not wf_store.workflow_run_cancel(kid.pk, generation=1)
    assert {k.state for k in children(waiting_set)} == {RunState.RUNNING}


def test_a_step_restarted_after_the_crash_keeps_its_new_child_and_loses_the_old():
    """The parent step waits again, for a new child: the old one, which the
    crashed cancel left running, is the orphan, swept at once (a restarted
    step is busy with its new attempt; no delay is waited)."""
    run = delegating("restarted-child")
    (old,) = children(run)
    cancel_and_die(run)
    assert replay_run(run.pk, "delegate")
    assert run_now(run.pk)  # delegate again: a new child
    new = [k for k in children(run) if k.pk != old.pk]
    assert len(new) == 1
    assert WorkflowTask.objects.get(run=run, name="delegate").child_run_id == new[0].pk
    assert wf_store.cancel_orphaned_children(60) == [old.pk]
    assert WorkflowRun.objects.get(pk=new[0].pk).state == RunState.RUNNING


def test_a_set_retried_after_its_cancelled_childs_crash_keeps_the_new_set():
    """A child's cancel fails the map's step and parks the run; the process
    dies before it cancels the siblings. A retry starts a new set: the old
    siblings are swept, the new set left to run."""
    run = mapping("retried-set", 4, max_parallel=2)
    first = children(run)
    cancel_and_die(first[0])  # the step fails, the run is parked
    assert WorkflowRun.objects.get(pk=run.pk).state == RunState.STUCK
    assert {k.state for k in first[1:]} == {RunState.RUNNING}
    assert retry_run(run.pk)
    assert run_now(run.pk)  # spread again: a new set
    fresh = [k for k in children(run) if k.pk not in {f.pk for f in first}]
    assert len(fresh) == 4
    assert sorted(wf_store.cancel_orphaned_children(60)) == [k.pk for k in first[1:]]
    assert {WorkflowRun.objects.get(pk=k.pk).state for k in fresh} == {RunState.RUNNING}


def test_an_orphans_own_children_are_cancelled_by_the_same_sweep():
    """The sweep cancels an orphan without the after-commit cancel of its own
    children (unbounded, on the leader's loop): it takes them itself."""
    run = mw.outer.start({"key": "nested", "counts": [3, 2]})
    assert run_now(run.pk)  # fans: one set child admitted (max_parallel=1)
    (fan_child,) = [k for k in children(run) if live_jobs_of([k])]
    assert run_now(fan_child.pk)  # its spread: three grandchildren
    grandchildren = children(fan_child)
    assert len(grandchildren) == 3
    cancel_and_die(run)
    everyone = [k.pk for k in children(run)] + [g.pk for g in grandchildren]
    assert wf_store.cancel_orphaned_children(NO_DELAY) == sorted(everyone)
    assert live_jobs_of(grandchildren) == 0
    assert {WorkflowRun.objects.get(pk=g.pk).state for g in grandchildren} == {RunState.CANCELLED}
