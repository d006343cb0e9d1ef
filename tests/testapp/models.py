from django.db import models


class SideEffect(models.Model):
    """One row per execution of a test task.

    ``key`` is unique when the test wants the database to count "exactly
    once": a second execution of the same job fails its INSERT.
    """

    key = models.CharField(max_length=200)
    job_id = models.CharField(max_length=40, blank=True)
    worker_pid = models.IntegerField(default=0)
    started_at = models.DateTimeField(null=True)
    finished_at = models.DateTimeField(null=True)
    note = models.CharField(max_length=200, blank=True)


class Execution(models.Model):
    """Counted side effect with a unique key: two runs of one job cannot both land."""

    key = models.CharField(max_length=200, unique=True)
    worker_pid = models.IntegerField(default=0)


class Step(models.Model):
    """One run of a partitioned job: its key, its place in the key, its window."""

    key = models.CharField(max_length=100)
    seq = models.IntegerField()
    started = models.FloatField()
    finished = models.FloatField()
    worker_pid = models.IntegerField(default=0)
