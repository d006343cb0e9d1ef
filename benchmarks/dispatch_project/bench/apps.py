import os

from django.apps import AppConfig


class BenchConfig(AppConfig):
    name = "bench"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        if os.environ.get("BENCH_WAVE_TIMES"):  # the fleet check's worker processes
            from bench import wavetimer

            wavetimer.install(os.environ["BENCH_WAVE_TIMES"])
