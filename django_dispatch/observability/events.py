"""Transitional alias of ``observability.joblog``, kept until every importer uses that name."""

from .joblog import *  # noqa: F403
