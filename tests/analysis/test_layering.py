"""The analysis keeps its layers one-way: rule modules never import each other, the query layer
(`torchls.analysis.facts`, `torchls.analysis.queries`) and the other analysis modules (the
hover's `contracts.py` included) never import a rule module, each rule lives in a module of its
own named after it (`rules/tl201_eval_without_eval_mode.py`), helpers (`rules/_*.py`) register
nothing, and no module of the rules package grows past 400 lines.

Why: shared training vocabulary used to live in one rule module and be imported by others (and
by the hover); a rule module that needs another's helper means the helper belongs to the facts.
In: the source files, parsed with `ast` (nothing is imported for the import checks), and the
registry. Out: assertions naming the offending import or rule.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from torchls.analysis import all_rules

ANALYSIS = Path(__file__).resolve().parents[2] / "server" / "torchls" / "analysis"
RULES = ANALYSIS / "rules"
CONTRIBUTING = Path(__file__).resolve().parents[2] / "CONTRIBUTING.md"


def rule_modules() -> set[str]:
    """The rule modules: every module of `rules/` but the helpers (`_edits.py`, `_modes.py`,
    ...: edit builders and predicates shared by the rules of one family) and `__init__.py`."""
    return {p.stem for p in RULES.glob("*.py") if not p.stem.startswith("_")}


def imported_modules(path: Path, package: str | None = None) -> set[str]:
    """Absolute names of the `torchls.analysis.rules...` modules `path` imports, anywhere in it
    (function-level imports included; relative imports resolved against `package`, by default
    the package of a file in `analysis/` or `analysis/rules/`)."""
    found: set[str] = set()
    if package is None:
        package = "torchls.analysis.rules" if path.parent == RULES else "torchls.analysis"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [*package.split(".")[: len(package.split(".")) - node.level + 1], base]
                ).strip(".")
            found.add(base)
            # `from torchls.analysis.rules import losses` imports the module `losses`.
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name.startswith("torchls.analysis.rules.")}


def test_no_rule_module_imports_another_rule_module() -> None:
    modules = rule_modules()
    offenders = []
    for name in sorted(modules):
        for imported in sorted(imported_modules(RULES / f"{name}.py")):
            other = imported.removeprefix("torchls.analysis.rules.").split(".")[0]
            if other in modules and other != name:
                offenders.append(f"rules/{name}.py imports rules/{other}.py")
    assert offenders == [], "move the shared helper into the facts layer (queries/)"


def test_the_query_layer_and_the_hover_import_no_rule_module() -> None:
    # Only the package itself and the registry (which loads the rules) name rule modules; the
    # facts, the queries, the hover's contracts and the other analyses sit below the rules.
    paths = [
        *(p for p in ANALYSIS.glob("*.py") if p.name not in ("__init__.py", "registry.py")),
        *(ANALYSIS / "queries").glob("*.py"),
    ]
    offenders = [
        f"{path.relative_to(ANALYSIS)} imports {imported}"
        for path in paths
        for imported in sorted(imported_modules(path))
        if imported.removeprefix("torchls.analysis.rules.").split(".")[0] in rule_modules()
    ]
    assert offenders == []


def test_the_guard_sees_every_way_of_importing_a_rule_module(tmp_path: Path) -> None:
    # The checks above must not pass vacuously.
    fake = tmp_path / "fake.py"
    fake.write_text(
        "from torchls.analysis.rules.losses import describe\n"
        "from . import modes\n"
        "def late():\n    import torchls.analysis.rules.shapes\n"
        "    from .numerics import x\n",
        encoding="utf-8",
    )
    found = imported_modules(fake, package="torchls.analysis.rules")
    assert {
        "torchls.analysis.rules.losses",
        "torchls.analysis.rules.modes",
        "torchls.analysis.rules.shapes",
        "torchls.analysis.rules.numerics",
    } <= found


def module_name(code: str, name: str) -> str:
    """The module a rule lives in: `TL201` `eval-without-eval-mode` →
    `tl201_eval_without_eval_mode`."""
    return f"{code.lower()}_{name.replace('-', '_')}"


def test_each_rule_lives_in_its_own_module_named_after_it() -> None:
    wrong = [
        f"{rule.code} lives in rules/{rule.check.__module__.rsplit('.', 1)[-1]}.py, "
        f"not rules/{module_name(rule.code, rule.name)}.py"
        for rule in all_rules()
        if rule.check.__module__ != f"torchls.analysis.rules.{module_name(rule.code, rule.name)}"
    ]
    assert wrong == []
    # ... and a rule module holds that one rule: no module is left without one.
    registered = {rule.check.__module__.rsplit(".", 1)[-1] for rule in all_rules()}
    assert rule_modules() == registered


def test_helper_modules_register_no_rule_and_import_no_rule_module() -> None:
    helpers = sorted(p for p in RULES.glob("_*.py") if p.stem != "__init__")
    assert helpers, "the rules package has helper modules (`_edits.py` at least)"
    offenders = [
        f"rules/{path.name} imports {imported}"
        for path in helpers
        for imported in sorted(imported_modules(path))
        if imported.removeprefix("torchls.analysis.rules.").split(".")[0] in rule_modules()
    ]
    offenders += [f"rules/{p.name} registers a rule" for p in helpers if "@rule(" in p.read_text()]
    assert offenders == []


def test_no_module_of_the_rules_package_is_over_400_lines() -> None:
    # A rule that needs more has predicates that belong in a helper module or the queries.
    long = {p.name: n for p in RULES.glob("*.py") if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}


def test_the_rule_modules_contributing_names_are_where_those_rules_live() -> None:
    text = CONTRIBUTING.read_text(encoding="utf-8")
    named = set(re.findall(r"rules/(tl\d{3}_\w+)\.py", text))
    assert named, "CONTRIBUTING.md shows the module layout with an example"
    assert named <= {module_name(rule.code, rule.name) for rule in all_rules()}
