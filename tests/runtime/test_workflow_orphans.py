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
from django_dispatch.workflows import cancel_run, replay_run, run_now
from tests.conftest import ROOT, wait_until
from tests.testapp import map_workflows as mw
from tests.testapp import workflows as wfs
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)

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
    assert not SideEffect.objects.filter(key="orphaned-map", note__startswith="item:")
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
    assert wf_store.cancel_orphaned_children(0) == [k.pk for k in kids]
    assert {k.state for k in children(run)} == {RunState.CANCELLED}
    assert live_jobs_of(kids) == 0
    assert wf_store.cancel_orphaned_children(0) == []  # nothing twice


def test_children_their_parent_waits_for_and_a_child_replayed_by_hand_are_left_alone():
    waiting_set = mapping("waited-for", 5, max_parallel=2)
    waiting_child = delegating("waited-for-child")
    assert len(children(waiting_set)) == 5 and len(children(waiting_child)) == 1
    assert wf_store.cancel_orphaned_children(0) == []
    # A child cancelled with its parent, then replayed by hand: it runs on its own.
    assert cancel_run(waiting_child.pk)
    (kid,) = children(waiting_child)
    assert WorkflowRun.objects.get(pk=kid.pk).state == RunState.CANCELLED
    replay_run(kid.pk, "double")
    assert WorkflowRun.objects.get(pk=kid.pk).state == RunState.RUNNING
    assert wf_store.cancel_orphaned_children(0) == []
    assert {k.state for k in children(waiting_set)} == {RunState.RUNNING}
