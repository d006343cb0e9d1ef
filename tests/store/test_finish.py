"""The finish of a wave of successes (store/finish.py)."""

import pytest

from django_dispatch import store
from django_dispatch.core.states import JobState
from django_dispatch.models import Job, JobUsage
from django_dispatch.store.finish import Measured
from tests.conftest import postgres_only
from tests.store.helpers import claim
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_finishing_many_is_fenced_per_row_and_promotes_freed_partitions():
    first = tasks.add.using(partition_key="k").enqueue(1, 1)
    second = tasks.add.using(partition_key="k").enqueue(1, 2)
    plain = tasks.add.enqueue(1, 3)
    stolen = tasks.add.enqueue(1, 4)
    claimed = {c.id: c for c in claim(limit=10)}
    assert Job.objects.get(pk=second.id).state == JobState.BLOCKED
    # Another claim took `stolen` meanwhile: this lease is stale.
    Job.objects.filter(pk=stolen.id).update(lease_epoch=99)
    values = {int(first.id): {"nested": ["ü", 2**40, None]}, int(plain.id): None}
    values[int(stolen.id)] = "lost"
    won = store.jobs_finish_many_if_leased([(claimed[i].lease, v) for i, v in values.items()])
    assert won == {int(first.id), int(plain.id)}
    assert Job.objects.get(pk=stolen.id).state == JobState.RUNNING
    assert Job.objects.get(pk=second.id).state == JobState.PENDING  # promoted
    assert tasks.add.get_result(first.id).return_value == {"nested": ["ü", 2**40, None]}
    assert tasks.add.get_result(plain.id).return_value is None
    # Stored as SQL NULL, as the one-by-one path stores it, not as JSON null.
    assert Job.objects.filter(pk=plain.id, return_value__isnull=True).exists()
    assert [c.id for c in claim(worker="w2")] == [int(second.id)]


TRICKY = [
    'a "quoted" \\ back\\slash {brace}, comma',
    "NULL",
    "",
    {"k": 'v"\\', "{": [None, "}", "\\\\"]},
    ["ü", "\x01\t\n"],
    1.5e-300,
    None,
]


def test_finishing_many_stores_any_return_value_exactly():
    """The wave's arrays travel as text literals: every value must come back as
    returned, whatever quotes, backslashes, braces or words it holds; so must a
    worker id that is not plain."""
    ids = [int(tasks.add.enqueue(i, 0).id) for i in range(len(TRICKY))]
    worker = 'w "odd", {id}\\x'
    claimed = {c.id: c for c in claim(worker=worker, limit=len(ids))}
    results = [(claimed[i].lease, value) for i, value in zip(ids, TRICKY, strict=True)]
    assert store.jobs_finish_many_if_leased(results) == set(ids)
    for job_id, value in zip(ids, TRICKY, strict=True):
        job = Job.objects.get(pk=job_id)
        assert (job.state, job.return_value, job.worker_id) == (JobState.SUCCEEDED, value, worker)


@postgres_only
def test_usage_entries_for_other_jobs_write_no_record():
    """Only a result's own entry makes a record (on PostgreSQL, in the finishing
    statement): entries for jobs not in the wave are ignored, and a wave with
    none of its own writes no record at all."""
    job = tasks.add.enqueue(1, 1)
    (claimed,) = claim(limit=1)
    other = {int(job.id) + 1000: Measured(0.5, 0.25, 10.0, "h", "succeeded")}
    assert store.jobs_finish_many_if_leased([(claimed.lease, 2)], usage=other) == {int(job.id)}
    assert Job.objects.get(pk=job.id).state == JobState.SUCCEEDED
    assert not JobUsage.objects.exists()
