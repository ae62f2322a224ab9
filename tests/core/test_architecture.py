"""The package's shape, checked statically over src/ (issue 29, "Done when"): the import graph has no circle, the
packing and stream classes live in their sub-packages, and no module touches another's underscore names unless a
``# private: <reason>`` comment says why.

Decisions the checks encode:

- Every import is an edge of the graph: at module level, under ``if TYPE_CHECKING:`` (a typing circle tangles the
  modules as much) and inside functions (a lazy import hides a circle from the interpreter, not from the reader;
  the package has none, so none is needed). ``from a import b`` is an edge to ``a.b`` when that is a module.
- A packing or stream class is a class whose name says so (``Packed``, ``Stream``, ``TokenBudget``, ``RowSampler``,
  ``Shard``), an ``IterableDataset``, or a subclass of a class defined in ``packing/`` or ``stream/``. Errors are
  not: they all live in ``errors.py``.
- A module's own underscore names are the functions and classes it defines, the names it assigns or imports, its
  arguments, and the attributes it sets on ``self`` or ``cls``. Any other ``._name`` (on any object, ``self``
  included: a private member inherited from another module's class), and any ``from X import _name``, is another
  module's, ours or a framework's. Dunder names are public, and so are the few standard-library names documented
  with a leading underscore.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "stateful_sampler"

# Documented public despite the underscore: sys._getframe, os._exit, namedtuple's _replace / _asdict / _fields / _make.
DOCUMENTED_PUBLIC = frozenset({"_getframe", "_exit", "_replace", "_asdict", "_fields", "_make"})

PACKING_OR_STREAM_NAME = re.compile(r"Packed|Stream|TokenBudget|RowSampler|Shard(?!ing)")
HOMES = ("packing", "stream", "order")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, tuple[Path, ast.Module]]:
    return {module_name(path): (path, ast.parse(path.read_text())) for path in sorted((SRC / PACKAGE).rglob("*.py"))}


def imported(module: str, node: ast.AST, known: set[str]) -> Iterator[str]:
    """The package's modules an import statement of ``module`` loads."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names if alias.name in known)
    elif isinstance(node, ast.ImportFrom):
        assert node.level == 0, f"{module}: the package imports by absolute names, so the graph reads them as such"
        target = node.module or ""
        for alias in node.names:
            if f"{target}.{alias.name}" in known:
                yield f"{target}.{alias.name}"
            elif target in known:
                yield target


def import_graph() -> dict[str, set[str]]:
    known = set(modules())
    return {
        name: {target for node in ast.walk(tree) for target in imported(name, node, known)} - {name}
        for name, (_, tree) in modules().items()
    }


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``graph`` (its modules in order, the first repeated at the end), ``None`` without one."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" after

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = "open"
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                return [*path[path.index(target) :], target]
            if target not in state:
                found = visit(target, [*path, target])
                if found is not None:
                    return found
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start, [start])
            if found is not None:
                return found
    return None


def test_the_import_graph_has_no_circle() -> None:
    graph = import_graph()
    assert "stateful_sampler.loader" in graph["stateful_sampler"]  # the graph is read: __init__ imports the loader
    assert "stateful_sampler.wrappers" in graph["stateful_sampler.loader"]
    assert find_circle(graph) is None, " -> ".join(find_circle(graph) or [])


def test_a_circle_is_found() -> None:
    """The search can fail: a made-up graph with a circle three modules round."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert find_circle(graph) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b"}, "b": set()}) is None
    package = import_graph()
    package["stateful_sampler.wrappers"].add("stateful_sampler.loader")  # the loader imports wrappers
    assert find_circle(package) == ["stateful_sampler.loader", "stateful_sampler.wrappers", "stateful_sampler.loader"]


def packing_or_stream_classes() -> Iterator[tuple[str, str]]:
    """(module, class) for each packing or stream class of the package (the rule in the module docstring)."""
    homes = {f"{PACKAGE}.{home}" for home in ("packing", "stream")}
    theirs = {
        node.name
        for name, (_, tree) in modules().items()
        if name.rsplit(".", 1)[0] in homes or name in homes
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    }
    for name, (_, tree) in modules().items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef) or node.name.endswith("Error"):
                continue
            bases = {base.id if isinstance(base, ast.Name) else getattr(base, "attr", "") for base in node.bases}
            if PACKING_OR_STREAM_NAME.search(node.name) or bases & (theirs | {"IterableDataset"}):
                yield name, node.name


def test_packing_and_stream_classes_live_in_their_sub_packages() -> None:
    found = list(packing_or_stream_classes())
    assert (f"{PACKAGE}.stream.dataset", "ShardedStream") in found and (
        f"{PACKAGE}.packing.rows",
        "PackedRows",
    ) in found
    outside = [(module, cls) for module, cls in found if module.split(".")[1] not in HOMES]
    assert outside == []


def is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def own_names(tree: ast.Module) -> set[str]:
    """The names a module defines (the rule in the module docstring)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[0])
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and is_self(node.value):
            names.add(node.attr)
    return names


def private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__") and name not in DOCUMENTED_PUBLIC


def others_private_names(tree: ast.Module) -> Iterator[tuple[int, int, str]]:
    """(first line, last line, name) of each use of another module's underscore name."""
    own = own_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module_parts = (node.module or "").split(".")
            for alias in node.names:
                if private(alias.name) or any(private(part) for part in module_parts):
                    yield node.lineno, node.end_lineno or node.lineno, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if any(private(part) for part in alias.name.split(".")):
                    yield node.lineno, node.end_lineno or node.lineno, alias.name
        elif isinstance(node, ast.Attribute) and private(node.attr) and node.attr not in own:
            yield node.lineno, node.end_lineno or node.lineno, node.attr


def unexplained_private_uses(relative: str, source: str) -> list[tuple[str, int, str]]:
    """(file, line, name) of each use of another module's underscore name in ``source`` that no ``# private: ``
    comment on the line above or the statement's own lines explains."""
    lines = source.splitlines()
    return [
        (relative, first, name)
        for first, last, name in others_private_names(ast.parse(source))
        if not any("# private: " in line for line in lines[max(first - 2, 0) : last])
    ]


def test_no_module_uses_another_s_underscore_names_without_saying_why() -> None:
    found = [
        use
        for path, _ in modules().values()
        for use in unexplained_private_uses(path.relative_to(SRC).as_posix(), path.read_text())
    ]
    assert found == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from stateful_sampler.hooks import _hooks\n", [("m.py", 1, "_hooks")]),
        ("import x\nx.loader._pass\n", [("m.py", 2, "_pass")]),
        ("class A(B):\n    def f(self):\n        return self._inherited\n", [("m.py", 3, "_inherited")]),
        ("x.loader._pass  # private: the framework keeps it only there\n", []),
        ("# private: the framework keeps it only there\nx.loader._pass\n", []),
        ("class A:\n    def f(self):\n        self._mine = 1\n        return other._mine\n", []),
        ("import sys\nsys._getframe(1).__class__\n", []),
    ],
)
def test_the_private_name_check_can_fail(source: str, expected: list[tuple[str, int, str]]) -> None:
    assert unexplained_private_uses("m.py", source) == expected
