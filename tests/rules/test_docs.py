"""Every rule is documented and registered exactly as the catalog says.

The catalog's copy is `tests/rules/catalog.md`; where the public one (`../shared/rules.md`, as
CI lays it out) is beside the checkout, the copy must say what it says.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torchls.analysis import all_rules, get_rule

ROOT = Path(__file__).resolve().parents[2]
# The catalog's copy inside the repository: the rule tests read this one, so a checkout on its
# own (no ../shared beside it) still runs them. The public catalog is ../shared/rules.md.
CATALOG = Path(__file__).with_name("catalog.md")
SHARED_CATALOG = ROOT.parent / "shared" / "rules.md"


SECTIONS = ("## What it catches", "## Why it is wrong", "## Example", "## Fix")


def _catalog(path: Path = CATALOG) -> dict[str, tuple[str, str, str]]:
    rows = {}
    for match in re.finditer(
        r"^\| (TL\d{3}) \| ([a-z0-9-]+) \| ([EWI]) \| [^|]*\|(?: ([^|]*)\|)?",
        path.read_text(),
        re.MULTILINE,
    ):
        rows[match.group(1)] = (match.group(2), match.group(3), (match.group(4) or "").strip())
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
    if fix.startswith("safe"):
        assert rule.fix == "safe"
    elif fix.startswith("unsafe"):
        assert rule.fix == "unsafe"
    elif fix in ("none", ""):
        assert rule.fix == "none"


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


def test_catalog_copy_says_what_the_shared_catalog_says() -> None:
    """The copy follows the public catalog: same codes, names, severities and fix kinds. A
    checkout without ../shared checks the copy is a usable catalog instead."""
    copy = _catalog()
    assert {code for code in copy if not code.startswith("TL9")} >= {r.code for r in all_rules()}
    if SHARED_CATALOG.exists():
        assert copy == _catalog(SHARED_CATALOG), (
            f"tests/rules/catalog.md differs from {SHARED_CATALOG}: copy it over"
        )


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
