"""Worker rows (store/workers.py)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from django_dispatch import store
from django_dispatch.models import Job, Worker
from tests.store.helpers import claim
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_stale_worker_rows_are_deleted_and_jobs_untouched():
    store.worker_register("old", hostname="h", pid=1, queues=[], concurrency=1)
    store.worker_register("fresh", hostname="h", pid=2, queues=[], concurrency=1)
    Worker.objects.filter(id="old").update(last_seen_at=timezone.now() - timedelta(hours=1))
    result = tasks.add.enqueue(1, 1)
    claim(worker="old")
    assert store.workers_delete_stale(stale_seconds=60) == 1
    assert list(Worker.objects.values_list("id", flat=True)) == ["fresh"]
    assert Job.objects.get(pk=result.id).worker_id == "old"
