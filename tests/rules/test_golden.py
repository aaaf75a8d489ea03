"""Golden tests: every fixture's findings must equal its `.expected` file, line for line.

Positive fixtures (`pos_*.py`) must contain their folder's code; negative fixtures
(`neg_*.py`) are real-looking correct code and must produce no finding at all.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.rules.golden import FIXTURES, findings_for, fixture_files, rendered
from torchls.analysis import all_rules


@pytest.mark.parametrize("fixture", fixture_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fixture_matches_expected(fixture: Path) -> None:
    expected_file = fixture.with_suffix(".expected")
    assert expected_file.exists(), f"missing {expected_file.name} next to {fixture.name}"
    expected = [line for line in expected_file.read_text().splitlines() if line.strip()]
    assert rendered(fixture) == expected


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.code)
def test_rule_has_positive_and_negative_fixtures(rule) -> None:
    folder = FIXTURES / rule.code
    positives = sorted(folder.glob("pos_*.py"))
    negatives = sorted(folder.glob("neg_*.py"))
    assert positives, f"{rule.code} has no positive fixture in {folder}"
    assert negatives, f"{rule.code} has no negative fixture in {folder}"
    for positive in positives:
        codes = {finding.code for finding in findings_for(positive)}
        assert rule.code in codes, f"{positive.name} does not trigger {rule.code}"


@pytest.mark.parametrize(
    "fixture",
    sorted(FIXTURES.glob("*/neg_*.py")),
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_negative_fixture_is_silent(fixture: Path) -> None:
    assert findings_for(fixture) == []
