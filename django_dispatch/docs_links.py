"""Temporary alias of ``core.docs_links`` while importers move (the same module object)."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("django_dispatch.core.docs_links")
