"""Django's own contract: the same calls against Django's backends and ours, compared.

Each case is run through Django's ``ImmediateBackend`` (and ``DummyBackend``,
which accepts ``run_after``) and through ``DispatchBackend``; the outcomes
must match: the arguments as normalized at enqueue, what the task receives
and returns once it runs (ours through the real worker path, ``drain()``),
and for a bad call an exception that every ``except`` clause written for
Django's backends catches, with nothing written.

Where we differ on purpose, the difference is listed in ``DIFFERENCES`` and
asserted as such, so that it cannot change unnoticed. It runs on every
supported Django (``make test-matrix``): 5.2 with the django-tasks backport,
6.0 and 6.1.
"""

from __future__ import annotations

import math
from collections import deque
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from types import MappingProxyType
from typing import Any

import django
import pytest

from django_dispatch import enqueue_many
from django_dispatch import task as dispatch_task
from django_dispatch.compat import (
    TASK_DECORATOR_TAKES_OPTIONS,
    TASKS_MODULE,
    DummyBackend,
    ImmediateBackend,
    InvalidTask,
    Task,
    TaskResultStatus,
    task,
)
from django_dispatch.exceptions import InvalidTaskArguments, InvalidTaskArgumentValue
from django_dispatch.models import Job
from django_dispatch.tasks.task import DispatchTask
from django_dispatch.testing import drain

QUEUES = ["default", "emails"]


@dispatch_task()
def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """What the task received, as its return value."""
    return {"args": list(args), "kwargs": kwargs}


@dispatch_task()
def give_back(kind: str) -> Any:
    """A return value of the given kind, JSON or not."""
    return {
        "tuple": (1, (2, [3])),
        "utf8 bytes": "café ☃".encode(),
        "non-UTF-8 bytes": b"\xff\xfe",
        "set": {1, 2},
        "object": object(),
        "nan": math.nan,
    }[kind]


def takes_two(a: int, b: int) -> int:
    return a + b


def _path(backend_class: type) -> str:
    return f"{backend_class.__module__}.{backend_class.__qualname__}"


@pytest.fixture
def backends(settings):
    """Django's ImmediateBackend and DummyBackend next to ours, with the same QUEUES."""
    settings.TASKS = {
        **settings.TASKS,
        "immediate": {"BACKEND": _path(ImmediateBackend), "QUEUES": QUEUES},
        "dummy": {"BACKEND": _path(DummyBackend), "QUEUES": QUEUES},
        "dispatch_queues": {
            "BACKEND": "django_dispatch.backend.DispatchBackend",
            "QUEUES": QUEUES,
        },
    }


def django_task(func_task: Task, alias: str = "immediate", **changes: Any) -> Task:
    """A plain ``Task`` (Django's class) of the same function on Django's backend ``alias``."""
    fields = {"priority": 0, "queue_name": "default", "run_after": None, "takes_context": False}
    return Task(func=func_task.func, backend=alias, **{**fields, **changes})


def attempt(call: Any) -> tuple[Any, BaseException | None]:
    try:
        return call(), None
    except Exception as e:
        return None, e


def assert_catches_alike(ours: BaseException | None, theirs: BaseException | None) -> None:
    """Every ``except`` clause for Django's built-in exception catches ours too."""
    assert theirs is not None, "Django accepted the call"
    assert ours is not None, f"we accepted what Django refused with {theirs!r}"
    for cls in (TypeError, ValueError, InvalidTask):
        if isinstance(theirs, cls):
            assert isinstance(ours, cls), f"{ours!r} is not a {cls.__name__} like {theirs!r}"


# --- arguments -------------------------------------------------------------------------

#: (args, kwargs) that both accept, normalized the same way.
GOOD_CALLS: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    "plain JSON": ((1, "a", 2.5, True, None, -7), {"x": [1, 2], "y": {"z": "w"}}),
    "tuples": (((1, 2), (3, (4, 5))), {"t": (6,)}),
    "nested": (([{"a": [{"b": (1, [2, {"c": None}])}]}],), {"deep": {"er": {"est": [[[]]]}}}),
    "UTF-8 bytes": ((b"hello", "café".encode()), {"k": b"v"}),
    "bytes nested and as keys": (({"a": [b"x", (b"y",)]},), {"d": {b"key": b"value"}}),
    "other sequences and mappings": ((range(3), deque([1, 2]), MappingProxyType({"a": 1})), {}),
    "unicode text": (("é", "☃", "😀", ""), {"ü": "ß"}),
    "keyword arguments only": ((), {"a": 1, "b": [1, (2,)], "c": None}),
    "no arguments": ((), {}),
    # Not 1e300: PostgreSQL's jsonb gives a whole float with a big exponent back as
    # an int (numeric without a decimal point), on any backend storing it in jsonb.
    "big and small numbers": ((2**62, -(2**62), 123456.789, 5e-324, 0.1, -0.0), {}),
}

#: (args, kwargs) that Django's backends refuse (``normalize_json``).
BAD_CALLS: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    "non-UTF-8 bytes": ((b"\xff\xfe",), {}),
    "non-UTF-8 bytes nested in kwargs": ((), {"d": [b"ok", b"\x80"]}),
    "an object": ((object(),), {}),
    "a set": (({1, 2},), {}),
    "a datetime": ((datetime(2024, 1, 1, tzinfo=UTC),), {}),
    "a Decimal": ((Decimal("1.5"),), {}),
    "a complex number": ((1j,), {}),
    "an object in kwargs": ((), {"when": datetime(2024, 1, 1, tzinfo=UTC)}),
    "an object nested": (([{"a": {1, 2}}],), {}),
}


@pytest.mark.django_db(transaction=True)
def test_good_arguments_are_normalized_received_and_returned_alike(backends):
    """Same normalized args at enqueue, same values received and returned once run."""
    ours = {name: echo.enqueue(*args, **kwargs) for name, (args, kwargs) in GOOD_CALLS.items()}
    assert drain() == len(GOOD_CALLS)
    for name, (args, kwargs) in GOOD_CALLS.items():
        theirs = django_task(echo).enqueue(*args, **kwargs)
        assert theirs.status == TaskResultStatus.SUCCESSFUL, name
        mine = ours[name]
        assert (mine.args, mine.kwargs) == (theirs.args, theirs.kwargs), name
        done = echo.get_result(mine.id)
        assert done.status == TaskResultStatus.SUCCESSFUL, (name, done.errors)
        assert done.return_value == theirs.return_value, name
        assert done.return_value == {"args": theirs.args, "kwargs": theirs.kwargs}, name


@pytest.mark.django_db
@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_bad_arguments_raise_what_django_raises_and_write_nothing(backends, name):
    args, kwargs = BAD_CALLS[name]
    _, theirs = attempt(lambda: django_task(echo).enqueue(*args, **kwargs))
    _, ours = attempt(lambda: echo.enqueue(*args, **kwargs))
    assert_catches_alike(ours, theirs)
    assert isinstance(ours, InvalidTaskArguments)
    _, ours_many = attempt(
        lambda: enqueue_many(echo, [((1,), {}), (args, kwargs)], return_results=True)
    )
    assert_catches_alike(ours_many, theirs)
    assert "call #1" in str(ours_many)
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_enqueue_many_normalizes_like_enqueue(backends):
    results = enqueue_many(echo, list(GOOD_CALLS.values()), return_results=True)
    for result, (name, (args, kwargs)) in zip(results, GOOD_CALLS.items(), strict=True):
        theirs = django_task(echo).enqueue(*args, **kwargs)
        assert (result.args, result.kwargs) == (theirs.args, theirs.kwargs), name


@pytest.mark.django_db
def test_errors_say_what_was_wrong():
    with pytest.raises(InvalidTaskArgumentValue, match=r"not UTF-8 text.*base64"):
        echo.enqueue(b"\xff")
    with pytest.raises(InvalidTaskArguments, match=r"JSON-serializable.*set"):
        echo.enqueue({1})


# --- return values ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["tuple", "utf8 bytes", "non-UTF-8 bytes", "set", "object"])
def test_return_values_are_normalized_or_fail_alike(backends, kind):
    theirs = django_task(give_back).enqueue(kind)
    mine = give_back.enqueue(kind)
    assert drain() == 1
    mine = give_back.get_result(mine.id)
    assert mine.status == theirs.status, mine.errors
    if theirs.status == TaskResultStatus.SUCCESSFUL:
        assert mine.return_value == theirs.return_value
    else:
        theirs_class = theirs.errors[-1].exception_class
        ours_class = mine.errors[-1].exception_class
        for cls in (TypeError, ValueError):
            if issubclass(theirs_class, cls):
                assert issubclass(ours_class, cls), (ours_class, theirs_class)


# --- where we differ on purpose --------------------------------------------------------

#: Calls Django's in-process backends accept and we refuse or change, and why.
DIFFERENCES = {
    # Not JSON, and not storable in a JSON column (PostgreSQL refuses it): refused at
    # enqueue with a ValueError (json's own error for it), not failed later.
    "NaN": ((math.nan,), {}),
    "infinity": ((), {"x": [-math.inf]}),
    # A call that cannot bind fails at run time on Django's backends (TypeError in
    # the task); we refuse it at enqueue with a TypeError, before anything is stored.
    "arguments that do not fit the function": ((1, 2, 3), {"nope": 1}),
}


@pytest.mark.django_db
def test_nan_and_infinity_are_refused_at_enqueue_as_a_value_error(backends):
    for name in ("NaN", "infinity"):
        args, kwargs = DIFFERENCES[name]
        theirs = django_task(echo).enqueue(*args, **kwargs)  # accepted as is
        assert theirs.status == TaskResultStatus.SUCCESSFUL
        with pytest.raises(InvalidTaskArgumentValue, match="Out of range float") as raised:
            echo.enqueue(*args, **kwargs)
        assert isinstance(raised.value, ValueError) and isinstance(raised.value, TypeError)
    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_nan_returned_fails_the_job_as_a_value_error(backends):
    theirs = django_task(give_back).enqueue("nan")
    assert theirs.status == TaskResultStatus.SUCCESSFUL  # Django keeps NaN in memory
    mine = give_back.enqueue("nan")
    drain()
    mine = give_back.get_result(mine.id)
    assert mine.status == TaskResultStatus.FAILED
    assert issubclass(mine.errors[-1].exception_class, ValueError)


@pytest.mark.django_db
def test_arguments_that_do_not_bind_are_refused_at_enqueue(backends, settings):
    args, kwargs = DIFFERENCES["arguments that do not fit the function"]
    plain = dispatch_task()(takes_two)
    theirs = django_task(plain).enqueue(*args, **kwargs)
    assert theirs.status == TaskResultStatus.FAILED
    assert theirs.errors[-1].exception_class is TypeError
    with pytest.raises(TypeError) as raised:
        plain.enqueue(*args, **kwargs)
    assert isinstance(raised.value, InvalidTaskArguments)
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_mapping_keys_become_strings_as_in_json(backends):
    """Django keeps a non-string key in memory; stored as JSON, it is a string."""
    keyed = {1: "a", 2.5: "b", False: "c", None: "d"}
    theirs = django_task(echo).enqueue(keyed)
    mine = echo.enqueue(keyed)
    assert theirs.args == [keyed]
    assert mine.args == [{"1": "a", "2.5": "b", "false": "c", "null": "d"}]
    assert echo.get_result(mine.id).args == mine.args


# --- options: priority, queue, run_after ------------------------------------------------

AWARE = datetime(2030, 1, 1, tzinfo=UTC)

#: ``Task.using()`` changes both must accept or refuse alike (with Django's message).
OPTION_CASES: dict[str, dict[str, Any]] = {
    "priority at the top": {"priority": 100},
    "priority at the bottom": {"priority": -100},
    "priority above the range": {"priority": 101},
    "priority below the range": {"priority": -101},
    "priority not whole": {"priority": 1.5},
    "a queue in QUEUES": {"queue_name": "emails"},
    "a queue not in QUEUES": {"queue_name": "nope"},
    "run_after aware": {"run_after": AWARE},
    "run_after in the past": {"run_after": AWARE - timedelta(days=3650)},
    "run_after naive": {"run_after": datetime(2030, 1, 1)},
}


@pytest.mark.django_db
@pytest.mark.parametrize("name", list(OPTION_CASES))
def test_options_are_validated_alike(backends, name):
    changes = OPTION_CASES[name]
    # DummyBackend: Django's backend that accepts run_after (ImmediateBackend does not).
    _, theirs = attempt(lambda: django_task(echo, "dummy").using(**changes).enqueue(1))
    ours_task = echo.using(backend="dispatch_queues")
    _, ours = attempt(lambda: ours_task.using(**changes).enqueue(1))
    if theirs is None:
        assert ours is None, ours
    elif name == "a queue not in QUEUES":
        # Refused alike, with a message that names the task, the alias and the
        # queues it accepts instead of Django's "Queue 'nope' is not valid for backend."
        assert type(ours) is type(theirs) is InvalidTask
        assert str(ours).startswith(
            f"Task {echo.module_path} uses queue 'nope', which "
            f"TASKS['dispatch_queues']['QUEUES'] does not list (it accepts {sorted(QUEUES)})."
        )
        assert not Job.objects.exists()
    else:
        assert type(ours) is type(theirs) is InvalidTask
        assert str(ours) == str(theirs)
        assert not Job.objects.exists()


@pytest.mark.django_db
def test_task_definitions_are_validated_alike(backends):
    def local():  # not at module level
        pass

    def no_context(x):
        pass

    for alias in ("immediate", "default"):
        cls = Task if alias == "immediate" else DispatchTask
        fields = {"priority": 0, "queue_name": "default", "run_after": None}
        with pytest.raises(InvalidTask, match="module level"):
            cls(func=local, backend=alias, **fields)
    with pytest.raises(InvalidTask, match="context"):
        dispatch_task(takes_context=True)(takes_two)
    with pytest.raises(InvalidTask, match="context"):
        task(takes_context=True, backend="immediate")(takes_two)


# --- the @task decorator and our options -----------------------------------------------


def test_tasks_decorator_passes_our_options_where_django_does():
    """Django 6.1 and the 5.2 backport pass them on; Django 6.0's ``task()`` refuses them."""
    expected = TASKS_MODULE == "django_tasks" or django.VERSION >= (6, 1)
    assert expected == TASK_DECORATOR_TAKES_OPTIONS
    if TASK_DECORATOR_TAKES_OPTIONS:
        defined = task(max_attempts=4, timeout=2)(takes_two)
        assert isinstance(defined, DispatchTask)
        assert (defined.max_attempts, defined.timeout) == (4, 2)
    else:
        with pytest.raises(TypeError, match="max_attempts"):
            task(max_attempts=4)(takes_two)
    # A plain @task works unchanged everywhere.
    assert isinstance(task(takes_two), DispatchTask)
    assert isinstance(task()(takes_two), DispatchTask)


def test_our_decorator_takes_our_options_on_every_version(settings):
    defined = dispatch_task(max_attempts=4, timeout=2, priority=5, queue_name="q")(takes_two)
    assert isinstance(defined, DispatchTask)
    assert (defined.max_attempts, defined.timeout, defined.priority) == (4, 2, 5)
    assert defined.queue_name == "q" and defined.backend == "default"
    assert dispatch_task(takes_two).max_attempts is None
    with pytest.raises(InvalidTask, match="max_attempts"):
        dispatch_task(max_attempts=0)(takes_two)
    with pytest.raises(TypeError, match="run_after"):
        dispatch_task(run_after=AWARE)(takes_two)
    settings.TASKS = {**settings.TASKS, "immediate": {"BACKEND": _path(ImmediateBackend)}}
    with pytest.raises(TypeError, match=r"\['max_attempts'\].*DispatchBackend"):
        dispatch_task(max_attempts=2, backend="immediate")(takes_two)
    assert type(dispatch_task(backend="immediate")(takes_two)) is Task
