"""The enqueue plan: what every enqueue of one task shares, and the one insert decision.

A plan is worked out once per task and backend (``registry``): the task
validated, the job columns it determines, its arity. Each call is then
encoded, measured and checked against it, and inserted by the store
function the plan picks (``insert_one``, ``insert_many``): one decision, made
from the plan's columns, for ``Task.enqueue()`` and ``enqueue_many`` alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import store
from ..compat import Task, TaskResult
from ..conf import size_limit
from ..core.encoding import JSON_DECODER, json_text
from ..core.limits import JSONTooLarge, check_size
from ..core.retry import Backoff
from ..observability.tracing import stored_context
from ..store.enqueue import job_insert_call, jobs_insert_calls
from ..store.flow import jobs_insert_limited
from ..store.types import CallChunk, JobSpec
from .call_context import CallContext
from .results import ready_result, result_from_job
from .task import check_arguments


@dataclass(frozen=True, slots=True)
class EnqueuePlan:
    """What every enqueue of one task on one backend shares, worked out once.

    ``task`` passed ``validate_task``; ``spec`` holds the job columns it
    determines; ``arity`` is ``plain_arity(task)``.
    """

    task: Task
    spec: JobSpec
    arity: int | None

    def check(self, args: list[Any], kwargs: dict[str, Any]) -> None:
        """``check_arguments``, skipped when the call cannot fail to bind."""
        if kwargs or self.arity is None or len(args) != self.arity:
            check_arguments(self.task, args, kwargs)

    def encode_call(
        self, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> tuple[list[Any], dict[str, Any], str, str]:
        """Validate one call: (args, kwargs) after the JSON round trip, and their JSON text.

        The arguments' size is measured on the text about to be stored (a
        ``len()``), before it is decoded: an oversized call costs no decode.
        """
        args_text = json_text(list(args), "Task arguments")
        kwargs_text = json_text(dict(kwargs), "Task keyword arguments")
        check_size(
            len(args_text) + len(kwargs_text),
            f"The arguments of {self.task.module_path}",
            "MAX_ARGS_BYTES",
            size_limit("MAX_ARGS_BYTES"),
        )
        json_args, json_kwargs = JSON_DECODER.decode(args_text), JSON_DECODER.decode(kwargs_text)
        self.check(json_args, json_kwargs)
        return json_args, json_kwargs, args_text, kwargs_text

    @property
    def plain(self) -> bool:
        """Whether its jobs take the plain raw INSERT: no idempotency key to look up,
        no concurrency group or partition to gate them at insert (see ``insert_one``)."""
        spec = self.spec
        return (
            spec.idempotency_key is None
            and spec.concurrency_key is None
            and not spec.partition_yield
        )

    def insert_one(
        self,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        *,
        alias: str,
        trace_context: str | None,
        call_context: CallContext | None = None,
    ) -> tuple[TaskResult, bool]:
        """Validate one call and insert its job in the caller's transaction.

        The one place that picks the store insert for a single enqueue: the
        plain raw INSERT, or the ORM path that honours an idempotency key
        (returning the live job that holds it) and gates limited jobs.
        Returns the TaskResult and whether a job was inserted.
        """
        json_args, json_kwargs, args_text, kwargs_text = self.encode_call(args, kwargs)
        db = store.db_alias()
        if self.plain:
            job_id, enqueued_at = job_insert_call(
                self.spec,
                json_args,
                json_kwargs,
                args_text,
                kwargs_text,
                db=db,
                trace_context=trace_context,
                call_context=call_context,
            )
            return ready_result(self.task, job_id, enqueued_at, json_args, json_kwargs, alias), True
        job = self.spec.new_job(json_args, json_kwargs, call_context)
        if trace_context is not None:
            job.trace_context = stored_context(trace_context)
        unique_for = getattr(self.task, "unique_for", None)
        job, created = store.job_insert_idempotent(job, db=db, unique_for=unique_for)
        if not created:
            return result_from_job(job), False
        return result_from_job(job, task=self.task), True

    def insert_many(
        self, chunks: list[CallChunk], call_context: CallContext | None = None
    ) -> tuple[list[int], list[Any]]:
        """Insert the encoded calls' jobs (``enqueue_many``); the same choice as ``insert_one``.

        ``call_context``: the batch's one call context, stored on every job.

        ``enqueue_many`` refuses idempotency keys, so the choice left is the
        plain raw INSERT or the gated ORM insert of limited jobs.
        """
        db = store.db_alias()
        if self.plain:
            return jobs_insert_calls(self.spec, chunks, db=db, call_context=call_context)
        return jobs_insert_limited(self.spec, chunks, db=db, call_context=call_context)


def no_retry_when_too_large(
    backoff: Backoff, exception: BaseException, task_result: TaskResult
) -> float | None:
    """``backoff``'s answer, except None (stop) for a value over its size limit.

    A checkpoint too big for ``DISPATCH["MAX_CHECKPOINT_BYTES"]`` (raised by
    ``context.progress()`` through the task), or a child job's arguments too
    big to enqueue, would be just as big on the next attempt: retrying only
    spends attempts. (A return value too big is failed without retry by the
    executor itself.)
    """
    if isinstance(exception, JSONTooLarge):
        return None
    return backoff(exception, task_result)
