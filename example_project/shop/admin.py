from django.contrib import admin

from .models import Delivery


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = ["id", "task", "job_id", "attempt", "detail", "created_at"]
    list_filter = ["task"]
    search_fields = ["job_id", "detail"]
