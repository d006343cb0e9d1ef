"""Show every job's outcome through Django's Tasks API, and the side effects."""

from django.core.management.base import BaseCommand
from django.utils import timezone

from django_dispatch.compat import TaskResultStatus, default_task_backend
from django_dispatch.core.states import JobState
from django_dispatch.exceptions import UnknownTask
from django_dispatch.models import Job
from shop.models import Delivery


class Command(BaseCommand):
    help = "Print each demo job's status, attempts and result or last error."

    def add_arguments(self, parser):
        parser.add_argument(
            "--last", type=int, default=None, help="Only the N most recent jobs (default: all)."
        )

    def handle(self, *args, **options):
        # Read-only: ids (and the state, to tell cancelled from failed) come
        # from the Job table; everything else from the TaskResult Django's API
        # returns, exactly as application code would see it.
        jobs = Job.objects.order_by("-id").values_list(
            "id", "task_path", "state", "run_after", "errors"
        )
        if options["last"]:
            jobs = jobs[: options["last"]]
        jobs = list(reversed(jobs))
        if not jobs:
            self.stdout.write("No jobs yet: run `python manage.py enqueue_demo` first.")
            return

        self.stdout.write(f"{'job':<6} {'task':<22} {'status':<11} {'attempts':<9} outcome")
        waiting = 0
        now = timezone.now()
        for job_id, task_path, state, run_after, errors in jobs:
            try:
                result = default_task_backend.get_result(str(job_id))
            except UnknownTask as e:  # e.g. a task renamed without an alias
                self.stdout.write(f"#{job_id:<5} {task_path:<22} ({state}) {e}")
                continue
            status = result.status
            if status == TaskResultStatus.SUCCESSFUL:
                outcome = f"returned {result.return_value!r}"
            elif state == JobState.CANCELLED:
                outcome = "cancelled (reported as FAILED with django_dispatch.JobCancelled)"
            elif status == TaskResultStatus.FAILED:
                last = errors[-1] if errors else None
                outcome = (
                    f"{last['exception_class_path']}: {last['message']}"
                    if last
                    else result.errors[-1].exception_class_path
                )
            elif state == "blocked":
                waiting += 1
                outcome = "waiting behind an earlier job of its partition"
            elif status == TaskResultStatus.READY and run_after > now:
                waiting += 1
                outcome = f"waiting to run at {run_after:%Y-%m-%d %H:%M:%S %Z}"
            elif status == TaskResultStatus.READY:
                waiting += 1
                outcome = "due now, waiting for a worker"
            else:
                outcome = "running"
            if errors and status == TaskResultStatus.SUCCESSFUL:
                outcome += f" (after {len(errors)} failed attempt(s))"
            self.stdout.write(
                f"#{job_id:<5} {result.task.name:<22} {status:<11} {result.attempts:<9} {outcome}"
            )

        self.stdout.write("")
        self.stdout.write(f"Side effects (shop.Delivery rows, {Delivery.objects.count()} in all):")
        for delivery in Delivery.objects.order_by("-id")[:20][::-1]:
            job = f" job #{delivery.job_id}" if delivery.job_id else ""
            self.stdout.write(
                f"  {delivery.task:<22} attempt {delivery.attempt}{job}: {delivery.detail}"
            )
        if waiting:
            self.stdout.write("")
            self.stdout.write(
                f"{waiting} job(s) not run yet; `python manage.py rundispatch` "
                "(without --burst) runs them when they are due."
            )
