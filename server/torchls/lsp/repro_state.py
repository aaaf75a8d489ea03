"""What the last repro runs found, per file, and where those lines are in the text as it is now.

In: a finished run's report (the JSON of docs/probe-report.md) and the text of each file as the
run saw it (its *baseline*). Out: `ReproStore`, which the diagnostics layer and the hover ask
"which traces and findings belong to this file", and `LineMap`, which carries a baseline row to
the row it has in the document's current text, or says that the line was edited since.

Stale marking: a run's results are tied to the text it ran. For each document version the
baseline is diffed against the current text (common prefix and suffix first, `difflib` on the
rest), so lines inserted or deleted above a traced line only move its trace. A line inside a
changed block is *stale*: its hover says so (and still shows the old trace), and the probe's
diagnostics on it are dropped, since their ranges and messages describe code that no longer
exists. Unchanged lines keep their diagnostics and traces. A new run replaces its predecessor's
results; `clear` drops them.

The report comes from the run and may be forged: the files it names are read only through
`ProjectSources` (inside the project, no links, not /proc or /dev, bounded, once per run), and
the result keeps those lines, so later refreshes and hovers never read the disk again.

Nothing here imports pygls or the probe's runner: it is plain data, unit-testable on its own.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from torchls.analysis.source import split_lines
from torchls.probe.document import Event, Finding, LineRecord, Report
from torchls.probe.sources import ProjectSources, source_lines
from torchls.records import field, record


def real_path(path: str | os.PathLike[str]) -> str:
    """One spelling per file, so report paths and document paths compare equal."""
    return os.path.realpath(os.fspath(path))


class LineMap:
    """Baseline rows (the run's text) ↔ current rows (the document now), 1-based."""

    def __init__(self, old: Sequence[str], new: Sequence[str]) -> None:
        self.identical = list(old) == list(new)
        self._new_of: dict[int, int] = {}  # baseline row -> current row, unchanged lines only
        self._old_of: dict[int, tuple[int, bool]] = {}  # current row -> (baseline row, stale)
        if self.identical:
            self._rows = len(old)
            return
        self._rows = -1
        prefix = 0
        limit = min(len(old), len(new))
        while prefix < limit and old[prefix] == new[prefix]:
            prefix += 1
        suffix = 0
        while suffix < limit - prefix and old[-1 - suffix] == new[-1 - suffix]:
            suffix += 1
        for row in range(prefix):
            self._same(row + 1, row + 1)
        for k in range(suffix):
            self._same(len(old) - k, len(new) - k)
        # Only the block between the common prefix and suffix needs a real diff: usually a few
        # lines, so this stays cheap enough for the event loop.
        old_mid, new_mid = old[prefix : len(old) - suffix], new[prefix : len(new) - suffix]
        matcher = difflib.SequenceMatcher(None, old_mid, new_mid, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag == "equal":
                for k in range(i2 - i1):
                    self._same(prefix + i1 + k + 1, prefix + j1 + k + 1)
            elif tag == "replace":
                # An edited line keeps its place, so its (old) trace can still be shown, marked.
                for k in range(min(i2 - i1, j2 - j1)):
                    self._old_of[prefix + j1 + k + 1] = (prefix + i1 + k + 1, True)

    def _same(self, old_row: int, new_row: int) -> None:
        self._new_of[old_row] = new_row
        self._old_of[new_row] = (old_row, False)

    def new_row(self, old_row: int) -> int | None:
        """Where an unchanged baseline row is now; None when it was edited or deleted."""
        if self.identical:
            return old_row if 1 <= old_row <= self._rows else None
        return self._new_of.get(old_row)

    def old_row(self, new_row: int) -> tuple[int, bool] | None:
        """(baseline row, stale) for a current row; None for a line the run never saw."""
        if self.identical:
            return (new_row, False) if 1 <= new_row <= self._rows else None
        return self._old_of.get(new_row)

    def fresh(self, old_rows: range) -> bool:
        """Whether every baseline row in `old_rows` is unchanged."""
        return all(self.new_row(row) is not None for row in old_rows)


@record
class FileTrace:
    """One file's share of a run: its baseline text, findings, traced lines and NaN events."""

    path: str
    baseline: list[str]
    findings: list[Finding] = field(default_factory=list)
    lines: dict[int, LineRecord] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    _map: tuple[tuple[int | None, str], LineMap] | None = None

    def line_map(self, version: int | None, text: str) -> LineMap:
        """The map from the baseline to `text`, cached for the newest document version."""
        key = (version, text)
        if self._map is not None and self._map[0] == key:
            return self._map[1]
        mapping = LineMap(self.baseline, split_lines(text))
        self._map = (key, mapping)
        return mapping

    def baseline_line(self, row: int) -> str:
        return self.baseline[row - 1] if 1 <= row <= len(self.baseline) else ""


@record
class ReproResult:
    """One finished run, started on document `uri`."""

    uri: str
    run_id: int
    data: Report
    files: dict[str, FileTrace]

    @property
    def status(self) -> str:
        return self.data["status"]

    @property
    def runner(self) -> str:
        return str(self.data["timing"].get("runner") or "")

    def event(self, index: int) -> Event | None:
        for event in self.data["nonfinite"]["events"]:
            if event["index"] == index:
                return event
        return None

    @property
    def chain(self) -> list[Event]:
        """The non-finite events from the first origin to the loss, in order."""
        chain = self.data["nonfinite"]["chain"]
        return [e for i in chain if (e := self.event(i)) is not None]

    @property
    def first_event(self) -> Event | None:
        first = self.data["nonfinite"].get("first")
        return self.event(first) if first is not None else None


def build_result(
    uri: str,
    run_id: int,
    data: Report,
    baselines: dict[str, list[str]],
    root: str | os.PathLike[str] | None = None,
) -> ReproResult:
    """Sort a report's findings, lines and events by file. `baselines` maps real paths to the
    text each file had when the run started; other files are read now, through
    `ProjectSources` under `root` (the workspace the host chose; by default the folder of the
    document the run started on)."""
    files: dict[str, FileTrace] = {}
    refused: set[str] = set()
    if root is None:
        own = _fs_path(uri)
        root = os.path.dirname(own) if own else None
    sources = ProjectSources(root)

    def trace_of(filename: Any) -> FileTrace | None:
        if not isinstance(filename, str) or not filename or filename in refused:
            return None
        path = real_path(filename)
        if path not in files:
            baseline = baselines.get(path)
            if baseline is None:
                baseline = sources.lines(filename)
            if baseline is None:
                refused.add(filename)
                return None
            files[path] = FileTrace(path, baseline)
        return files[path]

    for finding in data["findings"]:
        if (trace := trace_of(finding["filename"])) is not None:
            trace.findings.append(finding)
    for line_record in data["lines"]:
        if (trace := trace_of(line_record["filename"])) is not None:
            trace.lines[line_record["line"]] = line_record  # an int: the schema says so
    for event in data["nonfinite"]["events"]:
        if (trace := trace_of(event["filename"])) is not None:
            trace.events.append(event)
    return ReproResult(uri, run_id, data, files)


def _fs_path(uri: str) -> str | None:
    if not uri.startswith("file://"):
        return None
    from urllib.parse import unquote, urlparse

    return unquote(urlparse(uri).path) or None


def _read_lines(path: str) -> list[str] | None:
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    return source_lines(path, data)


def read_baseline(path: str | Path) -> list[str] | None:
    """The lines of `path` on disk (what a run about to start will execute)."""
    return _read_lines(real_path(path))


class ReproStore:
    """The newest result per document the repro ran on; lookups by file path."""

    def __init__(self) -> None:
        self._results: dict[str, ReproResult] = {}
        self.generation = 0  # bumped on every change, for pull diagnostics' result ids

    def put(self, result: ReproResult) -> set[str]:
        """Install `result` (replacing the previous run on its document); returns the paths
        whose diagnostics or hovers changed."""
        affected = set(result.files)
        old = self._results.pop(result.uri, None)
        if old is not None:
            affected |= set(old.files)
        self._results[result.uri] = result
        self.generation += 1
        return affected

    def clear(self, uri: str | None = None) -> set[str]:
        """Drop the result of the run on `uri` (all results when None); returns affected paths."""
        if uri is None:
            dropped = list(self._results.values())
            self._results.clear()
        else:
            dropped = [r for r in (self._results.pop(uri, None),) if r is not None]
        if dropped:
            self.generation += 1
        return {path for result in dropped for path in result.files}

    def get(self, uri: str) -> ReproResult | None:
        return self._results.get(uri)

    def for_path(self, path: str | None) -> Iterator[tuple[ReproResult, FileTrace]]:
        """Every result with something for `path`, newest run first."""
        if path is None or not self._results:
            return  # nothing to look in: spare the path resolution (asked at every publish)
        key = real_path(path)
        for result in sorted(self._results.values(), key=lambda r: -r.run_id):
            trace = result.files.get(key)
            if trace is not None:
                yield result, trace

    def newest_for(self, path: str | None) -> tuple[ReproResult, FileTrace] | None:
        return next(self.for_path(path), None)

    def __bool__(self) -> bool:
        return bool(self._results)
