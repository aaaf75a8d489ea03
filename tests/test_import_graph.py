"""A ratchet on import cycles in `torchls`, and the one-way rules of the design between its parts.

Why: a cycle between modules is hidden by an import moved into a function, and each such move
makes import order matter a little more; today's cycles and in-function imports are recorded in
`tests/import-cycles-baseline.json`, and a change may shrink them, never grow them. The design
(design.md, "the arrows one-way") also fixes who may import whom: the analysis is pure (no
pygls, lsprotocol, torch or tensorflow; nothing of the server, the probe runner or the CLI), and
the probe that runs in the user's interpreter brings nothing but the standard library and torch.
In: every module of `server/torchls` and `probes/torchls_probe`, parsed with `ast` (nothing is
imported). The graph takes imports inside functions too; an `if TYPE_CHECKING:` block is left out
of it (it never runs) but not out of the layering rules. Out: the assertions, and
`python tests/test_import_graph.py --update` to rewrite the baseline from the tree as it is.
"""

from __future__ import annotations

import ast
import json
import sys
from collections.abc import Iterator
from pathlib import Path

from torchls.records import record

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "server"
PROBE = ROOT / "probes" / "torchls_probe"
BASELINE = ROOT / "tests" / "import-cycles-baseline.json"
REFRESH = ".venv/bin/python tests/test_import_graph.py --update"
AREAS = ("torchls.analysis", "torchls.probe", "torchls.lsp")
REST = "rest"


@record(frozen=True)
class Import:
    """One imported module name, as written (absolute, relative ones resolved)."""

    name: str
    line: int
    in_function: bool
    type_checking: bool
    # `from x import y` names `x.y` too: `y` may be a submodule.
    names: tuple[str, ...] = ()


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(source: str, module: str, is_package: bool) -> Iterator[Import]:
    """Every import statement of a module, with whether it sits in a function body and whether
    in an `if TYPE_CHECKING:` block (whose `else:` runs, and is walked as ordinary code)."""
    package = module if is_package else module.rpartition(".")[0]

    def walk(node: ast.AST, in_function: bool, type_checking: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield Import(alias.name, child.lineno, in_function, type_checking)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - child.level + 1]
                    base = ".".join([*anchor, base]).strip(".")
                names = tuple(f"{base}.{a.name}" for a in child.names if a.name != "*")
                yield Import(base, child.lineno, in_function, type_checking, names)
            elif isinstance(child, ast.If) and is_type_checking(child.test):
                for statement in child.body:
                    yield from walk(ast.Module([statement], []), in_function, True)
                for statement in child.orelse:
                    yield from walk(ast.Module([statement], []), in_function, type_checking)
            else:
                inside = in_function or isinstance(
                    child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
                )
                yield from walk(child, inside, type_checking)

    yield from walk(ast.parse(source), False, False)


def sources(root: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's `__init__`), for every `.py` of the package
    at `root`."""
    return {
        module_name(path, root.parent): (path, path.name == "__init__.py")
        for path in sorted(root.rglob("*.py"))
    }


def resolve(imported: Import, modules: set[str]) -> set[str]:
    """The modules of `modules` an import statement names: the submodules `from x import y`
    names, else `x` itself (or the nearest package above a name that is not a module)."""
    found = {name for name in imported.names if name in modules}
    if found:
        return found
    name = imported.name
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return {name} if name else set()


@record
class Graph:
    """The import graph of `torchls` (TYPE_CHECKING imports left out) and its in-function
    imports between torchls modules."""

    edges: dict[str, set[str]]
    in_function: list[tuple[str, int, str]]


def build_graph(files: dict[str, tuple[Path, bool]]) -> Graph:
    modules = set(files)
    edges: dict[str, set[str]] = {name: set() for name in modules}
    in_function: list[tuple[str, int, str]] = []
    for name, (path, is_package) in files.items():
        for imported in imports_of(path.read_text(encoding="utf-8"), name, is_package):
            if imported.type_checking:
                continue
            for target in resolve(imported, modules) - {name}:
                edges[name].add(target)
                if imported.in_function:
                    in_function.append((name, imported.line, target))
    return Graph(edges, sorted(in_function))


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """The components of more than one module (Tarjan, iterative: the graph has hundreds of
    modules and deep chains), each sorted, sorted by their first module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = counter
                    counter += 1
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(edges[successor]))))
                    advanced = True
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def area(module: str) -> str:
    return next((a for a in AREAS if module == a or module.startswith(f"{a}.")), REST)


def measure() -> dict[str, object]:
    """What the baseline holds: the cycles, and per area the modules in a cycle and the count of
    in-function imports of a torchls module."""
    graph = build_graph(sources(SERVER / "torchls"))
    cycles = strongly_connected(graph.edges)
    areas: dict[str, dict[str, object]] = {}
    for name in (*AREAS, REST):
        areas[name] = {
            "modules_in_cycles": sorted(m for c in cycles for m in c if area(m) == name),
            "in_function_imports": sum(1 for m, _, _ in graph.in_function if area(m) == name),
        }
    return {"cycles": cycles, "areas": areas}


def compare(baseline: dict, current: dict) -> tuple[list[str], list[str]]:
    """(what got worse, what got better) between two measures."""
    worse: list[str] = []
    better: list[str] = []
    old_cycles = [set(c) for c in baseline["cycles"]]
    for cycle in current["cycles"]:
        # A cycle is no worse when all of it already was one cycle; two cycles merged, a module
        # joining one, or a new one are all worse.
        if not any(set(cycle) <= old for old in old_cycles):
            worse.append(f"new or grown import cycle: {' <-> '.join(cycle)}")
    for old in baseline["cycles"]:
        # Broken up or shrunk: no cycle of today holds all of it.
        if not any(set(old) <= set(c) for c in current["cycles"]):
            now = [len(set(c) & set(old)) for c in current["cycles"] if set(c) & set(old)]
            better.append(f"cycle of {len(old)} modules ({old[0]}, ...) is now {now or 'gone'}")
    for name, counts in current["areas"].items():
        before = baseline["areas"].get(name, {"modules_in_cycles": [], "in_function_imports": 0})
        joined = sorted(set(counts["modules_in_cycles"]) - set(before["modules_in_cycles"]))
        if joined:
            worse.append(f"{name}: modules now in a cycle: {', '.join(joined)}")
        left = sorted(set(before["modules_in_cycles"]) - set(counts["modules_in_cycles"]))
        if left:
            better.append(f"{name}: modules out of every cycle: {', '.join(left)}")
        was, now_count = before["in_function_imports"], counts["in_function_imports"]
        if now_count > was:
            worse.append(f"{name}: in-function imports of torchls modules {was} -> {now_count}")
        elif now_count < was:
            better.append(f"{name}: in-function imports of torchls modules {was} -> {now_count}")
    return worse, better


def test_no_new_import_cycle_and_no_more_in_function_imports() -> None:
    current = measure()
    worse, better = compare(json.loads(BASELINE.read_text(encoding="utf-8")), current)
    if better:
        print(f"import graph improved (keep it: {REFRESH}):\n  " + "\n  ".join(better))
    if worse:
        graph = build_graph(sources(SERVER / "torchls"))
        listed = "\n  ".join(f"{m}:{line} imports {t}" for m, line, t in graph.in_function)
        raise AssertionError(
            "the import graph got worse than tests/import-cycles-baseline.json:\n  "
            + "\n  ".join(worse)
            + f"\nin-function imports now:\n  {listed}"
        )


def test_the_ratchet_sees_a_grown_cycle_and_an_in_function_import() -> None:
    base = {
        "cycles": [["a.x", "a.y"]],
        "areas": {REST: {"modules_in_cycles": ["a.x", "a.y"], "in_function_imports": 1}},
    }
    grown = {
        "cycles": [["a.x", "a.y", "a.z"], ["b.p", "b.q"]],
        "areas": {
            REST: {
                "modules_in_cycles": ["a.x", "a.y", "a.z", "b.p", "b.q"],
                "in_function_imports": 2,
            }
        },
    }
    worse, better = compare(base, grown)
    assert "new or grown import cycle: a.x <-> a.y <-> a.z" in worse
    assert "new or grown import cycle: b.p <-> b.q" in worse
    assert f"{REST}: modules now in a cycle: a.z, b.p, b.q" in worse
    assert f"{REST}: in-function imports of torchls modules 1 -> 2" in worse
    assert better == []
    shrunk = {"cycles": [], "areas": {REST: {"modules_in_cycles": [], "in_function_imports": 0}}}
    worse, better = compare(base, shrunk)
    assert worse == []
    assert len(better) == 3


def test_the_walker_sees_function_imports_and_leaves_type_checking_blocks_out() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import b\n"
        "if TYPE_CHECKING:\n    from .c import C\nelse:\n    import pkg.d\n"
        "class K:\n    def m(self):\n        from ..top import e\n"
        "def f():\n    import pkg.sub.g as g\n"
    )
    found = {i.name: i for i in imports_of(source, "pkg.sub.a", is_package=False)}
    assert found["pkg.sub"].names == ("pkg.sub.b",)
    assert found["pkg.sub.c"].type_checking and not found["pkg.sub.c"].in_function
    assert not found["pkg.d"].type_checking
    assert found["pkg.top"].in_function and found["pkg.top"].names == ("pkg.top.e",)
    assert found["pkg.sub.g"].in_function
    modules = {"pkg", "pkg.sub", "pkg.sub.a", "pkg.sub.b", "pkg.sub.c", "pkg.d", "pkg.top"}
    assert resolve(found["pkg.sub"], modules) == {"pkg.sub.b"}
    # `e` is a name in pkg.top, not a module; `g` is no module of the set, its package is.
    assert resolve(found["pkg.top"], modules) == {"pkg.top"}
    assert resolve(found["pkg.sub.g"], modules) == {"pkg.sub"}
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert strongly_connected(edges) == [["a", "b", "c"]]


def all_imports(root: Path) -> Iterator[tuple[str, Import]]:
    """Every import of every module under `root`, TYPE_CHECKING blocks included: a layer rule
    is about what a module depends on, not only on what runs."""
    for name, (path, is_package) in sources(root).items():
        for imported in imports_of(path.read_text(encoding="utf-8"), name, is_package):
            yield name, imported


def test_the_analysis_imports_no_editor_protocol_no_framework_and_no_outer_part() -> None:
    banned_packages = {"pygls", "lsprotocol", "torch", "tensorflow"}
    banned_modules = ("torchls.lsp", "torchls.probe", "torchls.cli")
    offenders = []
    for module, imported in all_imports(SERVER / "torchls" / "analysis"):
        for name in (imported.name, *imported.names):
            if name.split(".")[0] in banned_packages or any(
                name == b or name.startswith(f"{b}.") for b in banned_modules
            ):
                offenders.append(f"{module}:{imported.line} imports {name}")
                break
    assert offenders == [], "design.md: the analysis is pure (source text in, findings out)"
    # Not vacuous: the walk reaches the analysis and its imports of torchls outside it.
    assert any(i.name == "torchls.records" for _, i in all_imports(SERVER / "torchls" / "analysis"))


def test_the_probe_imports_only_the_standard_library_torch_and_itself() -> None:
    allowed = set(sys.stdlib_module_names) | {"torch", "torchls_probe"}
    offenders = [
        f"{module}:{imported.line} imports {imported.name}"
        for module, imported in all_imports(PROBE)
        if imported.name.split(".")[0] not in allowed
    ]
    assert offenders == [], "the probe runs in the user's interpreter: stdlib and torch only"
    # Not vacuous: the probe is found and does import torch and itself.
    seen = {imported.name.split(".")[0] for _, imported in all_imports(PROBE)}
    assert {"torch", "torchls_probe"} <= seen


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit(f"usage: {REFRESH}")
    measured = measure()
    BASELINE.write_text(json.dumps(measured, indent=2) + "\n", encoding="utf-8")
    sizes = [len(c) for c in measured["cycles"]]  # type: ignore[union-attr]
    print(f"{BASELINE.relative_to(ROOT)}: cycles of {sizes} modules", file=sys.stderr)
