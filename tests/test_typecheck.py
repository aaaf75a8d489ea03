"""A ratchet on the type checker: mypy's error count per file may go down, never up.

Why: the code base carries a few hundred mypy errors (most of them attributes that the mixins of
`torchls.analysis.facts` reach through `self`), too many to fix at once and too many to read for
the one a change adds. The committed baseline `tests/mypy-baseline.json` ({file: count}) holds
today's counts; a file whose count grows, or a file that had none and now has some, fails the
test with its errors printed. A file whose count went down is reported with the command that
refreshes the baseline, so the gain is kept.
In: mypy, run in a subprocess with the settings of `[tool.mypy]` in pyproject.toml (the cache in
`.mypy_cache`). Out: the assertion; `python tests/test_typecheck.py --update` rewrites the
baseline from the tree as it is.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "tests" / "mypy-baseline.json"
REFRESH = ".venv/bin/python tests/test_typecheck.py --update"
# `path:line: error: message  [code]` (a column after the line when mypy is asked for one).
ERROR = re.compile(r"^(?P<path>[^:\n]+):(?P<line>\d+)(?::\d+)?: error: (?P<message>.*)$")


def run_mypy() -> tuple[int, str]:
    """mypy over the files `[tool.mypy]` names, from the repository root: its exit status and
    its report (one line per error, no summary)."""
    completed = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", "--no-pretty", "--no-color-output"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    return completed.returncode, completed.stdout + completed.stderr


def errors_by_file(report: str) -> dict[str, list[str]]:
    """The error lines of a mypy report, grouped by file (paths with `/`); notes are not
    errors and are left out."""
    found: dict[str, list[str]] = {}
    for line in report.splitlines():
        match = ERROR.match(line)
        if match:
            found.setdefault(match.group("path").replace("\\", "/"), []).append(line)
    return found


def compare(baseline: dict[str, int], current: dict[str, int]) -> tuple[list[str], list[str]]:
    """(files whose count went up or that are new with errors, files whose count went down or
    that have none left), each as `path: before -> now`."""
    worse = [
        f"{path}: {baseline.get(path, 0)} -> {count}"
        for path, count in sorted(current.items())
        if count > baseline.get(path, 0)
    ]
    better = [
        f"{path}: {count} -> {current.get(path, 0)}"
        for path, count in sorted(baseline.items())
        if current.get(path, 0) < count
    ]
    return worse, better


def measure() -> dict[str, list[str]]:
    status, report = run_mypy()
    found = errors_by_file(report)
    # 0: no errors, 1: errors reported; anything else (2: a crash, a bad setting, mypy missing)
    # is no count at all, and an exit of 1 with no error line read is a format this does not know.
    if status not in (0, 1) or (status == 1 and not found):
        raise AssertionError(
            f"mypy did not report (exit {status}); it comes with the test extras "
            f"(pip install -e '.[test]'):\n{report[-4000:]}"
        )
    return found


def load_baseline() -> dict[str, int]:
    return json.loads(BASELINE.read_text(encoding="utf-8"))


def write_baseline(found: dict[str, list[str]]) -> dict[str, int]:
    counts = {path: len(lines) for path, lines in sorted(found.items())}
    BASELINE.write_text(json.dumps(counts, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return counts


def test_no_file_has_more_mypy_errors_than_the_baseline() -> None:
    found = measure()
    current = {path: len(lines) for path, lines in found.items()}
    worse, better = compare(load_baseline(), current)
    if better:
        print(
            "mypy errors went down (refresh the baseline to keep it: "
            + REFRESH
            + "):\n  "
            + "\n  ".join(better)
        )
    if worse:
        shown = "\n".join(
            f"{entry}\n    " + "\n    ".join(found[entry.split(":", 1)[0]]) for entry in worse
        )
        raise AssertionError(
            "more mypy errors than tests/mypy-baseline.json allows (fix them; the baseline only "
            f"goes down):\n{shown}"
        )


def test_the_ratchet_reads_mypy_lines_and_sees_a_count_go_up_or_down() -> None:
    # The check above must not pass vacuously: a report it cannot read, or a comparison that
    # misses a new file, would let every new error through.
    report = "\n".join(
        [
            'a/x.py:3: error: Name "y" is not defined  [name-defined]',
            "a/x.py:4:7: error: Incompatible types in assignment  [assignment]",
            'a/x.py:4: note: See "https://mypy.readthedocs.io"',
            'b/z.py:1: error: Module "q" has no attribute "r"  [attr-defined]',
        ]
    )
    found = errors_by_file(report)
    assert {path: len(lines) for path, lines in found.items()} == {"a/x.py": 2, "b/z.py": 1}
    worse, better = compare({"a/x.py": 1, "c/gone.py": 4}, {"a/x.py": 2, "b/z.py": 1})
    assert worse == ["a/x.py: 1 -> 2", "b/z.py: 0 -> 1"]
    assert better == ["c/gone.py: 4 -> 0"]
    assert compare({"a/x.py": 2}, {"a/x.py": 2}) == ([], [])


def test_the_baseline_holds_positive_counts_of_files_under_the_checked_roots() -> None:
    # A hand edit that writes 0 or a path outside the checked roots would hide nothing today but
    # reads as a count that can never be met; the refresh writes neither.
    baseline = load_baseline()
    assert all(isinstance(count, int) and count > 0 for count in baseline.values())
    assert all(path.startswith(("server/torchls/", "probes/torchls_probe/")) for path in baseline)


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit(f"usage: {REFRESH}")
    counts = write_baseline(measure())
    print(
        f"{BASELINE.relative_to(ROOT)}: {sum(counts.values())} errors in {len(counts)} files",
        file=sys.stderr,
    )
