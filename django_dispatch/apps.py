from django.apps import AppConfig


class DispatchConfig(AppConfig):
    name = "django_dispatch"
    verbose_name = "Dispatch"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers system checks)
        from .workflows import hooks

        hooks.connect()  # workflows hook into publishes and the leader's sweeps
