"""Fix safety on the bundled examples and on mutated training code.

tests/rules/test_fixes.py covers the rule fixtures; this covers the examples (realistic files
where several findings and fixes sit close together) and hypothesis-mutated versions of every
corpus file. For every fix: the result parses, that finding is gone and no other finding
appears (except a known cascade, see CASCADES). Fix-all converges, parses, and a second run
changes nothing. The mutations keep the import lines: fixes rely on names resolving as in the
user's file, and a file whose imports are gone is not code anyone fixes.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import assume, given

from tests.robustness.corpus import (
    EXAMPLES,
    example_files,
    fuzz_settings,
    label,
    mutated_source,
    parses,
)
from torchls.analysis import Finding, Workspace, analyze
from torchls.analysis.fixes import apply_fixes, fixes_to_apply


def findings_of(text: str, path: Path | str) -> list[Finding]:
    workspace = Workspace(EXAMPLES) if Path(path).is_relative_to(EXAMPLES) else None
    return analyze(text, str(path), workspace=workspace).findings


# A fix may bring to light a finding its own bug was hiding. Known, intended cascades:
# TL201 (eval loop in training mode) -> once `model.eval()` is in, the loop is recognised as an
# evaluation loop and, without `torch.no_grad()`, TL202 (gradients enabled) is reported.
CASCADES = {("TL201", "TL202")}


def check_single_fix(text: str, path: Path | str, before: list[Finding], index: int) -> None:
    finding = before[index]
    assert finding.fix is not None
    fixed, applied = apply_fixes(text, [finding.fix])
    assert applied == 1
    assert fixed != text, f"{finding.code} fix changes nothing"
    assert parses(fixed), f"{finding.code} fix breaks the syntax:\n{fixed}"
    counts_before = Counter(f.code for f in before)
    counts_after = Counter(f.code for f in findings_of(fixed, path))
    # Other findings with the same cause may go too (one missing `model.train()`, two uses).
    assert counts_after[finding.code] <= counts_before[finding.code] - 1, (
        f"{finding.code} at {finding.span.start} survives its own fix:\n{fixed}"
    )
    grown = {
        code: count
        for code, count in counts_after.items()
        if count > counts_before.get(code, 0) and (finding.code, code) not in CASCADES
    }
    assert not grown, f"{finding.code} fix introduced {grown}:\n{fixed}"


def fix_all(text: str, path: Path | str, unsafe: bool) -> str:
    current = text
    for _ in range(10):
        current, applied = apply_fixes(current, fixes_to_apply(findings_of(current, path), unsafe))
        if not applied:
            return current
    raise AssertionError("fix-all did not converge in 10 passes")


def fixable_cases() -> list[tuple[Path, int]]:
    cases = []
    for path in example_files():
        for index, finding in enumerate(findings_of(path.read_text(encoding="utf-8"), path)):
            if finding.fix is not None:
                cases.append((path, index))
    return cases


CASES = fixable_cases()


def test_the_examples_offer_fixes() -> None:
    assert len(CASES) >= 5  # otherwise the tests below check nothing


@pytest.mark.parametrize(
    ("path", "index"),
    CASES,
    ids=lambda value: label(value) if isinstance(value, Path) else str(value),
)
def test_each_fix_on_the_examples_is_safe(path: Path, index: int) -> None:
    text = path.read_text(encoding="utf-8")
    check_single_fix(text, path, findings_of(text, path), index)


@pytest.mark.parametrize("unsafe", [False, True], ids=["safe", "unsafe"])
@pytest.mark.parametrize("path", example_files(), ids=label)
def test_fix_all_on_the_examples_converges_and_is_idempotent(path: Path, unsafe: bool) -> None:
    text = path.read_text(encoding="utf-8")
    before = {f.code for f in findings_of(text, path)}
    fixed = fix_all(text, path, unsafe)
    assert parses(fixed)
    after = findings_of(fixed, path)
    assert {f.code for f in after} <= before
    assert not fixes_to_apply(after, unsafe), "fixable findings survive fix-all"
    again, applied = apply_fixes(fixed, fixes_to_apply(after, unsafe))
    assert applied == 0 and again == fixed


@fuzz_settings(150)
@given(mutated_source(keep_imports=True))
def test_each_fix_on_mutated_training_code_is_safe(source: str) -> None:
    assume(parses(source))
    before = analyze(source, "mutated.py").findings
    for index, finding in enumerate(before):
        if finding.fix is not None:
            check_single_fix(source, "mutated.py", before, index)


@fuzz_settings(100)
@given(mutated_source(keep_imports=True))
def test_fix_all_on_mutated_training_code_is_idempotent(source: str) -> None:
    assume(parses(source))
    for unsafe in (False, True):
        fixed = fix_all(source, "mutated.py", unsafe)
        assert parses(fixed), fixed
        again, applied = apply_fixes(
            fixed, fixes_to_apply(analyze(fixed, "mutated.py").findings, unsafe)
        )
        assert applied == 0 and again == fixed
