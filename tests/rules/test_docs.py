"""Every rule is documented, and the registry says what the public catalog says.

Rule metadata is written once, in the registry (`@rule(...)`); `tests/rules/catalog.md` is
generated from it by `python -m torchls.docs --write`, so a checkout on its own (no ../shared)
still has a catalog to read. Where the public catalog (`../shared/rules.md`, as CI lays it out)
is beside the checkout, every code, name, severity and fix kind must agree with it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torchls.analysis import all_rules, get_rule

ROOT = Path(__file__).resolve().parents[2]
# The generated copy inside the repository; the public catalog is ../shared/rules.md.
CATALOG = Path(__file__).with_name("catalog.md")
SHARED_CATALOG = ROOT.parent / "shared" / "rules.md"


SEVERITY = {"error": "E", "warning": "W", "information": "I"}
SECTIONS = ("## What it catches", "## Why it is wrong", "## Example", "## Fix")


def _fix_kind(text: str) -> str:
    """The fix column's kind: the public catalog writes "safe when ...", "unsafe: ..." or
    nothing (the probe findings), the generated copy the bare kind."""
    text = text.strip()
    for kind in ("unsafe", "safe"):
        if text.startswith(kind):
            return kind
    return "none"


def _catalog(path: Path = CATALOG) -> dict[str, tuple[str, str, str]]:
    """code -> (name, severity letter, fix kind) for every table row of a catalog."""
    rows = {}
    for match in re.finditer(
        r"^\| (TL\d{3}) \| ([a-z0-9-]+) \| ([EWI]) \| [^|]*\|(?: ([^|]*)\|)?",
        path.read_text(),
        re.MULTILINE,
    ):
        rows[match.group(1)] = (match.group(2), match.group(3), _fix_kind(match.group(4) or ""))
    return rows


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.code)
def test_rule_doc_has_every_section(rule) -> None:
    for section in SECTIONS:
        assert section in rule.doc, f"{rule.code} doc lacks {section!r}"
    assert "```python" in rule.doc, f"{rule.code} doc has no example"
    assert rule.summary and len(rule.summary) < 90


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.code)
def test_rule_matches_catalog(rule) -> None:
    catalog = _catalog()
    assert rule.code in catalog, f"{rule.code} is not in {CATALOG}"
    name, severity, fix = catalog[rule.code]
    assert rule.name == name
    assert rule.severity == {"E": "error", "W": "warning", "I": "information"}[severity]
    assert rule.fix == fix, f"{rule.code}: the catalog says fix {fix!r}, the registry {rule.fix!r}"


def _probe_codes() -> list[str]:
    return sorted(code for code in _catalog() if code.startswith("TL9"))


@pytest.mark.parametrize("code", _probe_codes())
def test_probe_finding_is_documented_as_the_catalog_says(code: str) -> None:
    rule = get_rule(code)
    assert rule is not None, f"`torchls rule {code}` has nothing to print"
    name, severity, _ = _catalog()[code]
    assert (rule.name, rule.severity) == (
        name,
        {"E": "error", "W": "warning", "I": "information"}[severity],
    )
    for section in SECTIONS:
        assert section in rule.doc, f"{code} doc lacks {section!r}"
    assert list(rule.check(None)) == []  # type: ignore[arg-type]


def test_probe_findings_are_not_static_rules() -> None:
    assert not any(rule.code.startswith("TL9") for rule in all_rules())


def test_catalog_copy_is_generated_from_the_registry() -> None:
    """Adding or changing a rule means regenerating the copy, never editing it: a copy that
    differs from what the registry generates fails here."""
    from torchls.docs import catalog_markdown

    assert CATALOG.read_text(encoding="utf-8") == catalog_markdown(), (
        "tests/rules/catalog.md is stale: run `python -m torchls.docs --write`"
    )
    assert {code for code in _catalog() if not code.startswith("TL9")} == {
        r.code for r in all_rules()
    }


def test_registry_says_what_the_shared_catalog_says() -> None:
    """The public catalog is the contract: every code it lists is registered (a static rule
    or a documented probe finding) with its name, severity and fix kind, and the registry has
    no code the catalog lacks. A checkout without ../shared checks the generated copy, which
    says what the registry says."""
    catalog = _catalog(SHARED_CATALOG if SHARED_CATALOG.exists() else CATALOG)
    registered = {}
    for code in catalog:
        rule = get_rule(code)
        assert rule is not None, f"{code} is in the catalog but not registered"
        registered[code] = (rule.name, SEVERITY[rule.severity], rule.fix)
    assert registered == catalog
    assert {r.code for r in all_rules()} <= set(catalog), "a registered rule the catalog lacks"


def test_the_rule_tests_pass_in_a_checkout_without_shared(tmp_path: Path) -> None:
    """A copy of the repository with no ../shared beside it (a fork, a tarball) runs these
    tests against the catalog's copy; they used to fail with FileNotFoundError."""
    import shutil
    import subprocess
    import sys

    copy = tmp_path / "checkout"
    (copy / "tests" / "rules").mkdir(parents=True)
    shutil.copy(ROOT / "pyproject.toml", copy)
    for name in ("test_docs.py", "catalog.md"):
        shutil.copy(Path(__file__).with_name(name), copy / "tests" / "rules" / name)
    assert not (copy.parent / "shared").exists()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/rules",
            "-k",
            "not without_shared",
        ],
        cwd=copy,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:]
    assert " passed" in done.stdout and "error" not in done.stdout.lower()
