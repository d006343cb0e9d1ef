"""The wave's functions keep a generic plan for a server session, made at its
first call from the job table as it is then (migrations 0027, 0030, 0031).

A plan made on an empty table must still find the wave's rows through the
primary key: a session planned before a backlog arrived (a fresh database, a
``ctx.map`` set inserted after the workers started) otherwise scanned every
job row at every wave, for as long as the session lived.
"""

from __future__ import annotations

import re

import psycopg
import pytest
from django.db import connection

from tests.conftest import postgres_only

pytestmark = [pytest.mark.django_db, postgres_only]

#: Calls of the wave's functions with one id, on whatever the job table holds.
CALLS = [
    "SELECT won FROM django_dispatch_finish_wave(ARRAY[-1]::bigint[], ARRAY['w'],"
    " ARRAY[1]::bigint[], ARRAY['null']::jsonb[], NULL, NULL, NULL, NULL, NULL, NULL)",
    "SELECT django_dispatch_lease_wave(ARRAY[-1]::bigint[], 'w', 30, now())",
    "SELECT leased FROM django_dispatch_lease_runnable(ARRAY[-1]::bigint[],"
    " ARRAY[NULL]::text[], 'w', 30, now(), '')",
]
#: The ids as an index condition of the job table's scan (with or without the join's).
BY_ID = re.compile(r"Index Cond: \(.*id = ANY \(\$1\)")


@pytest.mark.parametrize("call", CALLS)
def test_a_wave_planned_on_an_empty_job_table_looks_its_rows_up_by_id(call):
    settings = connection.settings_dict
    params = {
        "dbname": settings["NAME"],
        "user": settings["USER"],
        "password": settings["PASSWORD"],
        "host": settings["HOST"],
        "port": settings["PORT"],
    }
    notices: list[str] = []
    # A session of its own: its first call plans the function afresh.
    with psycopg.connect(**{k: v for k, v in params.items() if v}, autocommit=True) as session:
        try:
            session.execute("LOAD 'auto_explain'")
        except psycopg.Error:
            pytest.skip("auto_explain cannot be loaded here")
        for setting in ("log_min_duration = 0", "log_nested_statements = on", "log_level = notice"):
            session.execute(f"SET auto_explain.{setting}")
        session.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        session.execute(call)
    updates = [n for n in notices if "UPDATE django_dispatch_job" in n and "Update on" in n]
    assert updates, notices
    assert all(BY_ID.search(plan) for plan in updates), updates
