"""Every rule is documented and registered exactly as the public catalog (shared/rules.md) says."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from torchls.analysis import all_rules, get_rule


def _catalog_path() -> Path:
    """`../shared/rules.md` beside the checkout (as CI lays it out); for a scratch clone of a
    local checkout, the one beside the repository it was cloned from."""
    root = Path(__file__).resolve().parents[2]
    candidate = root.parent / "shared" / "rules.md"
    if candidate.exists():
        return candidate
    origin = subprocess.run(
        ["git", "-C", str(root), "config", "--get", "remote.origin.url"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    if origin and Path(origin).is_dir():
        return Path(origin).resolve().parent / "shared" / "rules.md"
    return candidate


CATALOG = _catalog_path()
SECTIONS = ("## What it catches", "## Why it is wrong", "## Example", "## Fix")


def _catalog() -> dict[str, tuple[str, str, str]]:
    rows = {}
    for match in re.finditer(
        r"^\| (TL\d{3}) \| ([a-z0-9-]+) \| ([EWI]) \| [^|]*\|(?: ([^|]*)\|)?",
        CATALOG.read_text(),
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
