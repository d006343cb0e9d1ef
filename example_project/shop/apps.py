from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "shop"
    verbose_name = "Shop (django_dispatch demo)"
    default_auto_field = "django.db.models.BigAutoField"
