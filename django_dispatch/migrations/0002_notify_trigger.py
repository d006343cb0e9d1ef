"""On PostgreSQL, NOTIFY idle workers whenever jobs are inserted.

A statement-level trigger: one notification per INSERT statement (a bulk
enqueue of 10,000 rows sends one), delivered at commit, so a worker is never
woken for a job it cannot see yet, and enqueue costs no extra round trip.
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION django_dispatch_notify() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('django_dispatch', '');
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER django_dispatch_job_notify
    AFTER INSERT ON django_dispatch_job
    FOR EACH STATEMENT EXECUTE FUNCTION django_dispatch_notify();
"""
DROP = """
DROP TRIGGER IF EXISTS django_dispatch_job_notify ON django_dispatch_job;
DROP FUNCTION IF EXISTS django_dispatch_notify();
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("django_dispatch", "0001_initial")]
    operations = [migrations.RunPython(create, drop)]
