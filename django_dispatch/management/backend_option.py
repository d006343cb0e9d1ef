"""``--backend ALIAS``, shared by the commands that serve or inspect one namespace."""

from __future__ import annotations

from django.core.management.base import CommandError, CommandParser

from ..tasks.registry import namespace_for


def add_backend_argument(parser: CommandParser, what: str) -> None:
    parser.add_argument(
        "--backend",
        default="default",
        help=f"TASKS alias whose OPTIONS['NAMESPACE'] {what} (default: default).",
    )


def backend_namespace(alias: str) -> str:
    """``--backend ALIAS``'s namespace; an alias that is not a DispatchBackend is a
    CommandError naming those that are."""
    try:
        return namespace_for(alias)
    except ValueError as e:
        raise CommandError(f"--backend {alias!r}: {e} Pass one of those.") from e
