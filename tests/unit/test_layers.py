"""The package's shape, read from its source with ``ast``: layers, sizes, no circles.

The layers, bottom up (docs/architecture.md draws them)::

    core, compat, exceptions  <-  conf  <-  models  <-  store  <-  observability
        <-  tasks  <-  services, queries, runtime, workflows
        <-  the adapters and the public face (backend, admin, management,
            checks, templatetags, views, and the root modules)

Checked here, over every module of ``django_dispatch`` (migrations aside):

- every import points down or sideways, never up, and there is no import
  circle; both count imports made inside functions (they run later, but they
  are arrows all the same), not those under ``if TYPE_CHECKING:`` (they never
  run);
- ``core`` is pure: it imports only ``core``, ``compat`` and ``exceptions``;
- the store imports only ``store``, ``models``, ``core``, ``conf``, ``compat``
  and ``exceptions``;
- nothing under ``core``, ``store``, ``tasks``, ``runtime``, ``services`` or
  ``workflows`` imports ``django_dispatch.backend``, even for type checking;
- no module is over 400 lines (``core/cron.py``, the pure cron arithmetic,
  aside), and no function over 60 lines, its docstring not counted.

Importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` first; an arrow
from a module to a package enclosing it is dropped (the package is being
imported already), every other arrow to a package counts.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "django_dispatch"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
#: Longer than the limit on purpose: one cohesive piece of pure arithmetic.
LONG_MODULES = {f"{PACKAGE}.core.cron"}


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (migrations left out: Django's)."""
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if "migrations" in parts:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(name: str, *, type_checking: bool = False) -> set[str]:
    """The package modules that ``name`` imports, at any depth (inside functions too).

    ``type_checking``: count the imports under ``if TYPE_CHECKING:`` as well.
    """
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return _imported_by(ast.parse(path.read_text(), str(path)), package, type_checking) - {name}


def _imported_by(tree: ast.AST, package: str, type_checking: bool) -> set[str]:
    targets: set[str] = set()
    for node in _reachable(tree, type_checking):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(package, node)
            targets.add(module)
            targets.update(f"{module}.{alias.name}" for alias in node.names)  # a submodule?
    found = {t for t in targets if t in MODULES and t != PACKAGE}
    for target in list(found):
        parts = target.split(".")
        found.update(p for i in range(2, len(parts)) if (p := ".".join(parts[:i])) in MODULES)
    return found


def _reachable(tree: ast.AST, type_checking: bool):
    """Every node of ``tree``, less the bodies of ``if TYPE_CHECKING:`` (unless asked)."""
    for child in ast.iter_child_nodes(tree):
        if not type_checking and isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.orelse:
                yield stmt
                yield from _reachable(stmt, type_checking)
            continue
        yield child
        yield from _reachable(child, type_checking)


def _absolute(package: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _under(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _in(*parts: str) -> tuple[str, ...]:
    return tuple(f"{PACKAGE}.{p}" for p in parts)


def _graph() -> dict[str, set[str]]:
    """Each module's arrows, less those to a package enclosing it."""
    return {name: {t for t in _imports(name) if not name.startswith(t + ".")} for name in MODULES}


#: Each layer's rank: an import may point to its own rank or a lower one.
_RANKS = (
    (_in("core", "compat", "exceptions"), 0),
    (_in("conf"), 1),
    (_in("models"), 2),
    (_in("store"), 3),
    (_in("observability"), 4),
    (_in("tasks"), 5),
    (_in("services", "queries", "runtime", "workflows"), 6),
)
#: Public faces inside a layer's package: they sit with the adapters.
_FACES = _in("workflows.testing")


def _rank(name: str) -> int:
    if _under(name, *_FACES):
        return 7
    for prefixes, rank in _RANKS:
        if _under(name, *prefixes):
            return rank
    return 7  # the adapters and the root package's public face


# --- the tests -----------------------------------------------------------------------


def test_the_module_list_is_complete() -> None:
    """The checks below read what they claim to: every layer is there."""
    for name in (
        "backend",
        "core.states",
        "store.claim",
        "tasks.plan",
        "services.jobs",
        "queries.console",
        "runtime.producer",
        "workflows.engine",
    ):
        assert f"{PACKAGE}.{name}" in MODULES


def test_imports_point_down() -> None:
    upward = {
        name: sorted(t for t in targets if _rank(t) > _rank(name))
        for name, targets in _graph().items()
    }
    assert {k: v for k, v in upward.items() if v} == {}


def test_core_is_pure() -> None:
    allowed = _in("core", "compat", "exceptions")
    offenders = {
        name: sorted(t for t in _imports(name, type_checking=True) if not _under(t, *allowed))
        for name in MODULES
        if _under(name, f"{PACKAGE}.core")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_store_imports_only_what_is_below_it() -> None:
    allowed = _in("store", "models", "core", "conf", "compat", "exceptions")
    offenders = {
        name: sorted(t for t in _imports(name) if not _under(t, *allowed))
        for name in MODULES
        if _under(name, f"{PACKAGE}.store")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_nothing_below_the_adapters_imports_the_backend() -> None:
    below = _in("core", "store", "tasks", "runtime", "services", "workflows")
    offenders = {
        name: sorted(t for t in _imports(name, type_checking=True) if t == f"{PACKAGE}.backend")
        for name in MODULES
        if _under(name, *below)
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_no_import_cycle() -> None:
    assert _cycles(_graph()) == []


def test_no_module_is_too_long() -> None:
    long = {
        name: n
        for name, path in MODULES.items()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES and name not in LONG_MODULES
    }
    assert long == {}


def test_no_function_is_too_long() -> None:
    long = {
        f"{name}:{fn}": n
        for name, path in MODULES.items()
        for fn, n in _function_lengths(path.read_text())
        if n > MAX_FUNCTION_LINES
    }
    assert long == {}


def _function_lengths(source: str) -> list[tuple[str, int]]:
    """(name, lines) of every function and method, less its docstring's lines."""
    lengths = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            first = node.body[0]
            docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            if docstring and isinstance(first.value.value, str):  # type: ignore[attr-defined]
                lines -= (first.end_lineno or first.lineno) - first.lineno + 1
            lengths.append((node.name, lines))
    return lengths


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return components


# --- the checks can fail ---------------------------------------------------------------


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_imports_inside_functions_count_and_type_checking_ones_do_not() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from . import backend\n"
        "def f():\n"
        "    from .store import claim\n"
    )
    package = PACKAGE
    assert _imported_by(tree, package, False) == {f"{PACKAGE}.store", f"{PACKAGE}.store.claim"}
    assert f"{PACKAGE}.backend" in _imported_by(tree, package, True)


def test_function_lengths_leave_the_docstring_out() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(3))
    source = f'def f():\n    """One.\n\n    Three lines."""\n{body}\n'
    assert _function_lengths(source) == [("f", 4)]


def test_the_layer_ranks_order_the_layers() -> None:
    order = ["core.states", "conf", "models", "store.claim", "tasks.plan", "runtime.producer"]
    ranks = [_rank(f"{PACKAGE}.{name}") for name in order] + [_rank(f"{PACKAGE}.backend")]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)
