"""The workflow admins' actions: one operator service call per selected row.

Rows are read-only in the admin. Cancel, retry (unpark) and skip call
``django_dispatch.workflows.services``, which check the state they act on;
the admin reports what changed and what was left alone because it no longer
fitted (a run that finished meanwhile, a step already done).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django.contrib import messages
from django.http import HttpRequest

from ..exceptions import ActionNotAllowed
from ..workflows import services
from .common import ReadOnlyRows, SQLiteWriteLockFirst, has_perm, id_list
from .history import record


def apply_each[T](items: Iterable[T], act: Callable[[T], bool]) -> tuple[list[T], list[T]]:
    """Apply an operator service to each selected item: (changed, left as they were).

    Each item is its own service call, so one that no longer fits (finished
    meanwhile, or refused by the service with ``ActionNotAllowed``, which
    wrote nothing) never stops the others; it is listed in the report instead.
    """
    done: list[T] = []
    skipped: list[T] = []
    for item in items:
        try:
            changed = act(item)
        except ActionNotAllowed:
            changed = False
        (done if changed else skipped).append(item)
    return done, skipped


def skip_current_step(run_id: int) -> bool:
    """A stuck run: its failed steps; a running one: its first unfinished step."""
    names = services.stuck_steps(run_id) or services.current_steps(run_id)[:1]
    return bool([name for name in names if services.skip_step(run_id, name)])


class OperatorActions(SQLiteWriteLockFirst, ReadOnlyRows):
    """Permission hooks (used by ``@admin.action``) and the report shared by both workflow admins.

    Actions run from a change page write inside its transaction: on SQLite
    it starts as the writer (``SQLiteWriteLockFirst``).
    """

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return has_perm(request, "cancel_workflowrun")

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return has_perm(request, "retry_workflowrun")

    def report(
        self, request: HttpRequest, done: list[Any], verb: str, skipped: list[int], why: str
    ) -> None:
        """One message: how many changed, then which were left alone and why.

        ``why`` is formatted with ``n`` (how many were left alone) and ``ids``.
        A warning unless something changed and nothing was left alone.
        """
        # Each change goes into the admin history; step rows come as tuples, pk first.
        pks = (d[0] if isinstance(d, tuple) else d for d in done)
        record(request, self.model, ((pk, f"#{pk}") for pk in pks), f"{verb} (admin action).")  # type: ignore[attr-defined]
        text = f"{len(done)} {verb}"
        if skipped:
            text += why.format(n=len(skipped), ids=id_list(skipped))
        level = messages.SUCCESS if done and not skipped else messages.WARNING
        self.message_user(request, text + ".", level)  # type: ignore[attr-defined]


#: Why a run action left a run alone.
RUN_NOT_FITTING = ", {n} skipped ({ids}: not in a state this fits)"
