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


def test_golden_helper_writes_only_missing_expected_files(tmp_path: Path) -> None:
    """`--write-missing` creates the `.expected` of a new fixture (empty for a quiet one) and
    leaves an existing one, even a wrong one, for a person to fix."""
    import subprocess
    import sys

    folder = tmp_path / "TL101"
    folder.mkdir()
    for name in ("pos_exp_log_softmax", "neg_softmax_for_metrics"):
        (folder / f"{name}.py").write_bytes((FIXTURES / "TL101" / f"{name}.py").read_bytes())
    kept = folder / "pos_exp_log_softmax.expected"
    kept.write_text("hand-written\n", encoding="utf-8")
    new_pos = folder / "pos_copy.py"
    new_pos.write_bytes((FIXTURES / "TL101" / "pos_exp_log_softmax.py").read_bytes())
    fixtures = sorted(folder.glob("*.py"))

    done = subprocess.run(
        [sys.executable, "-m", "tests.rules.golden", "--write-missing", *map(str, fixtures)],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        check=True,
    )

    assert kept.read_text(encoding="utf-8") == "hand-written\n"
    assert (folder / "neg_softmax_for_metrics.expected").read_text(encoding="utf-8") == ""
    expected = (FIXTURES / "TL101" / "pos_exp_log_softmax.expected").read_text(encoding="utf-8")
    assert new_pos.with_suffix(".expected").read_text(encoding="utf-8") == expected
    assert "pos_copy.expected" in done.stdout and "(no findings)" in done.stdout
