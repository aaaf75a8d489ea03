"""Benchmark: incremental re-analysis against whole-file analysis on real code (issue #14).

The same check as `tests/analysis/test_incremental.py` (its `edits()`: every top-level
function and class deleted, moved down two rows, or emptied with its rows kept; each edit
and its undoing), run on the real corpus files (`bench/real_corpus.py` materialises them
from fetched snapshots; none when they are absent) and, with `--fixtures`, on the rule
fixtures too. For each pair it analyses the earlier text whole, then the edited text twice:
incrementally (`previous_findings`) and whole, and compares code, position, message, fix
and related spans. Prints the pairs, the mismatches (each named), how many edits were
analysed reduced, fell back to the whole file at plan time or during the rules, and the
share of statements the reduced ones re-analysed. No timings: on a fresh tree the first
edit also walks every statement's names, which an editor does once per document.
Usage: python bench/incremental_parity.py [--files 150] [--fixtures]
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "analysis"))

from real_corpus import DEFAULT_MANIFEST, materialise
from test_incremental import edits, shown

import torchls.analysis as analysis
from torchls.analysis import analyze
from torchls.analysis.modes import WholeFileNeeded

ROOT = Path(__file__).resolve().parents[1]


def corpus_files(count: int) -> list[Path]:
    if not DEFAULT_MANIFEST.is_file():
        return []
    entries = json.loads(DEFAULT_MANIFEST.read_text(encoding="utf-8"))["entries"]
    found: list[Path] = []
    for entry in entries:
        root = materialise(entry["repo"], entry["commit"])
        path = root / entry["path"] if root is not None else None
        if path is not None and path.is_file() and path not in found:
            found.append(path)
        if len(found) >= count:
            break
    return found


class Counting:
    """Counts, around `_run_rules`, the reduced analyses and those that fell back."""

    def __init__(self) -> None:
        self.reduced = self.fell_back = 0
        self._run = analysis._run_rules
        analysis._run_rules = self  # type: ignore[assignment]

    def __call__(self, *args: object) -> object:
        if args[-1] is not None:
            self.reduced += 1
        try:
            return self._run(*args)
        except WholeFileNeeded:
            self.fell_back += 1
            raise


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=150, help="real corpus files to edit")
    parser.add_argument("--fixtures", action="store_true", help="the rule fixtures too")
    args = parser.parse_args()
    paths = corpus_files(args.files)
    if args.fixtures:
        paths += sorted((ROOT / "tests" / "rules" / "fixtures").rglob("*.py"))
    if not paths:
        print("no real corpus files (fetch the snapshots: see bench/real_corpus.py)")
        return 0
    counting = Counting()
    pairs = 0
    mismatches: list[str] = []
    redone = total = 0
    for path in paths:
        text = path.read_text(encoding="utf-8", errors="replace")
        try:
            ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        for name, edited in edits(text):
            for before, after, direction in ((text, edited, "edit"), (edited, text, "undo")):
                earlier = analyze(before, str(path))
                if earlier.parsed is None or earlier.error or earlier.stopped_early:
                    continue
                result = analyze(
                    after, str(path), previous=earlier.parsed, previous_findings=earlier.findings
                )
                pairs += 1
                if result.reanalysed is not None:
                    redone += result.reanalysed[0]
                    total += result.reanalysed[1]
                if shown(result.findings) != shown(analyze(after, str(path)).findings):
                    mismatches.append(f"{path}: {direction} of {name}")
    reduced_ok = counting.reduced - counting.fell_back
    print(f"files: {len(paths)}; edit pairs: {pairs}")
    print(f"mismatches with a whole-file analysis: {len(mismatches)}")
    for line in mismatches:
        print("  ", line)
    print(
        f"analysed reduced: {reduced_ok} ({reduced_ok / max(pairs, 1):.0%}); "
        f"whole file at plan time: {pairs - counting.reduced}; "
        f"fell back during the rules: {counting.fell_back}"
    )
    if total:
        print(f"statements re-analysed by the reduced ones: {redone / total:.0%} of theirs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
