"""A claim's jobs resolve their Tasks once per distinct task and options
(``attempt.resolve_claim``), with what ``task_for_row`` gives each alone."""

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from django_dispatch.models import Job
from django_dispatch.runtime import attempt
from django_dispatch.runtime.running import RunningJob
from django_dispatch.tasks.task import task_for_row
from tests.store.helpers import claim
from tests.testapp import async_tasks, tasks

pytestmark = pytest.mark.django_db(transaction=True)


class Reads(dict[str, Any]):
    """A row that remembers which columns were read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __iter__(self) -> Iterator[str]:
        raise AssertionError("task_for_row must read columns by name")


def test_task_for_row_reads_only_the_columns_the_claim_shares_tasks_by():
    """If ``task_for_row`` ever reads another column, rows differing in it would
    share a Task they must not: ``TASK_COLUMNS`` must grow with it."""
    later = timezone.now() + timedelta(hours=1)
    tasks.add.using(partition_key="k", idempotency_key="i").enqueue(1, 2)
    tasks.add.using(run_after=later).enqueue(1, 2)
    tasks.add.enqueue(1, 2)
    Job.objects.update(state="pending", run_after=timezone.now() - timedelta(seconds=1))
    rows = [Reads(c.row) for c in claim(limit=10)]
    assert len(rows) == 3
    for row in rows:
        task_for_row(row)
        assert row.read <= set(attempt.TASK_COLUMNS), row.read - set(attempt.TASK_COLUMNS)


def test_a_claim_shares_one_task_per_options_and_resolves_each_as_alone():
    tasks.add.enqueue(1, 2)
    tasks.add.enqueue(3, 4)
    tasks.add.using(priority=7).enqueue(5, 6)
    async_tasks.window.enqueue(0.01)
    tasks.add.using(partition_key="p").enqueue(7, 8)
    claimed = claim(limit=10)
    runs = [RunningJob(job, 30.0) for job in claimed]
    attempt.resolve_claim(runs)
    for running in runs:
        alone = task_for_row(running.claimed.row)
        assert running.task == alone and running.unknown is None
    by_args = {tuple(r.claimed.row["args"]): r.task for r in runs}
    assert by_args[(1, 2)] is by_args[(3, 4)]  # one lookup for both
    assert by_args[(5, 6)].priority == 7 and by_args[(7, 8)].partition_key == "p"


def test_a_task_that_does_not_resolve_fails_each_of_its_jobs_on_its_own():
    tasks.add.enqueue(1, 2)
    tasks.add.enqueue(3, 4)
    Job.objects.update(task_path="tests.testapp.tasks.gone")
    runs = [RunningJob(job, 30.0) for job in claim(limit=10)]
    attempt.resolve_claim(runs)
    assert [r.task for r in runs] == [None, None]
    unknown = [r.unknown for r in runs]
    assert all(u is not None for u in unknown) and unknown[0] is not unknown[1]
