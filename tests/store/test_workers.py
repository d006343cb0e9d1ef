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


def test_registering_refreshes_only_this_incarnations_row():
    """A process judged dead whose id another took over meanwhile must not write its
    own host and pid back over the new owner's: it learns it was taken over."""
    store.worker_register("w", hostname="h", pid=1, queues=["a"], concurrency=1)
    store.worker_register("w", hostname="h", pid=1, queues=["b"], concurrency=2)
    assert Worker.objects.get(id="w").queues == ["b"]  # its own row: refreshed

    Worker.objects.filter(id="w").update(hostname="new-host", pid=4242)
    with pytest.raises(store.workers.WorkerIdTaken, match="taken over by pid 4242"):
        store.worker_register("w", hostname="h", pid=1, queues=["c"], concurrency=3)
    row = Worker.objects.get(id="w")
    assert (row.hostname, row.pid, row.queues) == ("new-host", 4242, ["b"])
