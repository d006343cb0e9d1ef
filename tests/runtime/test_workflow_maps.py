"""``ctx.map`` (a step waiting for one child run per input) and routed steps.

In-process tests drive the worker path with ``drain``; the ones marked slow
start real ``rundispatch`` processes and count executions in SideEffect rows.
"""

from __future__ import annotations

import importlib
import signal
import threading
import time
from datetime import datetime, timedelta

import pytest
from django.db import connection, connections, transaction
from django.db.models.functions import Now
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_dispatch.checks import check_step_routes
from django_dispatch.core.workflow_states import RunState, StepState
from django_dispatch.models import Job, WorkflowRun, WorkflowTask
from django_dispatch.states import JobState
from django_dispatch.store import workflows as wf_store
from django_dispatch.store.maintenance import job_cancel
from django_dispatch.store.workflows.runs import cancel_held
from django_dispatch.store.workflows.stepjobs import _link_jobs, _stretches
from django_dispatch.testing import drain
from django_dispatch.workflows import (
    ActionNotAllowed,
    Workflow,
    WorkflowDefinitionError,
    cancel_run,
    replay_run,
    retry_run,
    skip_step,
)
from django_dispatch.workflows import registry as workflow_registry
from django_dispatch.workflows.engine import build_step_job
from django_dispatch.workflows.testing import drain_workflows
from tests.conftest import wait_until
from tests.testapp import map_workflows as mw
from tests.testapp.models import SideEffect

pytestmark_db = pytest.mark.django_db(transaction=True)


def fan(key: str, count: int, **extra: object) -> WorkflowRun:
    return mw.fan.start({"key": key, "count": count, **extra})


def spread(run: WorkflowRun) -> WorkflowTask:
    return WorkflowTask.objects.get(run=run, name="spread")


def kids(run: WorkflowRun) -> list[WorkflowRun]:
    return list(WorkflowRun.objects.filter(parent_run=run).order_by("id"))


def runnable_kids(run: WorkflowRun) -> int:
    """Children whose first step has a job: admitted, not held."""
    return WorkflowTask.objects.filter(run__parent_run=run, job_id__isnull=False).count()


def executions(key: str) -> dict[int, int]:
    notes = SideEffect.objects.filter(key=key, note__startswith="item:")
    counts: dict[int, int] = {}
    for note in notes.values_list("note", flat=True):
        n = int(note.split(":")[1])
        counts[n] = counts.get(n, 0) + 1
    return counts


def most_at_once(key: str) -> int:
    """The most child executions that overlapped in time (their own clocks, one host)."""
    spans = SideEffect.objects.filter(key=key, note__startswith="item:")
    points: list[tuple[datetime, int]] = []
    for start, end in spans.values_list("started_at", "finished_at"):
        assert start is not None and end is not None
        points += [(start, 1), (end, -1)]
    running = peak = 0
    for _, delta in sorted(points, key=lambda p: (p[0], p[1])):  # an end before a start
        running += delta
        peak = max(peak, running)
    return peak


# --- definitions: routing -------------------------------------------------------------


def test_step_routing_is_checked_at_definition_time():
    wf = Workflow("tests.routing_errors")
    with pytest.raises(WorkflowDefinitionError, match="priority must be a whole number from -100"):
        wf.add_step(mw.light, name="too_high", priority=101)
    with pytest.raises(WorkflowDefinitionError, match="queue_name must be a non-empty string"):
        wf.add_step(mw.light, name="empty", queue_name="")
    assert wf.steps == ()  # nothing half-registered
    with override_settings(TASKS={"default": {"BACKEND": "x", "QUEUES": ["default", "heavy"]}}):
        step = wf.add_step(mw.light, name="ok", queue_name="heavy", priority=-3)
    assert (step.queue_name, step.priority) == ("heavy", -3)


def test_a_step_routed_to_an_unlisted_queue_is_a_system_check_error_not_an_import_crash():
    """Raised at definition, it would take down `check` and `runserver` at import."""
    wf = Workflow("tests.routing_unlisted")
    with override_settings(TASKS={"default": {"BACKEND": "x", "QUEUES": ["default", "heavy"]}}):
        try:
            wf.add_step(mw.light, name="gpu", queue_name="gpu")  # defined, not refused
            errors = [m for m in check_step_routes() if m.id == "django_dispatch.E006"]
        finally:
            workflow_registry._REGISTRY.pop(wf.name)
    assert [m.msg for m in errors] == [
        "Workflow 'tests.routing_unlisted', step 'gpu': queue 'gpu' is not one of the queues "
        "TASKS['default']['QUEUES'] allows (['default', 'heavy'])."
    ]


@pytestmark_db
def test_a_routed_steps_job_goes_to_its_queue_at_its_priority():
    run = mw.routed.start({"key": "route"})
    drain(queues=["default"])
    heavy = WorkflowTask.objects.get(run=run, name="heavy")
    assert heavy.state == StepState.READY  # a default-queue worker does not take it
    job = Job.objects.get(pk=heavy.job_id)
    assert (job.queue_name, job.priority) == ("heavy", 5)
    light = WorkflowTask.objects.get(run=run, name="light")
    assert Job.objects.get(pk=light.job_id).queue_name == "default"
    drain(queues=["heavy"])
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED


# --- ctx.map in process -----------------------------------------------------------------


def test_stretches_of_consecutive_ids_are_found():
    pairs = [(10, 50), (11, 51), (12, 52), (14, 54), (15, 56), (13, 53)]
    assert _stretches(pairs) == [(10, 14, 40), (15, 15, 41)]
    assert _stretches([]) == []


@pytestmark_db
@pytest.mark.parametrize("spread_out", [False, True])
def test_steps_get_their_job_ids_in_a_stretch_or_by_case(spread_out):
    run = fan("link", 12, max_parallel=1)
    drain(max_jobs=1)
    held = list(
        WorkflowTask.objects.filter(run__parent_run=run, job_id__isnull=True).values_list(
            "id", flat=True
        )
    )
    assert len(held) == 11
    step = 7 if spread_out else 1  # 7: eleven stretches of one, more than MAX_STRETCHES
    pairs = [(step_id, 1000 + step * i) for i, step_id in enumerate(held)]
    _link_jobs(connection.alias, pairs, {"state": StepState.READY})
    linked = WorkflowTask.objects.filter(id__in=held)
    assert sorted(linked.values_list("id", "job_id")) == sorted(pairs)
    assert set(linked.values_list("state", flat=True)) == {StepState.READY}


@pytestmark_db
def test_a_map_gathers_its_childrens_outputs_in_input_order():
    run = fan("order", 7)
    drain_workflows(concurrency=3)
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED
    assert run.output == {"doubled": [0, 2, 4, 6, 8, 10, 12]}
    step = spread(run)
    assert (step.map_total, step.map_done, step.map_started) == (7, 7, 7)
    children = kids(run)
    assert sorted(c.map_index for c in children) == list(range(7))
    assert {c.parent_task_id for c in children} == {step.pk}
    assert executions("order") == {n: 1 for n in range(7)}


@pytestmark_db
def test_a_map_over_an_empty_list_succeeds_with_an_empty_list():
    run = run_to_end(fan("empty", 0))
    assert run.state == RunState.SUCCEEDED and run.output == {"doubled": []}
    assert kids(run) == []


def run_to_end(run: WorkflowRun) -> WorkflowRun:
    drain_workflows()
    run.refresh_from_db()
    return run


@pytestmark_db
def test_a_map_of_maps_gathers_each_level_in_order():
    run = run_to_end(mw.outer.start({"key": "nested", "counts": [2, 0, 3]}))
    assert run.state == RunState.SUCCEEDED
    assert run.output == [{"doubled": [0, 2]}, {"doubled": []}, {"doubled": [0, 2, 4]}]
    assert executions("nested") == {0: 2, 1: 2, 2: 1}


@pytestmark_db
def test_max_parallel_holds_the_other_children_until_a_slot_frees():
    run = fan("held", 5, max_parallel=2)
    drain(max_jobs=1)  # the spread step: 5 children, 2 runnable
    step = spread(run)
    assert (step.state, step.map_total, step.map_started, step.map_done) == (
        StepState.WAITING,
        5,
        2,
        0,
    )
    assert len(kids(run)) == 5 and runnable_kids(run) == 2
    drain(max_jobs=1)  # one child done: the third is admitted
    step.refresh_from_db()
    assert (step.map_started, step.map_done) == (3, 1) and runnable_kids(run) == 3
    run = run_to_end(run)
    assert run.output == {"doubled": [0, 2, 4, 6, 8]}


@pytestmark_db
def test_too_many_inputs_fail_the_step_without_retry_and_start_nothing():
    with override_settings(DISPATCH={"MAP_MAX_ITEMS": 3}):
        run = run_to_end(fan("big", 4))
    step = spread(run)
    assert run.state == RunState.STUCK and step.state == StepState.FAILED
    assert step.errors[-1]["exception_class_path"].endswith("InvalidMap")
    assert (
        "got more than 3 inputs; DISPATCH['MAP_MAX_ITEMS'] allows at most 3"
        in step.errors[-1]["message"]
    )
    assert step.attempts == 1 and kids(run) == []


@pytestmark_db
def test_a_map_not_returned_fails_the_step_with_what_to_write():
    run = run_to_end(mw.forgetful.start({}))
    step = WorkflowTask.objects.get(run=run, name="forgets")
    assert run.state == RunState.STUCK
    assert "called ctx.map() but did not return its result" in step.errors[-1]["message"]
    assert kids(run) == []


@pytestmark_db
def test_a_cancelled_child_fails_the_step_parks_the_run_and_cancels_its_siblings():
    run = fan("cancel-kid", 4, max_parallel=2)
    drain(max_jobs=1)
    first = kids(run)[0]
    assert cancel_run(first.pk)
    run.refresh_from_db()
    step = spread(run)
    assert run.state == RunState.STUCK and step.state == StepState.FAILED
    assert step.errors[-1]["exception_class_path"].endswith("ChildRunCancelled")
    assert {c.state for c in kids(run)} == {RunState.CANCELLED}
    assert drain() == 0  # their jobs were cancelled
    assert executions("cancel-kid") == {}
    # A retry starts a fresh set; the cancelled one stays as that attempt's history.
    assert retry_run(run.pk)
    run = run_to_end(run)
    assert run.state == RunState.SUCCEEDED and run.output == {"doubled": [0, 2, 4, 6]}
    states = [c.state for c in kids(run)]
    assert states == [RunState.CANCELLED] * 4 + [RunState.SUCCEEDED] * 4
    assert executions("cancel-kid") == {n: 1 for n in range(4)}


def fan_in_statements(count: int) -> int:
    """Statements of one child's success (counted, and admitting a held sibling)."""
    run = fan(f"flat-{count}", count, max_parallel=5)
    drain(max_jobs=1)  # the spread step: the set is inserted
    child = WorkflowTask.objects.filter(run__parent_run=run, job_id__isnull=False).first()
    assert child is not None
    claimed = wf_store.workflow_step_claim(child.pk, child.generation, child.job_id)
    assert claimed is not None
    with CaptureQueriesContext(connection) as statements:
        assert wf_store.workflow_step_succeed(
            claimed.step_id, claimed.claim_id, 0, build_job=build_step_job
        )
    assert spread(run).map_done == 1 and runnable_kids(run) == 6  # counted, one admitted
    # Out of the next call's way: the children's jobs, and this child's own
    # (its step was claimed and finished here, not by running the job).
    assert cancel_run(run.pk) and job_cancel(child.job_id)
    return len(statements)


@pytestmark_db
def test_a_childs_fan_in_costs_the_same_at_1000_children_as_at_10():
    assert fan_in_statements(10) == fan_in_statements(1000)


@pytest.mark.django_db
def test_a_childs_count_writes_no_indexed_column():
    """Every child of a set counts on one step row: an UPDATE that changes an
    indexed column (or one a partial index's condition reads) is not HOT, adds
    an index entry per count, and each later count walks more of them."""
    if connection.vendor != "postgresql":
        pytest.skip("HOT updates and the count's one statement are PostgreSQL's")
    written = {"map_done", "updated_at"}
    count = importlib.import_module("django_dispatch.migrations.0031_map_count").CREATE
    assert count.split(" SET map_done")[1].split(" WHERE ")[0].count("=") == len(written)
    table = WorkflowTask._meta.db_table
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, table)
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE tablename = %s", [table])
        definitions = [row[0] for row in cursor.fetchall()]
    indexed = {column for c in found.values() if c["index"] for column in c["columns"] or ()}
    assert "heartbeat_at" in indexed  # the check reads the real indexes
    assert not written & indexed
    assert not [d for d in definitions if any(name in d for name in written)]


@pytestmark_db
@pytest.mark.parametrize("count_lost", [False, True])
def test_a_held_child_another_transaction_holds_is_admitted_by_the_sweep(count_lost):
    """With ``count_lost``, the success that could not admit the held child also
    lost its count (its process died after its commit): the counter then shows
    no free slot, and the sweep recounts the set from its rows first."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks: SQLite has one writer, so no other transaction holds a row")
    run = fan("busy", 3, max_parallel=1)
    drain(max_jobs=1)  # spread: child 0 runnable, 1 and 2 held
    second = WorkflowRun.objects.get(parent_run=run, map_index=1)
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:  # e.g. an operator's retry of a run that is not stuck
        with transaction.atomic():
            WorkflowRun.objects.select_for_update().get(pk=second.pk)
            holding.set()
            release.wait(20)
        connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(10)
    try:
        drain(max_jobs=1)  # child 0 succeeds; child 1's row is held: not waited for
        step = spread(run)
        assert (step.map_done, step.map_started) == (1, 1) and runnable_kids(run) == 1
    finally:
        release.set()
        holder.join()
    if count_lost:  # and no count since, for longer than the sweep waits
        an_hour_ago = timezone.now() - timedelta(hours=1)
        WorkflowTask.objects.filter(pk=step.pk).update(map_done=0, updated_at=an_hour_ago)
    assert wf_store.sweep_stale_steps(60, build_job=build_step_job) == [step.pk]
    assert runnable_kids(run) == 2
    run = run_to_end(run)
    assert run.state == RunState.SUCCEEDED and run.output == {"doubled": [0, 2, 4]}


@pytestmark_db
def test_held_children_are_cancelled_together_the_admitted_ones_one_by_one():
    run = fan("held-cancel", 6, max_parallel=2)
    drain(max_jobs=1)
    step = spread(run)
    assert len(cancel_held(connection.alias, step.map_batch)) == 4
    states = [c.state for c in kids(run)]
    assert states == [RunState.RUNNING] * 2 + [RunState.CANCELLED] * 4
    held = WorkflowTask.objects.filter(run__parent_run=run, run__state=RunState.CANCELLED)
    assert {s.state for s in held} == {StepState.CANCELLED}
    assert cancel_held(connection.alias, step.map_batch) == []  # the admitted two are not held
    assert spread(run).state == StepState.WAITING  # no child was cancelled one by one


@pytestmark_db
def test_cancelling_the_run_cancels_every_unfinished_child():
    run = fan("cancel-run", 5, max_parallel=2)
    drain(max_jobs=2)  # spread, then one child
    assert cancel_run(run.pk)
    states = [c.state for c in kids(run)]
    assert states == [RunState.SUCCEEDED] + [RunState.CANCELLED] * 4
    assert drain() == 0
    assert executions("cancel-run") == {0: 1}


@pytestmark_db
def test_skipping_a_waiting_map_step_cancels_its_children():
    run = fan("skip", 3)
    drain(max_jobs=1)
    assert skip_step(run.pk, "spread")
    assert {c.state for c in kids(run)} == {RunState.CANCELLED}
    run = run_to_end(run)
    assert run.state == RunState.SUCCEEDED and run.output == {"doubled": None}


@pytestmark_db
def test_replaying_the_map_step_starts_a_fresh_set_and_keeps_the_old_one():
    run = run_to_end(fan("replay", 3))
    old = {c.pk for c in kids(run)}
    assert replay_run(run.pk, "spread")
    run = run_to_end(run)
    assert run.state == RunState.SUCCEEDED and run.output == {"doubled": [0, 2, 4]}
    children = kids(run)
    assert len(children) == 6 and {c.state for c in children} == {RunState.SUCCEEDED}
    assert {c.map_batch for c in children if c.pk in old} != {spread(run).map_batch}
    assert executions("replay") == {0: 2, 1: 2, 2: 2}


@pytestmark_db
def test_a_replayed_child_is_not_counted_twice():
    run = fan("recount", 3, max_parallel=1)
    drain(max_jobs=2)  # spread, child 0
    first = kids(run)[0]
    assert first.state == RunState.SUCCEEDED
    assert replay_run(first.pk, "double")
    # Child 1 (admitted by child 0) runs, then child 0 again: counted twice, the
    # set would look complete there and gather child 2's missing output.
    run = run_to_end(run)
    assert run.output == {"doubled": [0, 2, 4]}
    assert spread(run).map_done == 3


@pytestmark_db
def test_a_child_replayed_while_its_set_runs_is_gathered_with_its_new_output():
    """A counted child replayed while its siblings still run: the last sibling's
    count reaches the total, but the set is not done until the replayed child
    succeeds again, whose success then gathers (not the sweep, a while later)."""
    run = fan("regather", 3)
    drain(max_jobs=2)  # spread, child 0
    first = kids(run)[0]
    assert first.state == RunState.SUCCEEDED
    assert replay_run(first.pk, "double")  # its job is queued behind its siblings'
    drain(max_jobs=2)  # children 1 and 2: the count reaches 3 with child 0 running
    step = spread(run)
    assert (step.state, step.map_done) == (StepState.WAITING, 2)
    drain(max_jobs=1)  # child 0 again: its success gathers
    step.refresh_from_db()
    assert (step.state, step.output) == (StepState.SUCCEEDED, [0, 2, 4])
    assert run_to_end(run).output == {"doubled": [0, 2, 4]}


@pytestmark_db
def test_a_held_childs_step_is_not_skipped_past_max_parallel():
    """Skipping a step of a child its set still holds would finish it out of turn,
    and its success would admit the next held child while another runs: refused,
    nothing written; once admitted, it is skipped as any step."""
    run = fan("heldskip", 3, max_parallel=1)
    drain(max_jobs=1)  # spread: child 0 runnable, 1 and 2 held
    held = kids(run)[2]
    with pytest.raises(ActionNotAllowed, match="max_parallel"):
        skip_step(held.pk, "double")
    assert WorkflowTask.objects.get(run=held).state == StepState.PENDING
    assert runnable_kids(run) == 1
    assert skip_step(kids(run)[0].pk, "double")  # admitted: skipped, the next admitted
    assert runnable_kids(run) == 2


# --- real worker processes ----------------------------------------------------------------


@pytest.mark.slow
@pytestmark_db
def test_a_map_of_150_over_two_workers_runs_each_child_once_and_gathers_in_order(start_worker):
    run = fan("many", 150)
    workers = [start_worker("--concurrency", "4") for _ in range(2)]
    wait_until(
        lambda: WorkflowRun.objects.get(pk=run.pk).state == RunState.SUCCEEDED,
        timeout=120,
        what="the map's run finished",
    )
    for worker in workers:
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0, worker.output()
    run.refresh_from_db()
    assert run.output == {"doubled": [2 * n for n in range(150)]}
    assert executions("many") == {n: 1 for n in range(150)}
    pids = set(SideEffect.objects.filter(key="many").values_list("worker_pid", flat=True))
    assert pids <= {w.pid for w in workers} | {0}
    assert SideEffect.objects.filter(key="many", note="total").count() == 1


@pytest.mark.slow
@pytestmark_db
def test_max_parallel_holds_across_workers(start_worker):
    run = fan("parallel", 12, max_parallel=3, sleep=0.3)
    workers = [start_worker("--concurrency", "4") for _ in range(2)]
    wait_until(
        lambda: WorkflowRun.objects.get(pk=run.pk).state == RunState.SUCCEEDED,
        timeout=120,
        what="the map's run finished",
    )
    for worker in workers:
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0, worker.output()
    assert executions("parallel") == {n: 1 for n in range(12)}
    assert most_at_once("parallel") == 3  # never 4; and the bound was reached


@pytest.mark.slow
@pytestmark_db
def test_a_step_routed_to_heavy_runs_only_on_a_worker_serving_heavy(start_worker):
    runs = [mw.routed.start({"key": f"routed-{i}"}) for i in range(6)]
    default = start_worker("--queues", "default", "--concurrency", "2")
    heavy_jobs = Job.objects.filter(queue_name="heavy")
    wait_until(lambda: heavy_jobs.count() == 6, what="light steps done, heavy ones queued")
    time.sleep(1.0)  # ten polls of the default worker, which must leave them alone
    assert set(heavy_jobs.values_list("state", flat=True)) == {JobState.PENDING}
    heavy = start_worker("--queues", "heavy", "--concurrency", "2")
    wait_until(
        lambda: all(WorkflowRun.objects.get(pk=r.pk).state == RunState.SUCCEEDED for r in runs),
        what="routed runs finished",
    )
    for worker in (default, heavy):
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0, worker.output()
    notes = SideEffect.objects.filter(key__startswith="routed-")
    assert set(notes.filter(note="light").values_list("worker_pid", flat=True)) == {default.pid}
    assert set(notes.filter(note="heavy").values_list("worker_pid", flat=True)) == {heavy.pid}


# --- admin ------------------------------------------------------------------------------


@pytest.fixture
def wf_admin(admin_client):
    import django_dispatch.admin.workflows  # noqa: F401  (registers the ModelAdmins)

    return admin_client


@pytestmark_db
def test_admin_shows_the_map_node_with_done_of_total_and_links_to_its_children(wf_admin):
    run = fan("admin-map", 25, max_parallel=4)
    drain(max_jobs=3)  # spread, then two children
    step = spread(run)
    page = wf_admin.get(f"/admin/django_dispatch/workflowrun/{run.pk}/change/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "map: 2/25 done" in text  # the DAG's node
    assert "2/25 child runs done, at most 4 at once (19 held)" in text
    assert f"?map_batch={step.map_batch}" in text
    assert "all 25 child runs</a>" in text  # 20 linked, then the list
    listing = wf_admin.get(f"/admin/django_dispatch/workflowrun/?map_batch={step.map_batch}")
    assert listing.status_code == 200
    assert listing.content.decode().count("tests.map_item") >= 25
    step_page = wf_admin.get(f"/admin/django_dispatch/workflowtask/{step.pk}/change/")
    assert "2/25 child runs done" in step_page.content.decode()


@pytestmark_db
def test_admin_shows_a_steps_route(wf_admin):
    run = mw.routed.start({"key": "admin-route"})
    drain(queues=["default"])
    text = wf_admin.get(f"/admin/django_dispatch/workflowrun/{run.pk}/change/").content.decode()
    assert "queue heavy, priority 5" in text
    heavy = WorkflowTask.objects.get(run=run, name="heavy")
    page = wf_admin.get(f"/admin/django_dispatch/workflowtask/{heavy.pk}/change/")
    assert "queue heavy, priority 5" in page.content.decode()


@pytestmark_db
def test_children_of_an_unbounded_map_succeed_while_their_parent_run_is_locked():
    """A child's success takes no lock on its parent run: children finish side by side."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks: SQLite has one writer, so no other transaction holds a row")
    run = fan("side-by-side", 3)
    drain(max_jobs=1)  # spread: three runnable children
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:  # a transition of the parent run in progress, as locked_run takes it
        with transaction.atomic():
            WorkflowRun.objects.filter(pk=run.pk).update(updated_at=Now())
            holding.set()
            release.wait(20)
        connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(10)
    try:
        started = time.monotonic()
        assert drain(max_jobs=2) == 2  # two children, not the last (whose gather waits)
        assert time.monotonic() - started < 5, "a child's success waited for the parent's lock"
        assert [c.state for c in kids(run)][:2] == [RunState.SUCCEEDED] * 2
        assert spread(run).map_done == 2
    finally:
        release.set()
        holder.join()
    run = run_to_end(run)
    assert run.state == RunState.SUCCEEDED and run.output == {"doubled": [0, 2, 4]}


@pytestmark_db
def test_a_count_lost_after_a_childs_commit_is_repaired_by_the_sweep():
    run = fan("lost-count", 3)
    drain(max_jobs=3)  # spread, then two children, each counted after its commit
    step = spread(run)
    assert step.map_done == 2
    # As if the worker died between the second child's commit and its count.
    WorkflowTask.objects.filter(pk=step.pk).update(map_done=1)
    drain(max_jobs=1)  # the last child: its count reaches 2 of 3, no gather
    step.refresh_from_db()
    assert (step.state, step.map_done) == (StepState.WAITING, 2)
    assert [c.state for c in kids(run)] == [RunState.SUCCEEDED] * 3
    time.sleep(0.05)
    assert wf_store.sweep_stale_steps(0, build_job=build_step_job) == [step.pk]
    step.refresh_from_db()
    assert (step.state, step.map_done, step.output) == (StepState.SUCCEEDED, 3, [0, 2, 4])
    run = run_to_end(run)
    assert run.state == RunState.SUCCEEDED and run.output == {"doubled": [0, 2, 4]}


# --- a map child's success, and the set's insert, on PostgreSQL -----------------------


def claim_first_child(run: WorkflowRun) -> wf_store.ClaimedStep:
    child = (
        WorkflowTask.objects.filter(run__parent_run=run, job_id__isnull=False)
        .order_by("run__map_index")
        .first()
    )
    assert child is not None
    claimed = wf_store.workflow_step_claim(child.pk, child.generation, child.job_id)
    assert claimed is not None and claimed.map_child
    return claimed


def succeed(claimed: wf_store.ClaimedStep, output: object, claim_id: str | None = None) -> bool:
    """As the step job records a success: with the run and the map flag its claim read."""
    return wf_store.workflow_step_succeed(
        claimed.step_id,
        claim_id or claimed.claim_id,
        output,
        build_job=build_step_job,
        run_id=claimed.run_id,
        map_child=claimed.map_child,
    )


@pytestmark_db
def test_a_one_step_childs_success_and_its_count_are_one_statement():
    if connection.vendor != "postgresql":
        pytest.skip("the one-statement success is PostgreSQL's (migration 0033)")
    run = fan("one-statement", 3)
    drain(max_jobs=1)  # spread: three runnable children
    claimed = claim_first_child(run)
    with CaptureQueriesContext(connection) as statements:
        assert succeed(claimed, 0)
    sql = [q["sql"] for q in statements.captured_queries]
    assert len(sql) == 1 and "django_dispatch_map_child_finish" in sql[0], sql
    child = WorkflowRun.objects.get(pk=claimed.run_id)
    assert (child.state, child.output, child.map_counted) == (RunState.SUCCEEDED, 0, True)
    step = WorkflowTask.objects.get(pk=claimed.step_id)
    assert (step.state, step.output, step.claim_id) == (StepState.SUCCEEDED, 0, None)
    assert spread(run).map_done == 1
    job_cancel(claimed_job(claimed))  # its step was finished here, not by its job
    run = run_to_end(run)  # the last child's count gathers
    assert run.state == RunState.SUCCEEDED and run.output == {"doubled": [0, 2, 4]}
    assert spread(run).map_done == 3


def claimed_job(claimed: wf_store.ClaimedStep) -> int:
    job_id = WorkflowTask.objects.values_list("job_id", flat=True).get(pk=claimed.step_id)
    assert job_id is not None
    return job_id


@pytestmark_db
def test_a_map_childs_success_under_a_void_claim_writes_nothing():
    run = fan("void-claim", 2)
    drain(max_jobs=1)
    claimed = claim_first_child(run)
    assert not succeed(claimed, 0, claim_id="0" * 32)
    child = WorkflowRun.objects.get(pk=claimed.run_id)
    assert (child.state, child.map_counted) == (RunState.RUNNING, False)
    assert WorkflowTask.objects.get(pk=claimed.step_id).state == StepState.RUNNING
    assert spread(run).map_done == 0
    assert succeed(claimed, 0)  # the claim that holds it still can
    assert spread(run).map_done == 1


@pytestmark_db
def test_a_child_of_a_set_with_held_children_admits_the_next_one():
    run = fan("admits", 4, max_parallel=2)
    drain(max_jobs=1)
    claimed = claim_first_child(run)
    assert succeed(claimed, 0)
    step = spread(run)
    assert (step.map_started, step.map_done) == (3, 1) and runnable_kids(run) == 3
    job_cancel(claimed_job(claimed))
    run = run_to_end(run)
    assert run.output == {"doubled": [0, 2, 4, 6]}


@pytestmark_db
def test_a_set_is_inserted_as_the_orm_inserts_each_child():
    """On PostgreSQL all but the first child are copied by the database: each
    must come out as the ORM would have inserted it, in input order."""
    run = fan("copied", 5, max_parallel=3)
    drain(max_jobs=1)
    step = spread(run)
    children = sorted(kids(run), key=lambda c: c.map_index)
    assert [c.map_index for c in children] == list(range(5))
    assert [c.input for c in children] == [{"key": "copied", "n": n, "sleep": 0} for n in range(5)]
    assert children == sorted(children, key=lambda c: c.pk)  # ids in input order
    first = children[0]
    for child in children:
        assert (child.name, child.state, child.queue_name, child.namespace) == (
            first.name, RunState.RUNNING, first.queue_name, first.namespace,
        )  # fmt: skip
        assert (child.parent_run_id, child.parent_task_id, child.map_batch) == (
            run.pk, step.pk, step.map_batch,
        )  # fmt: skip
        assert (child.map_counted, child.output, child.call_context) == (False, None, None)
    steps = {s.run_id: s for s in WorkflowTask.objects.filter(run__parent_run=run)}
    assert len(steps) == 5
    for index, child in enumerate(children):
        row = steps[child.pk]
        assert (row.name, row.handler_path, row.namespace) == (
            "double", steps[first.pk].handler_path, first.namespace,
        )  # fmt: skip
        if index < 3:  # admitted: ready, with a job of its own
            assert (row.state, row.claim_id) == (StepState.READY, None)
            assert row.ready_at is not None and row.heartbeat_at is not None
            job = Job.objects.get(pk=row.job_id)
            assert job.args == [row.pk, row.generation] and job.kwargs == {}
            assert (job.state, job.max_attempts, job.queue_name) == (
                JobState.PENDING, 1, child.queue_name,
            )  # fmt: skip
            assert job.task_path == Job.objects.get(pk=steps[first.pk].job_id).task_path
        else:  # held: no job yet
            assert (row.state, row.job_id, row.ready_at, row.heartbeat_at) == (
                StepState.PENDING, None, None, None,
            )  # fmt: skip
    assert Job.objects.filter(args__0__in=[s.pk for s in steps.values()]).count() == 3
    run = run_to_end(run)
    assert run.output == {"doubled": [0, 2, 4, 6, 8]}
    assert executions("copied") == {n: 1 for n in range(5)}


@pytestmark_db
def test_a_one_step_childs_count_that_fails_leaves_its_success_to_the_sweep():
    """If the one statement of success and count fails (here a lock timeout on
    the waiting step), the general path writes the success and counts after
    its commit; if that count fails too, the step's job must not fail with
    it: the sweep repairs the count."""
    if connection.vendor != "postgresql":
        pytest.skip("the one-statement success is PostgreSQL's (migration 0033)")
    run = fan("count-fails", 2)
    drain(max_jobs=1)
    claimed = claim_first_child(run)
    waiting = spread(run)
    holder = connections.create_connection("default")
    try:
        holder.set_autocommit(False)
        with holder.cursor() as cursor:
            cursor.execute(
                "SELECT id FROM django_dispatch_workflowtask WHERE id = %s FOR UPDATE", [waiting.pk]
            )
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '200ms'")
        try:
            assert succeed(claimed, 0)  # the count timed out, the success stands
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET lock_timeout")
    finally:
        holder.rollback()
        holder.close()
    child = WorkflowRun.objects.get(pk=claimed.run_id)
    assert (child.state, child.output) == (RunState.SUCCEEDED, 0)
    assert spread(run).map_done == 0  # not counted
    time.sleep(0.05)
    assert wf_store.sweep_stale_steps(0, build_job=build_step_job) == []  # one child runs on
    job_cancel(claimed_job(claimed))  # its step was finished here, not by its job
    drain(max_jobs=1)  # the other child: counted, 1 of 2
    time.sleep(0.05)
    assert wf_store.sweep_stale_steps(0, build_job=build_step_job) == [waiting.pk]
    run = run_to_end(run)
    assert run.state == RunState.SUCCEEDED and run.output == {"doubled": [0, 2]}
