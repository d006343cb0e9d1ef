"""``DISPATCH["READ_DATABASE"]`` and ``READ_MAX_LAG``: what is refused, and which replica
each jobs' database gets. Reading from a real replica is the ``replica`` tier's
(tests/replica/)."""

from __future__ import annotations

import copy

import pytest
from django.conf import settings
from django.test import override_settings

from django_dispatch.checks import check_dispatch_settings, check_read_database
from django_dispatch.queries import reading

#: The checks read DATABASES only; no connection is made to the overridden entries.
pytestmark = pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")


def dispatch(**values: object) -> dict[str, object]:
    return {**settings.DISPATCH, **values}


def with_replica(engine: str | None = None) -> dict[str, dict[str, object]]:
    """DATABASES with a "replica" entry (same engine as default unless ``engine``)."""
    databases = copy.deepcopy(settings.DATABASES)
    databases["replica"] = {**databases["default"], "TEST": {"MIRROR": "default"}}
    if engine:
        databases["replica"]["ENGINE"] = engine
    return databases


def ids(messages) -> list[str]:
    return [m.id for m in messages]


@pytest.mark.parametrize("value", [3, ["replica"], {"default": 1}, {"": "replica"}, None])
def test_a_read_database_of_the_wrong_type_is_refused(value):
    with override_settings(DISPATCH=dispatch(READ_DATABASE=value)):
        messages = check_dispatch_settings()
    assert any("DISPATCH['READ_DATABASE'] must be a DATABASES alias" in m.msg for m in messages)


@pytest.mark.parametrize("value", [0, -1.0, "30"])
def test_read_max_lag_must_be_a_positive_number(value):
    with override_settings(DISPATCH=dispatch(READ_MAX_LAG=value)):
        messages = check_dispatch_settings()
    assert any("DISPATCH['READ_MAX_LAG']" in m.msg for m in messages)


def test_a_replica_missing_from_databases_is_an_error_naming_the_known_ones():
    with override_settings(DISPATCH=dispatch(READ_DATABASE="replcia")):
        (message,) = check_read_database()
    assert message.id == "django_dispatch.E071"
    assert "'replcia', which is not in DATABASES (" in message.msg
    assert "'default'" in message.msg  # the postgres tier also has the shard tests' jobs_eu
    assert "MIRROR" in message.hint


def test_a_dict_keyed_by_an_unknown_database_is_an_error():
    with override_settings(
        DATABASES=with_replica(), DISPATCH=dispatch(READ_DATABASE={"jobs_nowhere": "replica"})
    ):
        assert ids(check_read_database()) == ["django_dispatch.E070"]


def test_a_replica_of_another_engine_is_an_error():
    other = "django.db.backends.mysql"
    with override_settings(
        DATABASES=with_replica(other), DISPATCH=dispatch(READ_DATABASE="replica")
    ):
        (message,) = check_read_database()
    assert message.id == "django_dispatch.E072" and "engines differ" in message.msg


def test_a_valid_replica_and_no_replica_pass_the_check():
    with override_settings(DATABASES=with_replica(), DISPATCH=dispatch(READ_DATABASE="replica")):
        assert check_read_database() == []
    with override_settings(DISPATCH=dispatch(READ_DATABASE="")):
        assert check_read_database() == []


def test_a_string_is_the_default_databases_replica_and_a_dict_names_one_per_database():
    with override_settings(DISPATCH=dispatch(READ_DATABASE="replica")):
        assert reading.replica_of("default") == "replica"
        assert reading.replica_of("jobs_eu") is None  # an alias's own database: none
    with override_settings(DISPATCH=dispatch(READ_DATABASE={"jobs_eu": "eu_replica"})):
        assert reading.replica_of("jobs_eu") == "eu_replica"
        assert reading.replica_of("default") is None
    with override_settings(DISPATCH=dispatch(READ_DATABASE="default")):
        assert reading.replica_of("default") is None  # itself: no replica


def test_without_a_replica_reads_go_to_the_primary_without_a_probe():
    verdict = reading.health()
    assert (verdict.state, verdict.used, verdict.replica, verdict.fallback) == (
        "none",
        "default",
        None,
        False,
    )
    assert reading.read_alias() == "default"
