"""Project fixtures: constructs that span files (a base class, a set-up module) checked with
the workspace resolver, as `torchls check` on a folder does.

A project fixture is a folder `fixtures/TLxxx/pos_*/` or `neg_*/` holding a `train.py` and the
modules it imports. A positive folder's `train.py` must be reported under its rule exactly as
its `expected` file says (`row:col: CODE message`, then `  related FILE:row` lines), with the
related location in the other file; a negative folder's files stay quiet under every rule.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.rules.golden import FIXTURES, render
from torchls.analysis import Finding, Workspace, analyze


def project_folders(prefix: str) -> list[Path]:
    return sorted(path for path in FIXTURES.glob(f"*/{prefix}_*") if path.is_dir())


def project_findings(folder: Path, entry: Path, only: str | None = None) -> list[Finding]:
    enabled = None if only is None else (lambda code: code == only)
    workspace = Workspace(folder)
    result = analyze(entry.read_text(), str(entry), workspace=workspace, enabled=enabled)
    assert result.error is None, result.error
    return result.findings


def rendered(folder: Path) -> list[str]:
    lines = []
    for finding in project_findings(folder, folder / "train.py", only=folder.parent.name):
        lines.append(render(finding))
        for related in finding.related:
            where = Path(related.filename).name if related.filename else "train.py"
            lines.append(f"  related {where}:{related.span.start.row} {related.message}")
    return lines


def test_there_are_project_fixtures() -> None:
    assert project_folders("pos") and project_folders("neg")


@pytest.mark.parametrize(
    "folder", project_folders("pos"), ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_positive_project_matches_expected(folder: Path) -> None:
    expected = [line for line in (folder / "expected").read_text().splitlines() if line.strip()]
    found = rendered(folder)
    assert found == expected
    assert any(line.startswith("  related ") and "train.py" not in line for line in found), (
        "the cause in the other file is not related"
    )


@pytest.mark.parametrize(
    "folder", project_folders("neg"), ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_negative_project_is_quiet_under_every_rule(folder: Path) -> None:
    for module in sorted(folder.glob("*.py")):
        assert project_findings(folder, module) == [], f"{module.name} is not quiet"


if __name__ == "__main__":
    import sys

    for argument in sys.argv[1:]:
        print("\n".join(rendered(Path(argument))))
