"""Golden-file support: run the analysis on a fixture and render its findings as text lines.

In: a fixture path. Out: lines `row:col: CODE [applicability] message` (1-based column), the
format of the `.expected` files kept next to each fixture. Regenerate a file by hand-checking
`python -m tests.rules.golden FIXTURE.py` output; never copy it over blindly.
"""

from __future__ import annotations

import sys
from pathlib import Path

from torchls.analysis import Finding, analyze

FIXTURES = Path(__file__).parent / "fixtures"


def render(finding: Finding) -> str:
    applicability = f" [{finding.fix.applicability}]" if finding.fix else ""
    start = finding.span.start
    return f"{start.row}:{start.column + 1}: {finding.code}{applicability} {finding.message}"


def findings_for(path: Path) -> list[Finding]:
    result = analyze(path.read_bytes(), str(path))
    assert result.error is None, result.error
    return result.findings


def rendered(path: Path) -> list[str]:
    return [render(finding) for finding in findings_for(path)]


def fixture_files() -> list[Path]:
    return sorted(FIXTURES.glob("*/*.py"))


if __name__ == "__main__":
    for argument in sys.argv[1:]:
        print("\n".join(rendered(Path(argument))))
