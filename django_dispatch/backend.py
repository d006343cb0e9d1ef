"""The ``django.tasks`` backend: Django's Tasks API over the job table.

This module is the adapter Django calls (``TASKS[...]["BACKEND"]`` names
``django_dispatch.backend.DispatchBackend``): enqueue one job, read a result
back, check the configuration. Nothing in the package imports it except the
management commands; the layers below use ``tasks.registry.DispatchBackendBase``
and the rest of ``tasks``.

``DispatchBackend.__init__`` touches no model and no database: Django builds
backends lazily, per thread, and may do so before migrations have run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.apps import apps
from django.core import checks

from . import store
from .compat import Task, TaskResult, TaskResultDoesNotExist, task_enqueued
from .conf import did_you_mean
from .core.docs_links import docs_url
from .models import Job
from .observability import metrics, tracing
from .tasks import call_context
from .tasks.plan import EnqueuePlan
from .tasks.registry import DispatchBackendBase
from .tasks.results import result_from_job, send_robust
from .tasks.task import DispatchTask

__all__ = ["DispatchBackend", "DispatchTask"]

KNOWN_OPTIONS = {"MAX_ATTEMPTS", "BACKOFF", "NAMESPACE", "DATABASE"}


class DispatchBackend(DispatchBackendBase):
    """Durable jobs in the database, run by ``manage.py rundispatch``."""

    task_class = DispatchTask
    supports_defer = True
    supports_priority = True
    supports_get_result = True
    supports_async_task = True

    def enqueue(self, task: Task, args: Sequence[Any], kwargs: Mapping[str, Any]) -> TaskResult:
        """Insert one job in the caller's transaction and return its TaskResult.

        With an idempotency key held by a live job of the same task, nothing
        is inserted and that job's TaskResult is returned instead.
        """
        plan = self.enqueue_plan(task)
        # This alias's database, whatever database the caller's code runs on
        # (a task of another alias enqueueing this one's job).
        with store.using_backend(self.alias):
            if tracing.AVAILABLE and tracing.active():  # a producer span, its context on the job
                with tracing.producer(plan.spec.task_path, plan.spec.queue_name) as producer:
                    result = self._enqueue(task, plan, args, kwargs, producer.context)
                    producer.enqueued(result.id)
                    return result
            return self._enqueue(task, plan, args, kwargs, None)

    def _enqueue(
        self,
        task: Task,
        plan: EnqueuePlan,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        trace_context: str | None,
    ) -> TaskResult:
        result, inserted = plan.insert_one(
            args,
            kwargs,
            alias=self.alias,
            trace_context=trace_context,
            call_context=call_context.for_call(task),
        )
        if inserted:
            if metrics.AVAILABLE:
                metrics.enqueued(plan.spec.task_path, plan.spec.queue_name)
            send_robust(task_enqueued, self, result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        try:
            pk = int(result_id)
        except (TypeError, ValueError):
            raise TaskResultDoesNotExist(result_id) from None
        job = Job.objects.using(store.read_database_for(self.alias)).filter(pk=pk).first()
        if job is None:
            raise TaskResultDoesNotExist(result_id)
        return result_from_job(job)

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        messages: list[checks.CheckMessage] = []
        if not apps.is_installed("django_dispatch"):
            messages.append(
                checks.Error(
                    f"TASKS[{self.alias!r}] uses DispatchBackend but django_dispatch is not "
                    "in INSTALLED_APPS.",
                    hint="Add 'django_dispatch' to INSTALLED_APPS and run migrate.",
                    id="django_dispatch.E001",
                )
            )
        see = f"See {docs_url('settings', 'tasks')}"
        messages += [
            checks.Error(problem, hint=see, id="django_dispatch.E005")
            for problem in self.unlisted_queues()
        ]
        messages += [
            checks.Error(
                f"TASKS[{self.alias!r}]['OPTIONS'] has an unknown key {key!r}."
                f"{did_you_mean(key, KNOWN_OPTIONS)}",
                hint=f"Known options: {sorted(KNOWN_OPTIONS)}. {see}",
                id="django_dispatch.E002",
            )
            for key in sorted(set(self.options) - KNOWN_OPTIONS, key=str)
        ]
        max_attempts = self.default_max_attempts
        if not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1:
            messages.append(
                checks.Error(
                    f"TASKS[{self.alias!r}]['OPTIONS']['MAX_ATTEMPTS'] must be a whole number "
                    f"of at least 1, got {max_attempts!r}.",
                    hint=see,
                    id="django_dispatch.E003",
                )
            )
        try:
            backoff_ok = callable(self.default_backoff)
        except ImportError:
            backoff_ok = False
        if not backoff_ok:
            messages.append(
                checks.Error(
                    f"TASKS[{self.alias!r}]['OPTIONS']['BACKOFF'] must be a function or the "
                    f"import path of one, got {self._backoff_setting!r}.",
                    hint=see,
                    id="django_dispatch.E004",
                )
            )
        return messages
