"""The probe's server modules form a one-way import graph (issue #31): read with `ast`, never
imported, so a violation is found whatever the module would do at import time.

In: every module of `server/torchls/probe`. Out: a failure naming each import of a probe module
made inside a function or method (a hidden cycle), each `_private` name imported from another
module, and each cycle among the module-level imports (those under `if TYPE_CHECKING:` are for
type checkers only and are left out).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "torchls.probe"
FOLDER = Path(__file__).resolve().parents[2] / "server" / "torchls" / "probe"


def _modules() -> dict[str, ast.Module]:
    return {
        path.stem: ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for path in sorted(FOLDER.glob("*.py"))
    }


def _targets(node: ast.Import | ast.ImportFrom) -> list[tuple[str, list[str]]]:
    """The probe modules one import statement names, each with the names taken from it."""
    if isinstance(node, ast.Import):
        return [
            (alias.name.split(".")[2], [])
            for alias in node.names
            if alias.name.startswith(PACKAGE + ".")
        ]
    names = [alias.name for alias in node.names]
    if node.level == 1:  # `from . import x`, `from .x import y`: inside this package
        module = f"{PACKAGE}.{node.module}" if node.module else PACKAGE
    else:
        module = node.module or ""
    if module == PACKAGE:  # `from torchls.probe import causes`: the names are modules
        return [(name, []) for name in names]
    if module.startswith(PACKAGE + "."):
        return [(module.split(".")[2], names)]
    return []


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _Imports(ast.NodeVisitor):
    """Collects (line, target module, names, inside a function) for one module."""

    def __init__(self) -> None:
        self.found: list[tuple[int, str, list[str], bool]] = []
        self._depth = 0

    def _function(self, node: ast.AST) -> None:
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function
    visit_Lambda = _function

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node):
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def _import(self, node: ast.Import | ast.ImportFrom) -> None:
        for target, names in _targets(node):
            self.found.append((node.lineno, target, names, self._depth > 0))

    visit_Import = _import
    visit_ImportFrom = _import


def _imports() -> dict[str, list[tuple[int, str, list[str], bool]]]:
    table = {}
    for name, tree in _modules().items():
        visitor = _Imports()
        visitor.visit(tree)
        table[name] = visitor.found
    return table


def test_no_probe_module_is_imported_inside_a_function() -> None:
    inside = [
        f"{module}.py:{line} imports {target} inside a function"
        for module, found in _imports().items()
        for line, target, _names, in_function in found
        if in_function
    ]
    assert inside == []


def test_no_private_name_is_imported_from_another_module() -> None:
    private = [
        f"{module}.py:{line} imports {name} from {target}"
        for module, found in _imports().items()
        for line, target, names, _in_function in found
        for name in names
        if name.startswith("_") and target != module
    ]
    assert private == []


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph`, as the modules along it (first repeated last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for successor in sorted(graph.get(node, ())):
            if state.get(successor) == 1:
                return [*path[path.index(successor) :], successor]
            if successor not in state and (found := visit(successor)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_the_module_level_imports_have_no_cycle() -> None:
    graph = {
        module: {target for _line, target, _names, inside in found if not inside}
        - {module, "__init__"}
        for module, found in _imports().items()
    }
    assert _cycle(graph) is None


def test_the_cycle_finder_finds_a_cycle_and_accepts_a_chain() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_visitor_sees_function_imports_and_skips_type_checking_blocks() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "from torchls.probe import untrusted\n"
        "if TYPE_CHECKING:\n"
        "    from torchls.probe.report import ReproReport\n"
        "def run():\n"
        "    from torchls.probe.sandbox import _secret\n"
        "    from .view import ProjectView\n"
    )
    visitor = _Imports()
    visitor.visit(ast.parse(source))
    assert visitor.found == [
        (2, "untrusted", [], False),
        (6, "sandbox", ["_secret"], True),
        (7, "view", ["ProjectView"], True),
    ]
