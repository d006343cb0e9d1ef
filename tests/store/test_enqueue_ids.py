"""enqueue_many returns the new jobs' ids unless asked for TaskResults, and
then keeps none of them: a million-row batch must not hold a million results."""

from __future__ import annotations

import gc
import tracemalloc

import pytest
from django.db import transaction

from django_dispatch import enqueue_many
from django_dispatch.compat import InvalidTask, TaskResult, task_enqueued
from django_dispatch.models import Job
from django_dispatch.tasks import enqueue as enqueue_module
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

COUNT = 2_000


def test_ids_by_default_results_on_request_both_in_input_order():
    ids = enqueue_many(tasks.add, [((i, i), {}) for i in range(5)])
    assert all(type(job_id) is str for job_id in ids)
    rows = dict(Job.objects.filter(pk__in=ids).values_list("pk", "args"))
    assert [rows[int(job_id)] for job_id in ids] == [[i, i] for i in range(5)]
    results = enqueue_many(tasks.add, [((i, 0), {}) for i in range(3)], return_results=True)
    assert all(isinstance(r, TaskResult) for r in results)
    assert [r.args for r in results] == [[0, 0], [1, 0], [2, 0]]
    assert [tasks.add.get_result(r.id).args for r in results] == [[0, 0], [1, 0], [2, 0]]


def _kept_after(return_results: bool) -> tuple[int, list]:
    """Bytes still allocated once enqueue_many returned (its return value held)."""
    calls = [((i, i), {}) for i in range(COUNT)]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        value = enqueue_many(tasks.add, calls, return_results=return_results)
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return kept, value


def test_ids_keep_a_fraction_of_what_results_keep():
    kept_results, results = _kept_after(True)
    assert len(results) == COUNT
    del results
    kept_ids, ids = _kept_after(False)
    assert len(ids) == COUNT
    # A TaskResult with its own arguments is several hundred bytes; an id a few dozen.
    assert kept_ids * 4 < kept_results, (kept_ids, kept_results)
    assert kept_ids < COUNT * 120, kept_ids


def test_receivers_get_every_result_yet_none_is_kept():
    seen: list[str] = []

    def receiver(sender, task_result, **kwargs):
        seen.append(task_result.id)  # the id only: the result itself is let go

    task_enqueued.connect(receiver)
    try:
        kept, ids = _kept_after(False)
    finally:
        task_enqueued.disconnect(receiver)
    assert seen == ids
    kept_results, _ = _kept_after(True)
    assert kept < kept_results / 2, (kept, kept_results)


def _peak_during(calls: list) -> int:
    """The most bytes allocated at once while enqueue_many ran (its return value kept)."""
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        ids = enqueue_many(tasks.add, calls)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert len(ids) == len(calls)
    return peak


def test_a_batch_is_inserted_a_chunk_at_a_time_so_its_peak_does_not_grow_with_it(monkeypatch):
    """Each chunk's JSON and decoded calls are let go once it is inserted: a batch of
    ten chunks peaks well under ten times a one-chunk batch (the ids only grow)."""
    monkeypatch.setattr(enqueue_module, "ENQUEUE_CHUNK", COUNT // 10)
    one_chunk = _peak_during([((i, i), {}) for i in range(COUNT // 10)])
    ten_chunks = _peak_during([((i, i), {}) for i in range(COUNT)])
    assert ten_chunks < 4 * one_chunk, (one_chunk, ten_chunks)


@pytest.mark.django_db(transaction=True)
def test_a_bad_call_in_a_later_chunk_leaves_nothing_written(monkeypatch):
    """Chunks go in one by one, in one transaction: the batch is still all or nothing,
    outside any transaction of the caller's as inside one."""
    monkeypatch.setattr(enqueue_module, "ENQUEUE_CHUNK", 3)
    calls = [((i, i), {}) for i in range(7)] + [((1, 2, 3), {})] + [((9, 9), {})]
    with pytest.raises(InvalidTask, match="call #7"):
        enqueue_many(tasks.add, calls)
    assert not Job.objects.exists()
    with transaction.atomic():
        with pytest.raises(InvalidTask, match="call #7"):
            enqueue_many(tasks.add, calls)
        assert not Job.objects.exists()
        assert len(enqueue_many(tasks.add, calls[:7])) == 7  # the caller's transaction goes on
    assert Job.objects.count() == 7
