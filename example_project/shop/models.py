"""What the demo tasks leave behind, so that their effects can be seen."""

from django.db import models


class Delivery(models.Model):
    """One visible side effect of one task attempt."""

    task = models.CharField(max_length=100)
    job_id = models.CharField(max_length=50, blank=True)
    attempt = models.PositiveIntegerField(default=1)
    detail = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        verbose_name_plural = "deliveries"

    def __str__(self) -> str:
        return f"{self.task}: {self.detail}"


class Contact(models.Model):
    """A row of an uploaded contact list, imported by the ``import_upload`` workflow."""

    email = models.EmailField(unique=True)
    name = models.CharField(max_length=200)
    imported_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["email"]

    def __str__(self) -> str:
        return f"{self.name} <{self.email}>"


class Payment(models.Model):
    """A payment recorded by the atomic ``record_payment`` job.

    No unique key on purpose: ``@task(atomic=True)`` is what keeps it at one
    row per job, since the row commits with the job's success or not at all.
    """

    order_id = models.IntegerField()
    amount_cents = models.PositiveIntegerField()
    job_id = models.CharField(max_length=50)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"order {self.order_id}: {self.amount_cents} cents (job {self.job_id})"
