from django.contrib import admin

from .models import Contact, Delivery, Payment


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = ["id", "task", "job_id", "attempt", "detail", "created_at"]
    list_filter = ["task"]
    search_fields = ["job_id", "detail"]


@admin.register(Contact)
class ContactAdmin(admin.ModelAdmin):
    """Rows imported by the ``import_upload`` workflow (``shop.imports``)."""

    list_display = ["email", "name", "imported_at"]
    search_fields = ["email", "name"]


@admin.register(Payment)
class PaymentAdmin(admin.ModelAdmin):
    """Rows of the atomic ``record_payment`` job: one per job, however often it retried."""

    list_display = ["id", "order_id", "amount_cents", "job_id", "created_at"]
    search_fields = ["job_id"]
