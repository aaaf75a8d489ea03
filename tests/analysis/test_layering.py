"""The analysis keeps its layers one-way: rule modules never import each other, the query layer
(`torchls.analysis.facts`, `torchls.analysis.queries`) and the other analysis modules (the
hover's `contracts.py` included) never import a rule module, and the rule families
CONTRIBUTING.md lists are where the registered rules really live.

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
# Helper modules of the rules package (edit builders), not rule modules.
HELPERS = {"__init__", "_edits"}


def rule_modules() -> set[str]:
    return {p.stem for p in RULES.glob("*.py") if p.stem not in HELPERS}


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


def contributing_families() -> dict[str, list[str]]:
    """`module.py` → the codes and code families (`TL1xx`) CONTRIBUTING.md puts there, from its
    list of rule families (`- \\`losses.py\\`: TL1xx ...`)."""
    text = CONTRIBUTING.read_text(encoding="utf-8")
    families: dict[str, list[str]] = {}
    for match in re.finditer(r"^\s*- `(\w+)\.py`: ([^—\n]+)", text, re.MULTILINE):
        families[match.group(1)] = re.findall(r"TL\d(?:xx|\d\d)", match.group(2))
    return families


def test_rule_families_in_contributing_match_where_rules_live() -> None:
    families = contributing_families()
    assert families, "CONTRIBUTING.md lists the rule family modules"
    wrong = []
    for rule in all_rules():
        module = rule.check.__module__.rsplit(".", 1)[-1]
        exact = [m for m, codes in families.items() if rule.code in codes]
        family = [m for m, codes in families.items() if f"{rule.code[:3]}xx" in codes]
        listed = exact or family
        if listed != [module]:
            wrong.append(f"{rule.code} lives in rules/{module}.py, CONTRIBUTING says {listed}")
    assert wrong == []
