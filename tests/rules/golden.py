"""Golden-file support: run one rule on a fixture and render its findings as text lines.

In: a fixture path. Out: lines `row:col: CODE [applicability] message` (1-based column), the
format of the `.expected` files kept next to each fixture. A fixture in `fixtures/TLxxx/` is
checked with rule TLxxx alone, so a new rule never changes another rule's golden files; that
negative fixtures stay quiet under every rule is a separate test. Regenerate a file by
hand-checking `python -m tests.rules.golden FIXTURE.py` output; never copy it over blindly.
`python -m tests.rules.golden --write-missing [FIXTURE.py...]` creates the `.expected` files that
do not exist yet (every fixture's, or the named ones'; an empty file for a quiet negative) and
prints what it wrote, for that hand check; it never touches an existing file.
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


def rule_of(path: Path) -> str:
    """The rule a fixture is pinned to: the name of its folder (`TL207`)."""
    return path.parent.name


def findings_for(path: Path, only: str | None = None) -> list[Finding]:
    """Findings of every rule, or of rule `only` alone."""
    enabled = None if only is None else (lambda code: code == only)
    result = analyze(path.read_bytes(), str(path), enabled=enabled)
    assert result.error is None, result.error
    return result.findings


def rendered(path: Path) -> list[str]:
    """The fixture's findings under its own rule, as `.expected` lines."""
    return [render(finding) for finding in findings_for(path, only=rule_of(path))]


def fixture_files() -> list[Path]:
    return sorted(FIXTURES.glob("*/*.py"))


def write_missing(fixtures: list[Path]) -> list[Path]:
    """Write the `.expected` file of each fixture that has none; the files written."""
    written = []
    for fixture in fixtures:
        expected = fixture.with_suffix(".expected")
        if expected.exists():
            continue
        lines = rendered(fixture)
        expected.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
        written.append(expected)
    return written


def main(argv: list[str]) -> int:
    if argv[:1] == ["--write-missing"]:
        fixtures = [Path(argument) for argument in argv[1:]] or fixture_files()
        for path in write_missing(fixtures):
            body = path.read_text(encoding="utf-8")
            print(f"wrote {path} (check it by hand):\n{body or '(no findings)'}")
        return 0
    for argument in argv:
        print("\n".join(rendered(Path(argument))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
