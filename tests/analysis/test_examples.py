"""The bundled examples: every planted bug is reported on its line, and nothing else is.

Each `# planted: TL101, TL302` comment in examples/ names the codes expected on that line; the
clean example has none, so it must come out with no finding at all.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torchls.analysis import Workspace, analyze

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PLANTED = re.compile(r"#\s*planted:\s*(?P<codes>TL\d{3}(?:\s*,\s*TL\d{3})*)")


def planted(path: Path) -> set[tuple[int, str]]:
    expected = set()
    for row, line in enumerate(path.read_text().splitlines(), start=1):
        match = PLANTED.search(line)
        if match:
            expected.update((row, code.strip()) for code in match.group("codes").split(","))
    return expected


@pytest.mark.parametrize(
    "example", sorted(EXAMPLES.rglob("*.py")), ids=lambda p: str(p.relative_to(EXAMPLES))
)
def test_example_findings_are_exactly_the_planted_bugs(example: Path) -> None:
    # Suppression comments are ignored so a planted bug cannot hide behind one;
    # the workspace lets two_files/train.py see the softmax in two_files/models.py.
    result = analyze(
        example.read_bytes(), str(example), respect_noqa=False, workspace=Workspace(EXAMPLES)
    )
    found = {(finding.span.start.row, finding.code) for finding in result.findings}
    assert found == planted(example)


def test_examples_cover_buggy_and_clean() -> None:
    examples = sorted(EXAMPLES.rglob("*.py"))
    assert any(planted(path) for path in examples)
    assert any(not planted(path) for path in examples)
