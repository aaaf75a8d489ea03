"""Golden tests: every fixture's findings under its own rule equal its `.expected` file.

A fixture in `fixtures/TLxxx/` runs with rule TLxxx alone: positive fixtures (`pos_*.py`) must
trigger it, and adding a rule cannot break another rule's golden files. Negative fixtures
(`neg_*.py`) are real-looking correct code, so they must stay quiet under every rule at once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.rules.golden import FIXTURES, findings_for, fixture_files, rendered, rule_of
from torchls.analysis import all_rules


@pytest.mark.parametrize("fixture", fixture_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fixture_matches_expected(fixture: Path) -> None:
    expected_file = fixture.with_suffix(".expected")
    assert expected_file.exists(), f"missing {expected_file.name} next to {fixture.name}"
    expected = [line for line in expected_file.read_text().splitlines() if line.strip()]
    assert rendered(fixture) == expected


def test_fixture_folders_name_registered_rules() -> None:
    codes = {rule.code for rule in all_rules()}
    folders = {path.name for path in FIXTURES.iterdir() if path.is_dir()}
    assert folders <= codes, f"fixture folders without a rule: {sorted(folders - codes)}"


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.code)
def test_rule_has_positive_and_negative_fixtures(rule) -> None:
    folder = FIXTURES / rule.code
    positives = sorted(folder.glob("pos_*.py"))
    negatives = sorted(folder.glob("neg_*.py"))
    assert positives, f"{rule.code} has no positive fixture in {folder}"
    assert negatives, f"{rule.code} has no negative fixture in {folder}"
    for positive in positives:
        assert findings_for(positive, only=rule.code), f"{positive.name} misses {rule.code}"


@pytest.mark.parametrize(
    "fixture",
    sorted(FIXTURES.glob("*/neg_*.py")),
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_negative_fixture_is_silent_under_every_rule(fixture: Path) -> None:
    assert findings_for(fixture) == [], f"{rule_of(fixture)}/{fixture.name} is not quiet"
