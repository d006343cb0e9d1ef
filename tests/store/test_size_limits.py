"""Size limits that protect the database: arguments, results, checkpoints, errors.

Arguments over ``MAX_ARGS_BYTES`` are refused at enqueue with nothing
written; a return value over ``MAX_RESULT_BYTES`` fails its job without a
retry; a checkpoint over ``MAX_CHECKPOINT_BYTES`` is refused by
``context.progress()``; errors are cut to ``MAX_ERROR_BYTES``, never refused.
Small limits are set with ``override_settings`` so that the tests stay quick;
one test runs the real thing: a 100 MB return value in a worker process.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from django_dispatch import enqueue_many, services
from django_dispatch.checks import check_dispatch_settings
from django_dispatch.conf import size_limit
from django_dispatch.core.encoding import JSON_ENCODER
from django_dispatch.core.limits import call_sizes, truncate_error_text
from django_dispatch.core.states import JobState
from django_dispatch.exceptions import InvalidTaskArguments
from django_dispatch.models import DeadLetter, Job
from django_dispatch.store.base import error_entry
from django_dispatch.store.types import CallChunk
from django_dispatch.testing import drain
from tests.conftest import wait_until
from tests.testapp import tasks


def limits(**values: int) -> Any:
    """override_settings of DISPATCH with these limits (the test settings kept)."""
    return override_settings(DISPATCH={**settings.DISPATCH, **values})


def call_size(args: Any, kwargs: Any) -> int:
    return len(JSON_ENCODER.encode(list(args))) + len(JSON_ENCODER.encode(dict(kwargs)))


# --- settings -------------------------------------------------------------------------


def test_defaults_are_generous_and_documented():
    assert size_limit("MAX_ARGS_BYTES") == 1024 * 1024
    assert size_limit("MAX_RESULT_BYTES") == 10 * 1024 * 1024
    assert size_limit("MAX_CHECKPOINT_BYTES") == 10 * 1024 * 1024
    assert size_limit("MAX_ERROR_BYTES") == 64 * 1024
    with open(settings.BASE_DIR.parent / "docs" / "settings.md") as docs:
        text = docs.read()
    for name in ("MAX_ARGS_BYTES", "MAX_RESULT_BYTES", "MAX_CHECKPOINT_BYTES", "MAX_ERROR_BYTES"):
        assert f"`{name}`" in text, name


def test_a_settings_change_is_seen_at_once():
    assert size_limit("MAX_ARGS_BYTES") == 1024 * 1024  # read, and kept
    with limits(MAX_ARGS_BYTES=5):
        assert size_limit("MAX_ARGS_BYTES") == 5
    assert size_limit("MAX_ARGS_BYTES") == 1024 * 1024


@pytest.mark.parametrize(
    ("value", "problem"),
    [(0, "must be positive"), ("1MB", "must be a number"), (1.5, "whole number")],
)
def test_bad_limits_are_reported_by_the_system_check(value, problem):
    with limits(MAX_RESULT_BYTES=value):
        errors = check_dispatch_settings()
    texts = [e.msg for e in errors if e.id == "django_dispatch.E012"]
    assert any("MAX_RESULT_BYTES" in t and problem in t for t in texts), texts


# --- arguments at enqueue ------------------------------------------------------------------


@pytest.mark.django_db
def test_arguments_over_the_limit_are_refused_with_nothing_written():
    args, kwargs = ["a" * 600], {"b": "b" * 600}
    size = call_size(args, kwargs)
    with limits(MAX_ARGS_BYTES=size - 1):
        with pytest.raises(InvalidTaskArguments) as error:
            tasks.echo.enqueue(*args, **kwargs)  # echo(value): only the size is wrong
        message = str(error.value)
        assert f"{size:,} bytes of JSON" in message
        assert f"limit of {size - 1:,} bytes" in message
        assert "DISPATCH['MAX_ARGS_BYTES']" in message and "tests.testapp.tasks.echo" in message
        assert isinstance(error.value, TypeError)  # as Django's backends raise for bad arguments
        assert not Job.objects.exists()
    with limits(MAX_ARGS_BYTES=size):  # exactly at the limit: stored
        with pytest.raises(InvalidTaskArguments, match="cannot be called"):
            tasks.echo.enqueue(*args, **kwargs)  # the size passed; the signature did not
        result = tasks.noop.enqueue("n" * (size - call_size(["n"], {}) + 1))
    assert Job.objects.get(pk=result.id).args == result.args


@pytest.mark.django_db
def test_the_default_limit_refuses_two_megabytes_of_arguments():
    with pytest.raises(InvalidTaskArguments, match=r"2,000,006 bytes of JSON.*1,048,576"):
        tasks.noop.enqueue("x" * 2_000_000)
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_enqueue_many_names_the_call_over_the_limit_and_writes_nothing():
    calls = [([f"{i}"], {}) for i in range(50)]
    calls[30] = (["x" * 2000], {})
    with limits(MAX_ARGS_BYTES=1000):
        with pytest.raises(InvalidTaskArguments, match=r"call #30: .*2,006 bytes.*MAX_ARGS_BYTES"):
            enqueue_many(tasks.noop, calls)
        assert not Job.objects.exists()
        # The first bad call is named, whatever was wrong with it.
        calls[10] = ([1, 2], {})
        with pytest.raises(InvalidTaskArguments, match=r"call #10: .*cannot be called"):
            enqueue_many(tasks.noop, calls)
        assert not Job.objects.exists()


@pytest.mark.django_db
def test_enqueue_many_accepts_a_batch_bigger_than_the_limit_of_small_calls():
    calls = [([f"value {i}", {"n": i}], {}) for i in range(500)]
    assert len(JSON_ENCODER.encode(calls)) > 10_000
    with limits(MAX_ARGS_BYTES=100):
        results = enqueue_many(tasks.add, calls)
    assert Job.objects.count() == 500 == len(results)


@pytest.mark.django_db
def test_enqueue_many_measures_calls_whose_strings_look_like_a_boundary():
    """A string holding the text between two calls cannot hide a big call."""
    sneaky = "}], [[" * 400  # 2,400 characters, looking like 400 boundaries
    calls = [(["small"], {}), ([sneaky], {}), (["small"], {})]
    with limits(MAX_ARGS_BYTES=1000):
        with pytest.raises(InvalidTaskArguments, match=r"call #1: .*2,406 bytes"):
            enqueue_many(tasks.noop, calls)
        assert not Job.objects.exists()
    with limits(MAX_ARGS_BYTES=3000):
        assert len(enqueue_many(tasks.noop, calls)) == 3


CALLS = [
    [[], {}],
    [[1], {}],
    [[], {"a": 1}],
    [["é ✓ 🎉", [None, {"x": []}]], {"k": {"}": "]"}}],
    [["}], [[", "}], [["], {"}], [[": "}], [["}],
    [[{"nested": [[[]]]}], {"e": {}}],
    [["plain"], {"and": "more"}],
]


@pytest.mark.parametrize("count", [1, 2, 3, len(CALLS)])
def test_call_sizes_equal_each_calls_own_json(count):
    for start in range(len(CALLS) - count + 1):
        calls = CALLS[start : start + count]
        text = JSON_ENCODER.encode(calls)
        assert call_sizes(text, calls) == [call_size(a, k) for a, k in calls], calls


def test_a_chunk_with_a_call_over_the_limit_cannot_be_made():
    calls = [[["x" * 50], {}], [["y"], {}]]
    text = JSON_ENCODER.encode(calls)
    biggest = call_size(*calls[0])
    assert len(text) > biggest
    with limits(MAX_ARGS_BYTES=biggest):
        CallChunk(text, calls)  # the chunk is over the limit, neither call is
        calls[1] = [["y" * 51], {}]
        with pytest.raises(InvalidTaskArguments, match=f"{biggest + 1} bytes"):
            CallChunk(JSON_ENCODER.encode(calls), calls)


# --- return values ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_return_value_over_the_limit_fails_the_job_without_retry():
    too_big = tasks.returns_text.enqueue(2000)
    fits = tasks.returns_text.enqueue(900)
    with limits(MAX_RESULT_BYTES=1000):
        drain()
    job = Job.objects.get(pk=too_big.id)
    assert job.state == JobState.FAILED and job.attempts == 1 and job.return_value is None
    (error,) = job.errors
    assert error["exception_class_path"] == "django_dispatch.limits.JSONTooLarge"
    assert "The return value of tests.testapp.tasks.returns_text: 2,002 bytes" in error["message"]
    assert "DISPATCH['MAX_RESULT_BYTES']" in error["message"]
    assert DeadLetter.objects.filter(job_id=job.pk).exists()
    assert Job.objects.get(pk=fits.id).return_value == "x" * 900


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_100_megabyte_return_value_does_not_take_the_worker_down(start_worker):
    huge = tasks.returns_text.enqueue(100_000_000)
    worker = start_worker("--concurrency", "1")

    def finished(job_id: str) -> Job | None:
        job = Job.objects.get(pk=job_id)
        return job if job.finished_at else None

    job = wait_until(lambda: finished(huge.id), timeout=60, what="the huge job to finish")
    assert job.state == JobState.FAILED and job.attempts == 1, worker.output()
    assert "100,000,002 bytes of JSON" in job.errors[0]["message"]
    assert "MAX_RESULT_BYTES" in job.errors[0]["message"]
    assert len(json.dumps(job.errors)) < 2 * size_limit("MAX_ERROR_BYTES")
    # The same worker process runs the next job.
    after = tasks.add.enqueue(2, 3)
    done = wait_until(lambda: finished(after.id), timeout=30, what="the next job")
    assert done.state == JobState.SUCCEEDED and done.return_value == 5, worker.output()
    assert worker.popen.poll() is None and done.worker_ids == job.worker_ids


# --- checkpoints ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_checkpoint_over_the_limit_is_refused_and_nothing_saved():
    result = tasks.checkpoints_text.enqueue(2000)
    with limits(MAX_CHECKPOINT_BYTES=1000):
        drain()
    job = Job.objects.get(pk=result.id)
    # Failed at its first attempt of three: the next would save the same value.
    assert job.state == JobState.FAILED and job.attempts == 1
    assert job.checkpoint == {"done": 1}  # the small one; the big one was never written
    (error,) = job.errors
    assert error["exception_class_path"] == "django_dispatch.limits.JSONTooLarge"
    assert "A checkpoint: 2,002 bytes of JSON" in error["message"]
    assert "DISPATCH['MAX_CHECKPOINT_BYTES']" in error["message"]
    fits = tasks.checkpoints_text.enqueue(2000)
    with limits(MAX_CHECKPOINT_BYTES=2002):
        drain()
    job = Job.objects.get(pk=fits.id)
    assert job.state == JobState.SUCCEEDED and job.checkpoint == "x" * 2000


# --- errors ----------------------------------------------------------------------------


def test_long_error_text_is_cut_in_the_middle():
    assert truncate_error_text("short", 1000) == "short"
    text = "HEAD" + "é" * 5000 + "TAIL"
    cut = truncate_error_text(text, 1000)
    assert len(cut.encode()) <= 1000
    assert cut.startswith("HEADé") and cut.endswith("éTAIL")
    assert "bytes cut: DISPATCH['MAX_ERROR_BYTES'] is 1,000" in cut
    exact = "a" * 1000
    assert truncate_error_text(exact, 1000) == exact
    assert truncate_error_text("nul \x00 here", 1000) == "nul \\x00 here"
    assert truncate_error_text("lone \ud800 surrogate", 1000) == "lone ? surrogate"


def test_stored_errors_are_cut_to_the_setting():
    text = "HEAD" + "é" * 5000 + "TAIL"
    with limits(MAX_ERROR_BYTES=1000):
        entry = error_entry("builtins.ValueError", text, text)
    for cut in (entry["message"], entry["traceback"]):
        assert len(cut.encode()) <= 1000
        assert "bytes cut: DISPATCH['MAX_ERROR_BYTES'] is 1,000" in cut


@pytest.mark.django_db(transaction=True)
def test_a_huge_error_is_stored_cut_not_refused():
    result = tasks.raises_long_message.enqueue(300_000)
    with limits(MAX_ERROR_BYTES=4096):
        drain()
    job = Job.objects.get(pk=result.id)
    assert job.state == JobState.FAILED
    (error,) = job.errors
    for part in ("message", "traceback"):
        assert len(error[part].encode()) <= 4096, part
        assert "bytes cut: DISPATCH['MAX_ERROR_BYTES']" in error[part]
    assert error["message"].startswith("STARTé") and error["message"].endswith("éEND")
    assert error["traceback"].startswith("Traceback")
    assert error["traceback"].rstrip().endswith("éEND")
    letter = DeadLetter.objects.get(job_id=job.pk)
    assert letter.error_message == error["message"]


@pytest.mark.django_db(transaction=True)
def test_an_error_message_with_a_nul_character_is_stored():
    result = tasks.raises_nul.enqueue()
    drain()
    job = Job.objects.get(pk=result.id)
    assert job.state == JobState.FAILED
    assert job.errors[0]["message"] == "before\\x00after"


@pytest.mark.django_db(transaction=True)
def test_a_replay_with_corrected_arguments_over_the_limit_is_refused():
    result = tasks.fail_always.enqueue("boom")
    drain()
    letter = DeadLetter.objects.get(job_id=int(result.id))
    with limits(MAX_ARGS_BYTES=100), pytest.raises(InvalidTaskArguments, match="MAX_ARGS_BYTES"):
        services.replay(letter.pk, args=["x" * 200])
    letter.refresh_from_db()
    assert letter.replayed_at is None and Job.objects.count() == 1
