"""Durable waits in workflow steps: events, timeouts, sleeps; no lost wake-up.

Steps run through the real worker path (``drain_workflows``, worker threads
with their own connections), and through real ``rundispatch`` processes for
the restart test. Side effects are counted in SideEffect rows.
"""

from __future__ import annotations

import signal
import time

import pytest
from django.db import connection

from django_dispatch import events, store
from django_dispatch.core.states import QUEUED_STATES
from django_dispatch.core.workflow_states import RunState, StepState
from django_dispatch.models import Job, Worker, WorkflowRun, WorkflowTask
from django_dispatch.states import JobState
from django_dispatch.workflows import cancel_run
from django_dispatch.workflows.testing import drain_workflows
from tests.concurrency import run_concurrently
from tests.conftest import postgres_only, wait_until
from tests.database_work import database_work
from tests.testapp import wait_workflows as wfs
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)


def effects(key: str, note: str) -> int:
    return SideEffect.objects.filter(key=key, note=note).count()


def step_of(run: WorkflowRun, name: str) -> WorkflowTask:
    return WorkflowTask.objects.get(run=run, name=name)


def test_a_step_waits_without_a_job_and_resumes_with_the_payload():
    run = wfs.awaits.start({"key": "r1", "event_key": "order:1"}, context={"request_id": "abc"})
    drain_workflows()
    waiting = step_of(run, "wait")
    assert waiting.state == StepState.WAITING
    assert (waiting.wait_event_name, waiting.wait_event_key, waiting.wait_until) == (
        "payment",
        "order:1",
        None,
    )
    assert waiting.job_id is None  # no timeout: no job at all while it waits
    assert not Job.objects.filter(state__in=QUEUED_STATES).exists()
    assert drain_workflows() == 0  # nothing to do for a worker

    events.publish("payment", {"amount": 10}, key="order:2")  # another key: still waiting
    assert step_of(run, "wait").state == StepState.WAITING
    events.publish("payment", {"amount": 42}, key="order:1")
    drain_workflows()
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED
    assert run.output == {"got": {"amount": 42}, "context": {"request_id": "abc"}}
    assert (effects("r1", "started"), effects("r1", "resumed"), effects("r1", "after")) == (2, 1, 1)
    assert step_of(run, "wait").waits[0]["payload"] == {"amount": 42}


def test_one_publish_wakes_every_run_waiting_on_the_key_each_exactly_once():
    runs = [wfs.awaits.start({"key": f"many-{i}", "event_key": "batch:1"}) for i in range(100)]
    others = [wfs.awaits.start({"key": f"other-{i}", "event_key": "batch:2"}) for i in range(3)]
    drain_workflows(concurrency=4)
    assert WorkflowTask.objects.filter(name="wait", state=StepState.WAITING).count() == 103

    events.publish("payment", {"amount": 1}, key="batch:1")
    assert WorkflowTask.objects.filter(name="wait", state=StepState.READY).count() == 100
    drain_workflows(concurrency=4)
    for run in runs:
        run.refresh_from_db()
        assert run.state == RunState.SUCCEEDED
        assert effects(run.input["key"], "resumed") == 1
        assert effects(run.input["key"], "after") == 1
    assert SideEffect.objects.filter(note="resumed").count() == 100
    for run in others:
        assert step_of(run, "wait").state == StepState.WAITING
        assert effects(run.input["key"], "resumed") == 0


def test_an_event_published_before_the_wait_since_the_run_began_is_not_lost():
    run = wfs.awaits.start({"key": "early", "event_key": "k"})
    events.publish("payment", {"amount": 7}, key="k")  # before the step even ran
    drain_workflows()
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED and run.output["got"] == {"amount": 7}
    assert effects("early", "resumed") == 1


def test_a_publish_between_the_step_start_and_its_wait_record_still_wakes_it():
    """Forced interleaving: the step has started (claimed, running) when the event
    is published, and only then reaches its wait."""
    run = wfs.interleaved.start({"key": "inter"})

    def publisher():
        wait_until(lambda: effects("inter", "started") == 1, what="the step to start")
        assert step_of(run, "slow_then_wait").state == StepState.RUNNING
        events.publish("interleaved", "hello", key="inter")
        SideEffect.objects.create(key="inter", note="go")

    run_concurrently(drain_workflows, publisher)
    drain_workflows()
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED and run.output == "hello"
    assert effects("inter", "resumed") == 1


@postgres_only
def test_a_publish_committing_while_the_wait_is_recorded_is_not_lost():
    """The publish's transaction is still open when the step records its wait: the
    wait's look-back cannot see the event yet, and the publish's wake-up ran before
    the step was waiting. The event-name lock makes the recording wait for the
    publish's commit, so its look-back finds the event."""
    import threading

    from django.db import transaction

    run = wfs.interleaved.start({"key": "locked"})
    published = threading.Event()

    def publisher():
        wait_until(lambda: effects("locked", "started") == 1, what="the step to start")
        with transaction.atomic():
            events.publish("interleaved", "held", key="locked")
            published.set()
            time.sleep(1.5)  # the step reaches its wait meanwhile, and blocks on the lock

    def go():
        published.wait(20)
        SideEffect.objects.create(key="locked", note="go")  # another connection: visible now

    run_concurrently(drain_workflows, publisher, go)
    drain_workflows()
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED and run.output == "held"
    assert effects("locked", "resumed") == 1


def test_a_wait_times_out_with_event_timeout_that_the_step_can_catch():
    run = wfs.order.start({"key": "unpaid", "timeout": 3.0})
    drain_workflows()
    waiting = step_of(run, "await_payment")
    assert waiting.state == StepState.WAITING and waiting.wait_until is not None
    timer = Job.objects.get(id=waiting.job_id)
    assert timer.state == JobState.SCHEDULED  # the timeout is one deferred job
    drain_workflows()  # not due yet: still waiting (its timer keeps its time)
    assert step_of(run, "await_payment").state == StepState.WAITING
    # Until it is due by the database's clock, however long the drains above took.
    wait_until(lambda: store.db_now("default") > waiting.wait_until, timeout=10, what="the timeout")
    drain_workflows()
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED and run.output == {"status": "cancelled"}
    assert effects("unpaid", "cancelled") == 1 and effects("unpaid", "paid") == 0


def test_a_payment_in_time_wins_over_the_timeout_and_cancels_the_timer():
    run = wfs.order.start({"key": "paid", "timeout": 60})
    drain_workflows()
    timer_id = step_of(run, "await_payment").job_id
    events.publish("payment", {"amount": 99}, key="paid")
    assert Job.objects.get(id=timer_id).state == JobState.CANCELLED
    drain_workflows()
    run.refresh_from_db()
    assert run.output == {"status": "paid", "amount": 99}
    assert effects("paid", "cancelled") == 0


def test_a_durable_sleep_holds_no_worker_and_resumes_once():
    run = wfs.sleeper.start({"key": "nap", "seconds": 0.5})
    drain_workflows()
    nap = step_of(run, "nap")
    assert nap.state == StepState.WAITING and nap.wait_event_name is None
    time.sleep(0.6)
    drain_workflows()
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED
    assert (effects("nap", "started"), effects("nap", "woke")) == (2, 1)


def test_a_wait_whose_timer_job_was_cancelled_is_rearmed_by_the_leaders_sweep():
    """A timed wait's only way out is its one deferred timer job. Cancelled from the
    jobs admin (or failed, or purged), the step would wait for ever; the leader's
    sweep gives it a fresh timer once the wait is over, without counting an attempt
    (shown to fail before the sweep looked at waiting steps)."""
    from django_dispatch import services
    from django_dispatch.conf import get_settings
    from django_dispatch.runtime.maintenance import Maintenance

    sleep = wfs.sleeper.start({"key": "lost-sleep", "seconds": 1.0})
    timeout = wfs.order.start({"key": "lost-timeout", "timeout": 1.0})
    no_end = wfs.awaits.start({"key": "no-end", "event_key": "never"})
    drain_workflows()
    nap, pay = step_of(sleep, "nap"), step_of(timeout, "await_payment")
    assert nap.state == pay.state == step_of(no_end, "wait").state == StepState.WAITING
    assert services.cancel(nap.job_id) is True  # as the jobs admin does
    assert services.cancel(pay.job_id) is True
    leader = Maintenance("leader", get_settings(), "default")
    assert leader.elect() is True  # takes office, and sweeps at once
    assert step_of(sleep, "nap").job_id == nap.job_id  # not over yet: left as it is
    time.sleep(1.1)
    assert drain_workflows() == 0  # nothing else would ever end these waits
    leader.reclaim()
    leader.reclaim()  # re-armed once
    for before, run in ((nap, sleep), (pay, timeout)):
        after = step_of(run, before.name)
        assert after.state == StepState.WAITING and after.wait_until == before.wait_until
        assert Job.objects.get(id=after.job_id).state in QUEUED_STATES
        assert after.job_id != before.job_id
    assert step_of(no_end, "wait").job_id is None  # no end, no timer: a publish ends it
    assert Job.objects.filter(state__in=QUEUED_STATES).count() == 2
    drain_workflows()
    for run in (sleep, timeout):
        run.refresh_from_db()
        assert run.state == RunState.SUCCEEDED
    assert timeout.output == {"status": "cancelled"}
    assert (effects("lost-sleep", "started"), effects("lost-sleep", "woke")) == (2, 1)
    assert effects("lost-timeout", "cancelled") == 1
    for run, name in ((sleep, "nap"), (timeout, "await_payment")):
        step = step_of(run, name)
        assert (step.failures, step.errors) == (0, [])
    assert step_of(no_end, "wait").state == StepState.WAITING


@pytest.mark.parametrize("seconds", [0, 60], ids=["already-over", "with-a-timer"])
def test_a_wait_recorded_by_an_attempt_whose_claim_was_taken_over_writes_nothing(
    monkeypatch, seconds
):
    """The job's re-run (its lease expired) takes the step over between the old
    attempt's read of its claim and its write (the claim takes no run lock, so
    this can happen on PostgreSQL; forced here at that exact point). The old
    attempt's wait must return False and write nothing: no job inserted, the
    re-run's claim intact (shown to fail when the write's result was unchecked)."""
    from django_dispatch.store import workflows as wf_store
    from django_dispatch.store.workflows import waits
    from django_dispatch.workflows.engine import build_step_job

    run = wfs.sleeper.start({"key": f"taken-{seconds}", "seconds": seconds})
    nap = step_of(run, "nap")
    first = wf_store.workflow_step_claim(nap.pk, 1, nap.job_id)
    assert first is not None
    rerun = []
    already_over = waits._already_over

    def taken_over_first(*args):
        rerun.append(wf_store.workflow_step_claim(nap.pk, 1, nap.job_id))
        return already_over(*args)

    monkeypatch.setattr(waits, "_already_over", taken_over_first)
    jobs = set(Job.objects.values_list("id", flat=True))
    wait = waits.WaitSpec("sleep", seconds=seconds)
    won = wf_store.workflow_step_wait(nap.pk, first.claim_id, wait, build_job=build_step_job)
    assert won is False
    assert rerun[0] is not None
    after = step_of(run, "nap")
    assert (after.state, after.claim_id, after.job_id) == (
        StepState.RUNNING,
        rerun[0].claim_id,
        nap.job_id,
    )
    assert (after.waits, after.wait_until) == ([], None)
    assert set(Job.objects.values_list("id", flat=True)) == jobs


def test_waits_are_numbered_by_call_order_within_the_step():
    run = wfs.twice.start({"key": "tw"})
    drain_workflows()
    events.publish("second", 2, key="tw")  # published first, waited for second
    drain_workflows()
    assert step_of(run, "two_waits").state == StepState.WAITING  # still on "first"
    events.publish("first", 1, key="tw")
    drain_workflows()
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED and run.output == [1, 2]
    assert [w["kind"] for w in step_of(run, "two_waits").waits] == ["event", "sleep", "event"]


def test_cancelling_a_waiting_run_cancels_its_timer_and_a_later_publish_wakes_nothing():
    run = wfs.order.start({"key": "gone", "timeout": 60})
    drain_workflows()
    timer_id = step_of(run, "await_payment").job_id
    assert cancel_run(run.pk) is True
    assert Job.objects.get(id=timer_id).state == JobState.CANCELLED
    events.publish("payment", {"amount": 1}, key="gone")
    assert step_of(run, "await_payment").state == StepState.CANCELLED
    assert drain_workflows() == 0


def test_bad_wait_arguments_fail_the_step_clearly():
    run = wfs.awaits.start({"key": "bad", "event_key": "", "timeout": None})
    drain_workflows()
    step = step_of(run, "wait")
    assert step.state == StepState.FAILED
    assert "event key" in step.errors[-1]["message"]


@pytest.mark.slow
def test_a_sleep_survives_sigkill_of_every_worker_and_resumes_once_on_time(start_worker):
    overrides = {"POLL_INTERVAL": 0.1}
    workers = [start_worker("--concurrency", "2", overrides=overrides) for _ in range(2)]
    run = wfs.sleeper.start({"key": "kill", "seconds": 5})
    try:
        wait_until(
            lambda: step_of(run, "nap").state == StepState.WAITING,
            timeout=60,
            what="the step to sleep",
        )
    except AssertionError:
        raise AssertionError(workers[0].output() + workers[1].output()) from None
    nap = step_of(run, "nap")
    for worker in workers:
        worker.signal(signal.SIGKILL)
        worker.wait()
    time.sleep(1.0)
    successor = start_worker("--concurrency", "2", overrides=overrides)
    wait_until(lambda: effects("kill", "woke") == 1, timeout=20, what="the sleeper to wake")
    wait_until(
        lambda: WorkflowRun.objects.get(pk=run.pk).state == RunState.SUCCEEDED,
        what="the run to succeed",
    )
    time.sleep(0.5)
    assert (effects("kill", "started"), effects("kill", "woke")) == (2, 1)
    # On time: its timer job started at the sleep's end, within a poll interval or so,
    # or as soon as the new worker was up if it started later (a loaded machine can
    # take longer than the sleep to start a Python process).
    timer = Job.objects.get(id=nap.job_id)
    assert nap.wait_until is not None and timer.started_at is not None
    assert timer.started_at >= nap.wait_until  # never early
    up = Worker.objects.get(pid=successor.pid).started_at
    late = (timer.started_at - max(nap.wait_until, up)).total_seconds()
    assert late < 1.0, late


def _waiting_runs(count: int) -> None:
    """``count`` runs whose one step waits for an event, half of them with a timeout
    a day away (a deferred timer job each), as ``drain_workflows`` would leave them."""
    from django.db.models.functions import Now

    from django_dispatch.store.base import now_plus
    from django_dispatch.workflows.engine import build_step_job

    runs = WorkflowRun.objects.bulk_create(
        [WorkflowRun(name=wfs.awaits.name, input={"key": f"w{i}"}) for i in range(count)]
    )
    steps = WorkflowTask.objects.bulk_create(
        [
            WorkflowTask(
                run=run,
                name="wait",
                sequence=0,
                handler_path="tests.testapp.wait_workflows.wait",
                state=StepState.WAITING,
                wait_event_name="payment",
                wait_event_key=f"order:{i}",
                started_at=Now(),
            )
            for i, run in enumerate(runs)
        ]
    )
    timers = [build_step_job(step.pk, 1, "default") for step in steps[::2]]
    for timer in timers:
        timer.run_after = now_plus(86400)
    Job.objects.bulk_create(timers)
    for step, timer in zip(steps[::2], timers, strict=True):
        step.job_id = timer.pk
        step.wait_until = timer.run_after
    WorkflowTask.objects.bulk_update(steps[::2], ["job_id", "wait_until"])
    _checkpoint()


def _checkpoint() -> None:
    """Settle the fixture's bulk writes before a drain is measured, as time would on a
    live site: SQLite writes them out of the WAL (else the checkpoint that the next
    connection close runs is charged to the drain); PostgreSQL vacuums and analyzes
    the tables (else autovacuum starts on them mid-drain, and the planner works
    from statistics of before the 10,000 rows)."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            return
        for model in (Job, WorkflowTask, WorkflowRun):
            cursor.execute(f"VACUUM ANALYZE {connection.ops.quote_name(model._meta.db_table)}")


def test_the_sweeps_read_waits_over_not_every_waiting_step():
    """The leader's step sweep looks for waits whose end has passed and for ready or
    running steps gone quiet: through their indexes, it reads those, not the 10,000
    waits still ahead. Before, the lost-timer part read every waiting step, every
    sweep, and on SQLite the stale-step part read every step."""
    from django_dispatch.store.workflows.sweep import sweep_stale_steps
    from django_dispatch.workflows.engine import build_step_job

    def sweep_work() -> int:
        with database_work() as work:
            assert sweep_stale_steps(60, build_job=build_step_job) == []
        return work.amount

    _waiting_runs(100)
    few = sweep_work()
    _waiting_runs(10_000)
    many = sweep_work()
    # A read of every waiting step costs about 100 times as much with 10,000 as with 100.
    assert many <= 10 * max(few, 1), f"{few=} {many=}"


def _drain_work(jobs: int) -> int:
    """The database work (``tests.database_work``) of draining ``jobs`` no-op jobs with
    4 threads."""
    from django_dispatch import enqueue_many
    from django_dispatch.testing import drain
    from tests.testapp.tasks import noop

    enqueue_many(noop, [((i,), {}) for i in range(jobs)])
    with database_work() as work:
        ran = drain(concurrency=4, include_retries=False)
    assert ran == jobs
    return work.amount


@pytest.mark.slow
def test_ten_thousand_waiting_runs_do_not_slow_a_worker_down():
    """The same drain of 1,000 unrelated jobs (4 threads), with and without 10,000
    waiting runs (5,000 of them with a deferred timer job): the database does about
    the same work for it. Counted, not timed (see ``tests.database_work``): a claim
    that read the waiting steps or the deferred timers would cost thousands of rows
    per claim, a hundred claims per drain.

    The leader's sweeps are not part of it: another holder keeps the leadership.
    They run once per interval, whatever the rate of jobs, and each drain here
    would otherwise start two leaders and run them twice; their own reads are
    checked by ``test_the_sweeps_read_waits_over_not_every_waiting_step``."""
    from django_dispatch.store.leadership import leadership_acquire

    assert leadership_acquire("elsewhere", ttl=3600)
    without, with_waiting = [], []
    for _ in range(2):
        without.append(_drain_work(1000))
        _waiting_runs(10_000)
        with_waiting.append(_drain_work(1000))
        assert WorkflowTask.objects.filter(state=StepState.WAITING).count() == 10_000
        # One statement each (no cascade collector: the test's bookkeeping, not measured).
        WorkflowTask.objects.filter(name="wait")._raw_delete("default")
        WorkflowRun.objects.filter(name=wfs.awaits.name)._raw_delete("default")
        Job.objects.filter(state__in=QUEUED_STATES)._raw_delete("default")  # the timers
        _checkpoint()
    # The least of each: how many claims a drain takes varies a little with timing.
    assert min(with_waiting) <= 1.25 * min(without), f"{without=} {with_waiting=}"
