"""Temporary alias of ``store.sql`` while importers move (the same module object)."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("django_dispatch.store.sql")
