"""System checks of ``OPTIONS["DATABASE"]``: E080, E081, E082 (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import override_settings

from django_dispatch import store
from django_dispatch.checks import check_alias_databases, check_alias_tables

from .conftest import BACKEND, EU_DB, two_databases


def _aliases(**databases: object) -> dict:
    """``default`` plus one alias per keyword: its DATABASE, namespace = its name."""
    found = {"default": settings.TASKS["default"]}
    for alias, database in databases.items():
        found[alias] = {
            "BACKEND": BACKEND,
            "QUEUES": [],
            "OPTIONS": {"NAMESPACE": alias, "DATABASE": database},
        }
    return found


def _ids(**databases: object) -> list[tuple[str, str]]:
    with override_settings(TASKS=_aliases(**databases)):
        return [(m.id, m.msg) for m in check_alias_databases()]


def test_a_database_that_databases_lacks_is_an_error_naming_the_alias_and_the_choices():
    [(check_id, message)] = _ids(eu="jobs_nowhere")
    assert check_id == "django_dispatch.E080"
    assert "TASKS['eu']['OPTIONS']['DATABASE'] is 'jobs_nowhere'" in message
    assert "'default'" in message  # what DATABASES has
    [(check_id, message)] = _ids(eu=7)
    assert check_id == "django_dispatch.E080" and "got 7" in message
    assert _ids(eu="default") == []


class RefuseDispatchOnDefault:
    """A router keeping django_dispatch's tables off ``default``."""

    def allow_migrate(self, db, app_label, **hints):
        if app_label == "django_dispatch" and db == "default":
            return False
        return None


def test_a_database_the_routers_keep_the_tables_off_is_an_error():
    router = f"{__name__}.RefuseDispatchOnDefault"
    with override_settings(DATABASE_ROUTERS=[router]):
        [(check_id, message)] = _ids(eu="default")
    assert check_id == "django_dispatch.E081"
    assert "do not allow django_dispatch's migrations" in message


def test_aliases_sharing_a_namespace_on_one_database_pass():
    tasks = _aliases(eu="default")
    tasks["eu2"] = {**tasks["eu"], "OPTIONS": {"NAMESPACE": "eu"}}  # routed: default too
    with override_settings(TASKS=tasks):
        assert check_alias_databases() == []


@two_databases
def test_aliases_sharing_a_namespace_across_databases_is_an_error():
    tasks = _aliases(eu=EU_DB)
    tasks["eu2"] = {**tasks["eu"], "OPTIONS": {"NAMESPACE": "eu"}}  # the default database
    with override_settings(TASKS=tasks):
        [message] = check_alias_databases()
    assert message.id == "django_dispatch.E082"
    assert "'eu2' on 'default'" in message.msg and f"'eu' on '{EU_DB}'" in message.msg


@two_databases
@pytest.mark.django_db(databases=["default", EU_DB])
def test_the_tables_check_runs_only_with_the_databases_it_may_query():
    with override_settings(TASKS=_aliases(eu=EU_DB)):
        assert check_alias_tables(databases=None) == []
        assert check_alias_tables(databases=["default", EU_DB]) == []  # migrated by the tests


@two_databases
@pytest.mark.slow
@pytest.mark.django_db(transaction=True, databases=["default", EU_DB])
def test_missing_tables_on_the_alias_database_are_reported_and_stop_its_worker():
    from django.core.management import CommandError, call_command

    with override_settings(TASKS=_aliases(eu=EU_DB)):
        call_command("migrate", "django_dispatch", "zero", database=EU_DB, verbosity=0)
        try:
            [message] = check_alias_tables(databases=[EU_DB])
            assert message.id == "django_dispatch.W083"
            assert f"migrate --database {EU_DB}" in message.hint
            assert check_alias_tables(databases=["default"]) == []  # may not query jobs_eu
            with pytest.raises(CommandError, match=f"not applied on database '{EU_DB}'"):
                call_command("rundispatch", "--backend", "eu", "--burst")
            assert store.db_alias() == "default"  # the command gave the process back
        finally:
            call_command("migrate", "django_dispatch", database=EU_DB, verbosity=0)
        assert check_alias_tables(databases=[EU_DB]) == []
