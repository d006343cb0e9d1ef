"""The worker's behaviour, in-process through testing.drain (the real path:
claim, job threads with their own connections, fenced completion)."""

import signal
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_dispatch import cancel, store
from django_dispatch.compat import (
    TASKS_LOGGER,
    TaskResultStatus,
    log_task_finished,
    log_task_started,
    task_finished,
    task_started,
)
from django_dispatch.models import Job, JobUsage, Worker
from django_dispatch.runtime import metering
from django_dispatch.states import JobState
from django_dispatch.tasks.results import signal_is_silent
from django_dispatch.testing import assert_enqueued, drain
from tests.conftest import wait_until
from tests.testapp import tasks
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)


def test_success_fills_every_task_result_field():
    enqueued = tasks.add.enqueue(2, 3)
    assert drain(worker_id="w-test") == 1
    result = tasks.add.get_result(enqueued.id)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.enqueued_at <= result.started_at <= result.last_attempted_at
    assert result.last_attempted_at <= result.finished_at
    assert result.worker_ids == ["w-test"] and result.attempts == 1
    assert result.errors == [] and result.args == [2, 3]
    enqueued.refresh()
    assert enqueued == result


def test_batched_completion_of_none_and_mixed_results(caplog):
    """The hot path writes a wave of successes in one UPDATE, whatever they returned."""
    nones = [tasks.noop.enqueue() for _ in range(6)]
    mixed = [tasks.noop.enqueue(v) for v in (None, 1, "x", {"a": [1]}, None, [2])]
    with caplog.at_level("WARNING", logger="django_dispatch"):
        drain(concurrency=6)
    problems = [r.getMessage() for r in caplog.records if r.name.startswith("django_dispatch")]
    assert problems == []  # no failed batch write, no fallback to one-by-one
    for enqueued in nones:
        assert tasks.noop.get_result(enqueued.id).return_value is None
    values = [tasks.noop.get_result(r.id).return_value for r in mixed]
    assert values == [None, 1, "x", {"a": [1]}, None, [2]]
    assert Job.objects.filter(state=JobState.SUCCEEDED).count() == 12


def test_failure_records_error_with_traceback():
    enqueued = tasks.fail_always.enqueue("bad thing")
    drain()
    result = tasks.fail_always.get_result(enqueued.id)
    assert result.status == TaskResultStatus.FAILED
    assert result.finished_at is not None
    (error,) = result.errors
    assert error.exception_class_path == "builtins.ValueError"
    assert error.exception_class is ValueError
    assert "bad thing" in error.traceback and "fail_always" in error.traceback
    with pytest.raises(ValueError):
        result.return_value  # noqa: B018


def test_retry_until_success_keeps_one_error_per_failed_attempt():
    enqueued = tasks.fail_twice.enqueue("k")
    # One claim: the retry's 0.05 s backoff can end before a slow drain does.
    drain(include_retries=False, max_jobs=1)
    waiting = tasks.fail_twice.get_result(enqueued.id)
    assert waiting.status == TaskResultStatus.READY and len(waiting.errors) == 1
    drain()
    result = tasks.fail_twice.get_result(enqueued.id)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == "third time lucky"
    assert result.attempts == 3 and len(result.errors) == 2
    assert SideEffect.objects.filter(key="k", note="attempt").count() == 3


def test_retries_stop_at_max_attempts():
    enqueued = tasks.fail_always.using().enqueue()
    Job.objects.filter(pk=enqueued.id).update(max_attempts=3)
    drain()
    result = tasks.fail_always.get_result(enqueued.id)
    assert result.status == TaskResultStatus.FAILED and result.attempts == 3
    assert len(result.errors) == 3


def test_backoff_returning_none_stops_retrying():
    enqueued = tasks.fail_not_retryable.enqueue()
    drain()
    result = tasks.fail_not_retryable.get_result(enqueued.id)
    assert result.status == TaskResultStatus.FAILED and result.attempts == 1


def test_retry_waits_for_its_backoff_on_the_database_clock():
    # A backoff longer than the drain: with the suite's 50 ms one, a loaded machine's
    # drain outlived it and ran the retry too.
    enqueued = tasks.fails_then_backs_off_a_minute.enqueue("later")
    drain(include_retries=False)
    job = Job.objects.get(pk=enqueued.id)
    assert job.state == JobState.SCHEDULED and job.run_after > job.last_attempted_at


def test_async_task_runs():
    enqueued = tasks.async_add.enqueue(20, 22)
    drain()
    assert tasks.async_add.get_result(enqueued.id).return_value == 42


def test_takes_context():
    enqueued = tasks.with_context.enqueue("ctx")
    drain()
    result = tasks.with_context.get_result(enqueued.id)
    assert result.return_value == {"attempt": 1, "id": enqueued.id}


def test_checkpoint_persists_and_next_attempt_resumes():
    enqueued = tasks.count_to.enqueue("resume", 5)
    drain()
    job = Job.objects.get(pk=enqueued.id)
    assert job.state == JobState.SUCCEEDED and job.checkpoint == 5
    notes = list(SideEffect.objects.filter(key="resume").values_list("note", flat=True))
    assert notes == ["1", "2", "3", "4", "5"]


def test_run_after_is_respected():
    later = tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 1)
    now = tasks.add.enqueue(2, 2)
    assert drain() == 1
    assert tasks.add.get_result(now.id).status == TaskResultStatus.SUCCESSFUL
    assert tasks.add.get_result(later.id).status == TaskResultStatus.READY


def test_priority_order():
    for priority in (0, 10, -10, 5):
        tasks.record_many.using(priority=priority).enqueue(f"p{priority}")
    drain(concurrency=1)
    order = list(SideEffect.objects.order_by("id").values_list("key", flat=True))
    assert order == ["p10", "p5", "p0", "p-10"]


def test_queue_filtering():
    email = tasks.echo.enqueue("to emails")
    other = tasks.add.enqueue(1, 1)
    assert drain(queues=["emails"]) == 1
    assert tasks.echo.get_result(email.id).status == TaskResultStatus.SUCCESSFUL
    assert tasks.add.get_result(other.id).status == TaskResultStatus.READY
    assert_enqueued("tests.testapp.tasks.add", count=1)


def test_signals_started_and_finished():
    seen = []

    def started(sender, task_result, **kwargs):
        seen.append(("started", task_result.status))

    def finished(sender, task_result, **kwargs):
        seen.append(("finished", task_result.status))

    task_started.connect(started)
    task_finished.connect(finished)
    try:
        tasks.add.enqueue(1, 1)
        drain()
        tasks.fail_always.enqueue()
        drain()
    finally:
        task_started.disconnect(started)
        task_finished.disconnect(finished)
    assert seen == [
        ("started", TaskResultStatus.RUNNING),
        ("finished", TaskResultStatus.SUCCESSFUL),
        ("started", TaskResultStatus.RUNNING),
        ("finished", TaskResultStatus.FAILED),
    ]


@pytest.fixture
def djangos_receivers_only():
    """task_started/task_finished with Django's own log receivers only, for the test:
    other test modules connect receivers of their own at import (chaos_tasks does)."""
    backend_class = type(tasks.add.get_backend())
    own = {task_started: log_task_started, task_finished: log_task_finished}
    others = {
        sent: [r for r in sent._live_receivers(backend_class)[0] if r is not own[sent]]
        for sent in own
    }
    for sent, receivers in others.items():
        for receiver_ in receivers:
            sent.disconnect(receiver_)
    yield
    for sent, receivers in others.items():
        for receiver_ in receivers:
            sent.connect(receiver_)


@pytest.mark.usefixtures("djangos_receivers_only")
def test_a_success_nobody_observes_sends_no_signal_and_one_observed_does(caplog):
    """The worker skips the signals (and the TaskResult) only when they are silent."""
    backend_class = type(tasks.add.get_backend())
    caplog.set_level("WARNING", logger=TASKS_LOGGER)  # Django's log receivers drop INFO
    for sent in (task_started, task_finished):
        assert signal_is_silent(sent, backend_class)

    finished = []

    def receiver(sender, task_result, **kwargs):
        finished.append((task_result.status, task_result.return_value))

    task_finished.connect(receiver)
    try:
        assert not signal_is_silent(task_finished, backend_class)
        assert signal_is_silent(task_started, backend_class)
        tasks.add.enqueue(2, 3)
        drain()
    finally:
        task_finished.disconnect(receiver)
    assert finished == [(TaskResultStatus.SUCCESSFUL, 5)]
    assert signal_is_silent(task_finished, backend_class)

    # Django's own log receivers count once their logger takes INFO records.
    caplog.set_level("INFO", logger=TASKS_LOGGER)
    assert not signal_is_silent(task_started, backend_class)
    enqueued = tasks.add.enqueue(1, 1)
    drain()
    logged = [r.getMessage() for r in caplog.records if r.name == TASKS_LOGGER]
    assert f"Task id={enqueued.id} path=tests.testapp.tasks.add state=RUNNING" in logged
    assert f"Task id={enqueued.id} path=tests.testapp.tasks.add state=SUCCESSFUL" in logged


def test_quiet_successes_are_settled_without_leaking_their_meters(caplog):
    """Successes nobody observes are settled on the control loop, not the reporter's
    thread: every job still ends succeeded, with its usage record, and its meter is
    dropped (a leak here would grow a long-lived worker without bound)."""
    caplog.set_level("WARNING", logger=TASKS_LOGGER)
    ids = [int(tasks.add.enqueue(i, i).id) for i in range(60)]
    assert drain(concurrency=4) == 60
    assert Job.objects.filter(pk__in=ids, state=JobState.SUCCEEDED).count() == 60
    assert JobUsage.objects.filter(job_id__in=ids, outcome="succeeded").count() == 60
    assert not set(ids) & set(metering.METERS)  # (other tests' abandoned jobs may linger)


def test_failing_signal_receiver_never_changes_the_outcome():
    def broken(sender, task_result, **kwargs):
        raise RuntimeError("receiver bug")

    task_started.connect(broken)
    task_finished.connect(broken)
    try:
        enqueued = tasks.add.enqueue(1, 1)
        drain()
    finally:
        task_started.disconnect(broken)
        task_finished.disconnect(broken)
    assert tasks.add.get_result(enqueued.id).status == TaskResultStatus.SUCCESSFUL


def test_finished_signal_for_a_failure_is_sent_with_the_traceback(caplog):
    tasks.fail_always.enqueue("logged")
    with caplog.at_level("ERROR", logger=TASKS_LOGGER):
        drain()
    records = [r for r in caplog.records if r.name == TASKS_LOGGER]
    assert records and records[-1].exc_info and records[-1].exc_info[0] is ValueError


def test_unknown_task_path_fails_the_job_not_the_worker():
    bad = Job.objects.create(task_path="tests.testapp.tasks.does_not_exist", args=[])
    not_task = Job.objects.create(task_path="tests.testapp.tasks.not_a_task", args=[])
    good = tasks.add.enqueue(1, 1)
    drain()
    for row in (bad, not_task):
        row.refresh_from_db()
        assert row.state == JobState.FAILED and row.attempts == 1
        assert row.errors[0]["exception_class_path"] == "django_dispatch.exceptions.UnknownTask"
    assert "cannot be imported" in Job.objects.get(pk=bad.pk).errors[0]["message"]
    assert "not a Task" in Job.objects.get(pk=not_task.pk).errors[0]["message"]
    assert tasks.add.get_result(good.id).status == TaskResultStatus.SUCCESSFUL


def test_a_task_module_that_fails_to_import_fails_the_job_and_frees_the_slot():
    bad = Job.objects.create(task_path="tests.testapp.broken_module.never", args=[])
    good = tasks.add.enqueue(1, 1)
    drain(concurrency=1)  # one slot: a leaked slot would leave `good` pending
    bad.refresh_from_db()
    assert bad.state == JobState.FAILED
    assert "KeyError" in bad.errors[0]["message"]
    assert tasks.add.get_result(good.id).status == TaskResultStatus.SUCCESSFUL


def test_arguments_that_no_longer_fit_fail_the_job():
    row = Job.objects.create(task_path="tests.testapp.tasks.add", args=[1, 2, 3])
    drain()
    row.refresh_from_db()
    assert row.state == JobState.FAILED
    assert "cannot be called" in row.errors[0]["message"]


def test_non_json_return_value_fails_the_job_without_retrying():
    enqueued = tasks.returns_object.enqueue()  # max_attempts=3: a retry would not help
    drain()
    result = tasks.returns_object.get_result(enqueued.id)
    assert result.status == TaskResultStatus.FAILED and result.attempts == 1
    assert "JSON-serializable" in result.errors[0].traceback


def test_a_return_value_no_database_can_store_fails_only_its_job():
    """jsonb refuses NUL: the job fails at once; its wave's other successes are written."""
    bad = tasks.returns_nul.enqueue()
    good = [tasks.add.enqueue(i, i) for i in range(6)]
    drain(concurrency=8)
    result = tasks.returns_nul.get_result(bad.id)
    assert result.status == TaskResultStatus.FAILED and result.attempts == 1
    assert "NUL character" in result.errors[0].traceback
    assert all(tasks.add.get_result(g.id).status == TaskResultStatus.SUCCESSFUL for g in good)


def test_system_exit_in_a_task_fails_the_job_not_the_worker():
    bad = tasks.raises_system_exit.enqueue()
    good = tasks.add.enqueue(1, 1)
    drain(concurrency=1)
    result = tasks.raises_system_exit.get_result(bad.id)
    assert result.status == TaskResultStatus.FAILED and result.attempts == 2
    assert result.errors[0].exception_class_path == "builtins.SystemExit"
    assert tasks.add.get_result(good.id).status == TaskResultStatus.SUCCESSFUL


def test_job_cancelled_raised_by_the_task_itself_is_an_error():
    enqueued = tasks.raises_job_cancelled.enqueue()
    drain()
    job = Job.objects.get(pk=enqueued.id)
    assert job.state == JobState.FAILED and job.lease_expires_at is None
    assert job.errors[0]["exception_class_path"] == "django_dispatch.exceptions.JobCancelled"


def test_sync_timeout_fails_the_attempt_and_fences_the_thread():
    enqueued = tasks.too_slow.enqueue(2)
    drain()
    result = tasks.too_slow.get_result(enqueued.id)
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class_path == "django_dispatch.exceptions.TaskTimeout"
    assert result.finished_at is not None
    # The abandoned thread finishes its sleep later; its completion is fenced out.
    job = Job.objects.get(pk=enqueued.id)
    time.sleep(2)
    job.refresh_from_db()
    assert job.state == JobState.FAILED and job.return_value is None


def test_async_timeout_cancels_the_coroutine():
    enqueued = tasks.too_slow_async.enqueue(5)
    drain()
    result = tasks.too_slow_async.get_result(enqueued.id)
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class_path == "django_dispatch.exceptions.TaskTimeout"


def test_worker_registers_and_deregisters():
    tasks.add.enqueue(1, 1)
    drain(worker_id="registered")
    assert not Worker.objects.filter(id="registered").exists()


def test_cancelled_while_running_discards_result_and_keeps_checkpoint():
    enqueued = tasks.count_to.enqueue("cancel-me", 1000, 0.01)

    def cancel_soon():
        try:
            wait_until(lambda: SideEffect.objects.filter(key="cancel-me").count() >= 3)
            cancel(enqueued.id)
        finally:
            connection.close()

    canceller = threading.Thread(target=cancel_soon)
    canceller.start()
    drain()
    canceller.join()
    job = Job.objects.get(pk=enqueued.id)
    assert job.state == JobState.CANCELLED and job.return_value is None
    # The cancel lands once 3 items are written; the progress() that found it
    # saved its item as the final checkpoint, so every item done is on record.
    assert job.checkpoint is not None and 3 <= job.checkpoint < 1000
    assert SideEffect.objects.filter(key="cancel-me").count() == job.checkpoint


def test_a_real_worker_keeps_a_cancelled_jobs_final_checkpoint(start_worker):
    """Cancelled while it runs in a real worker: the value its last progress() was given is kept."""
    enqueued = tasks.count_to.enqueue("final-word", 100_000, 0.02)
    worker = start_worker("--concurrency", "2")
    wait_until(lambda: SideEffect.objects.filter(key="final-word").count() >= 5, timeout=30)
    cancel(enqueued.id)
    wait_until(
        lambda: Job.objects.filter(pk=enqueued.id, lease_expires_at__isnull=True).exists(),
        timeout=30,
    )  # the worker let go of it: the task stopped
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output()
    job = Job.objects.get(pk=enqueued.id)
    assert job.state == JobState.CANCELLED
    done = SideEffect.objects.filter(key="final-word").count()
    assert done >= 5 and job.checkpoint == done  # the item after the last plain progress() too
    # A lost lease saves nothing: the fence holds for the final checkpoint as for any write.
    assert not store.job_final_checkpoint_if_cancelled(
        store.Lease(job_id=job.id, worker_id=job.worker_id, epoch=job.lease_epoch + 1), 0
    )
    assert Job.objects.get(pk=enqueued.id).checkpoint == done


def test_store_retry_now_drains_waiting_retries():
    tasks.fail_twice.enqueue("rn")
    drain(include_retries=False)
    assert store.jobs_retry_now() == 1
