"""Fix safety on every fixture: each fix parses, removes its finding and adds no other.

The fixes tried are those of the fixture's own rule (its folder), like the golden tests, so a
new rule's fixes are checked on its own fixtures; what a fix may not introduce is judged under
every rule.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

from tests.rules.golden import fixture_files, rule_of
from torchls.analysis import Finding, analyze
from torchls.analysis.fixes import apply_fixes, fixes_to_apply


def _own(text: str, fixture: Path) -> list[Finding]:
    code = rule_of(fixture)
    return analyze(text, str(fixture), enabled=lambda c: c == code).findings


def _cases() -> list[tuple[Path, int]]:
    cases = []
    for fixture in fixture_files():
        for index, finding in enumerate(_own(fixture.read_text(), fixture)):
            if finding.fix is not None:
                cases.append((fixture, index))
    return cases


@pytest.mark.parametrize(
    ("fixture", "index"),
    _cases(),
    ids=lambda value: (
        f"{value.parent.name}/{value.stem}" if isinstance(value, Path) else str(value)
    ),
)
def test_single_fix_removes_its_finding(fixture: Path, index: int) -> None:
    text = fixture.read_text()
    finding = _own(text, fixture)[index]
    before = analyze(text, str(fixture)).findings
    fixed, applied = apply_fixes(text, [finding.fix])
    assert applied == 1
    ast.parse(fixed)
    after = analyze(fixed, str(fixture)).findings
    counts_before = Counter(f.code for f in before)
    counts_after = Counter(f.code for f in after)
    assert counts_after[finding.code] == counts_before[finding.code] - 1, fixed
    assert not (set(counts_after) - set(counts_before)), f"fix introduced {counts_after}"


@pytest.mark.parametrize("fixture", fixture_files(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_fix_all_is_idempotent_and_parses(fixture: Path) -> None:
    text = fixture.read_text()
    for unsafe in (False, True):
        current = text
        for _ in range(5):
            findings = _own(current, fixture)
            current, applied = apply_fixes(current, fixes_to_apply(findings, unsafe=unsafe))
            if not applied:
                break
        ast.parse(current)
        again, applied = apply_fixes(current, fixes_to_apply(_own(current, fixture), unsafe=unsafe))
        assert applied == 0 and again == current


def test_safe_fix_keeps_formatting() -> None:
    source = (
        "import torch.nn.functional as F\n"
        "def step(logits, y):\n"
        "    probs = F.softmax(logits, dim=1)   # keep this comment\n"
        "    return F.cross_entropy( probs ,  y )\n"
    )
    finding = analyze(source).findings[0]
    fixed, _ = apply_fixes(source, [finding.fix])
    assert fixed.splitlines()[3] == "    return F.cross_entropy( logits ,  y )"
    assert fixed.splitlines()[2].endswith("# keep this comment")
