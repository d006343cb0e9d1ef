"""The package's import arrows point down, read from its source with ``ast``.

The layers, bottom up::

    models  <-  store  <-  helpers (dispatch_task, encoding, results, enqueue, limits, ...)
            <-  runtime/, services, workflows/  <-  backend (the adapter Django calls),
                admin/, management/

Checked here:

(a) nothing in ``runtime/``, ``store/``, ``workflows/`` nor ``services.py``
    imports ``django_dispatch.backend`` (absolute or relative, at any depth:
    inside functions and under ``if TYPE_CHECKING:`` too);
(b) no import cycle among the package's modules. Only imports that run when
    a module is imported count: those at module level, outside ``if
    TYPE_CHECKING:``. Imports inside functions and ``TYPE_CHECKING`` blocks
    are left out, as Python's import machinery does (they run later, or
    never);
(c) ``store/`` imports nothing from ``runtime/``, ``services``,
    ``workflows/``, ``admin/``, ``backend`` nor ``management/`` (at any
    depth, as in (a)).

Importing ``django_dispatch`` (a package) also imports its ``__init__``, so
``from ..store import x`` is an arrow to ``django_dispatch.store`` and, for
a submodule ``x``, to ``django_dispatch.store.x`` as well.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "django_dispatch"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE


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


def _imports(name: str, *, runtime_only: bool) -> set[str]:
    """The package modules ``name`` imports.

    ``runtime_only``: only the imports that run at import time (see (b)).
    """
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    targets: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if runtime_only and isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
            ):
                continue
            if runtime_only and isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.orelse:
                    visit_one(stmt)
                continue
            visit_one(child)

    def visit_one(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                targets.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets.add(module)
            for alias in node.names:
                targets.add(f"{module}.{alias.name}")  # a submodule, if it is one
        visit(node)

    visit(tree)
    found = set()
    for target in targets:
        if target not in MODULES:
            continue
        found.add(target)
        # Importing a.b.c runs a/__init__ and a/b/__init__ first.
        parts = target.split(".")
        packages = (".".join(parts[:i]) for i in range(2, len(parts)))
        found.update(p for p in packages if p in MODULES)
    found.discard(name)
    return found


def _under(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_the_module_list_is_complete() -> None:
    """The checks below read what they claim to: every layer is there."""
    for name in ("backend", "services", "store", "runtime.executor", "workflows.engine"):
        assert f"{PACKAGE}.{name}" in MODULES


def test_nothing_below_the_adapter_imports_the_backend() -> None:
    below = [
        name
        for name in MODULES
        if _under(name, f"{PACKAGE}.runtime", f"{PACKAGE}.store", f"{PACKAGE}.workflows")
        or name == f"{PACKAGE}.services"
    ]
    offenders = {
        name: sorted(t for t in _imports(name, runtime_only=False) if t == f"{PACKAGE}.backend")
        for name in below
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_store_imports_nothing_above_it() -> None:
    above = tuple(
        f"{PACKAGE}.{n}"
        for n in ("runtime", "services", "workflows", "admin", "backend", "management")
    )
    offenders = {
        name: sorted(t for t in _imports(name, runtime_only=False) if _under(t, *above))
        for name in MODULES
        if _under(name, f"{PACKAGE}.store")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


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


def test_no_import_cycle() -> None:
    """A package ``__init__`` that imports its own submodules is not a cycle:
    the submodules' arrows back to their package are dropped (Python runs the
    ``__init__`` first, and a submodule importing names from its package's
    ``__init__`` that this ``__init__`` defines before importing it works).
    Every other arrow counts."""
    graph = {}
    for name in MODULES:
        targets = _imports(name, runtime_only=True)
        # Arrows to an enclosing package: that package is being (or was) imported first.
        graph[name] = {t for t in targets if not name.startswith(t + ".")}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_cycles() -> None:
    """The check above could fail: a two-module and a three-module cycle are found."""
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
