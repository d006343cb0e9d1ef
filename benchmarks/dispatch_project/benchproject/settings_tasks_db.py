"""The same project on django-tasks-db (run in its own venv).

Same tasks, same database settings; only the ``django.tasks`` backend and its
app change. The backend's options are its defaults.
"""

from .settings import *  # noqa: F403

INSTALLED_APPS = ["django_tasks_db", "bench"]
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]}}
