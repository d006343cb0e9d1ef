"""enqueue_many returns the new jobs' ids unless asked for TaskResults, and
then keeps none of them: a million-row batch must not hold a million results."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from django_dispatch import enqueue_many
from django_dispatch.compat import TaskResult, task_enqueued
from django_dispatch.models import Job
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
