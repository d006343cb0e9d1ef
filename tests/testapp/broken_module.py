"""A task module that fails at import (not with ImportError): a misconfiguration."""

import os

from django_dispatch.compat import task

SETTING = os.environ["DISPATCH_TEST_SETTING_THAT_DOES_NOT_EXIST"]


@task()
def never():
    return SETTING
