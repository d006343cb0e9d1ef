"""The models and the migrations agree: a model change without its migration
would ship a schema that users' ``migrate`` never creates."""

from io import StringIO

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_every_model_change_has_its_migration() -> None:
    out = StringIO()
    try:
        call_command("makemigrations", "django_dispatch", "--check", "--dry-run", stdout=out)
    except SystemExit as exit:  # --check exits 1 when a migration is missing
        raise AssertionError(
            f"models and migrations differ; run makemigrations:\n{out.getvalue()}"
        ) from exit
