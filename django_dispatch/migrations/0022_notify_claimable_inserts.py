"""The insert trigger wakes idle workers only for jobs they can claim.

A worker woken by a NOTIFY runs a claim. An inserted job that is
``scheduled`` (deferred to later) cannot be claimed before it is due, so the
claim it caused was wasted, in every idle worker of the namespace at once.
It wakes the workers when it becomes claimable: the stager NOTIFYs when it
stages due jobs. (A keyed job is inserted ``pending`` and demoted by the
claim if it waits behind its key, so its insert still wakes them.)

Locks: replacing the trigger takes a SHARE ROW EXCLUSIVE lock on the job
table for an instant; enqueues wait for it, claims do not.
"""

from django.db import migrations

NOTIFY_CLAIMABLE = """
DROP TRIGGER IF EXISTS django_dispatch_job_notify ON django_dispatch_job;
CREATE OR REPLACE FUNCTION django_dispatch_notify() RETURNS trigger AS $$
DECLARE
    ns text;
BEGIN
    FOR ns IN SELECT DISTINCT namespace FROM new_rows WHERE state = 'pending' LOOP
        PERFORM pg_notify(
            CASE WHEN ns = '' THEN 'django_dispatch'
                 ELSE 'django_dispatch_' || left(md5(ns), 16) END,
            ''
        );
    END LOOP;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER django_dispatch_job_notify
    AFTER INSERT ON django_dispatch_job
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION django_dispatch_notify();
"""

NOTIFY_EVERY_INSERT = NOTIFY_CLAIMABLE.replace(" WHERE state = 'pending'", "")


def notify_claimable(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(NOTIFY_CLAIMABLE)


def notify_every_insert(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(NOTIFY_EVERY_INSERT)


class Migration(migrations.Migration):
    dependencies = [("django_dispatch", "0021_scheduled_state")]

    operations = [migrations.RunPython(notify_claimable, notify_every_insert)]
