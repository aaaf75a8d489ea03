"""The repro's findings as diagnostics, layered over the static ones of the same document.

In: a document snapshot, its static diagnostics and the `ReproStore`. Out: one list: the static
diagnostics plus the newest run's TL9xx findings (and a TL803 seen at run time) for this file
(source `torchls-probe`), on the ranges the probe reported, carried to where those lines are
now (`LineMap`). Findings on lines edited since the run are dropped (see repro_state). Related
information (the path of a NaN from its origin to the loss, the first bad value of later
phases) is kept for clients that show it. When a static finding and the runtime one that
confirms it sit on the same line (a loss-contract TL1xx and TL903; TL801 and a TL908 hang;
TL802 and TL910; TL803 and TL803 seen at run time), each message says that the other confirms
it.

Messages come from the run, so they are stripped of control characters; another file named by
a related location is shown only if the run's result holds its lines (read once, safely, when
the run finished) or it is open in the editor: nothing here reads the disk.
"""

from __future__ import annotations

from lsprotocol import types
from pygls.uris import from_fs_path, to_fs_path

from torchls.analysis import Span
from torchls.lsp.convert import SEVERITIES, SOURCE
from torchls.lsp.positions import LineIndex, encoding_of
from torchls.lsp.repro_state import FileTrace, LineMap, ReproStore, real_path
from torchls.lsp.server import Snapshot, TorchLanguageServer
from torchls.probe import untrusted
from torchls.probe.document import Position, Related

PROBE_SOURCE = "torchls-probe"
CONFIRMING_CODE = "TL903"
# Runtime code -> the static codes (prefixes) it confirms on the same line: the loss contracts,
# and the distributed repro's hang, sampler epoch and every-rank checkpoint.
CONFIRMS = {
    CONFIRMING_CODE: ("TL1",),
    "TL908": ("TL801",),
    "TL910": ("TL802",),
    "TL803": ("TL803",),
}


def probe_span(item: Position, mapping: LineMap) -> Span | None:
    """A report position (1-based, code points, end exclusive) as a span in the current text,
    or None when a line it covers was edited or deleted since the run."""
    line, end_line = item["line"] or 1, item["end_line"] or item["line"] or 1
    start, end = mapping.new_row(line), mapping.new_row(end_line)
    if start is None or end is None or not mapping.fresh(range(line, end_line + 1)):
        return None
    column = max((item["column"] or 1) - 1, 0)
    end_column = max((item["end_column"] or 1) - 1, 0)
    if (start, column) > (end, end_column):
        end, end_column = start, column
    return Span.of(start, column, end, end_column)


class ProbeDiagnostics:
    """The diagnostic layer; one per server."""

    def __init__(self, server: TorchLanguageServer, store: ReproStore) -> None:
        self.server = server
        self.store = store

    async def __call__(
        self, snapshot: Snapshot, diagnostics: list[types.Diagnostic], related_support: bool
    ) -> list[types.Diagnostic]:
        path = to_fs_path(snapshot.uri)
        found = self.store.newest_for(path)
        if found is None:
            return diagnostics
        result, trace = found
        mapping = trace.line_map(snapshot.version, snapshot.source)
        # Built here, not through the server: this layer is the last stop of a document's
        # one-way path to its diagnostics (documents → diagnostics → this layer).
        index = LineIndex(snapshot.source, encoding_of(self.server.workspace))
        probe = []
        for item in trace.findings:
            span = probe_span(item, mapping)
            if span is None:
                continue  # the line changed since the run: the finding no longer describes it
            related = None
            if related_support and item.get("related"):
                related = self._related(snapshot, index, mapping, item["related"]) or None
            probe.append(
                types.Diagnostic(
                    range=index.range(span),
                    message=untrusted.terminal(item.get("message", "")),
                    severity=SEVERITIES.get(
                        str(item.get("severity")), types.DiagnosticSeverity.Warning
                    ),
                    code=untrusted.one_line(item.get("code", ""), 8),
                    source=PROBE_SOURCE,
                    related_information=related,
                    data={"repro": result.run_id, "version": snapshot.version},
                )
            )
        mark_confirmations(diagnostics, probe)
        return [*diagnostics, *probe]

    def _related(
        self,
        snapshot: Snapshot,
        index: LineIndex,
        mapping: LineMap,
        items: list[Related],
    ) -> list[types.DiagnosticRelatedInformation]:
        own = to_fs_path(snapshot.uri)
        own_path = real_path(own) if own else None
        related = []
        for item in items:
            filename = item.get("filename")
            if not isinstance(filename, str):
                continue
            if real_path(filename) == own_path:
                uri, target_index, target_map = snapshot.uri, index, mapping
            else:
                located = self._other_file(filename)
                if located is None:
                    continue
                uri, target_index, target_map = located
            span = probe_span(item, target_map)
            if span is None:
                continue
            related.append(
                types.DiagnosticRelatedInformation(
                    location=types.Location(uri=uri, range=target_index.range(span)),
                    message=untrusted.terminal(item.get("message", "")),
                )
            )
        return related

    def _other_file(self, filename: str) -> tuple[str, LineIndex, LineMap] | None:
        """Another file's uri, current text index and map from the run's view of it."""
        uri = from_fs_path(filename)
        if uri is None:
            return None
        found = self.store.newest_for(filename)
        trace: FileTrace | None = found[1] if found is not None else None
        if uri in self.server.docs.states:
            document = self.server.workspace.get_text_document(uri)
            text, version = document.source, document.version
        elif trace is not None:
            # The file as the run saw it, read when the run finished: never again from disk.
            text, version = "\n".join(trace.baseline), None
        else:
            return None
        index = LineIndex(text, encoding_of(self.server.workspace))
        if trace is None:
            lines = index.lines
            return uri, index, LineMap(lines, lines)
        return uri, index, trace.line_map(version, text)


def _lines_of(diagnostic: types.Diagnostic) -> range:
    return range(diagnostic.range.start.line, diagnostic.range.end.line + 1)


def mark_confirmations(static: list[types.Diagnostic], probe: list[types.Diagnostic]) -> None:
    """A static finding and the runtime one that confirms it (`CONFIRMS`: TL1xx and TL903,
    TL801 and TL908, ...) on the same line: say so in both."""
    for runtime in probe:
        prefixes = CONFIRMS.get(str(runtime.code))
        if prefixes is None:
            continue
        lines = set(_lines_of(runtime))
        confirmed = [
            d
            for d in static
            if d.source == SOURCE
            and str(d.code).startswith(prefixes)
            and lines.intersection(_lines_of(d))
        ]
        if not confirmed:
            continue
        for diagnostic in confirmed:
            diagnostic.message += f" (confirmed at run time by the repro: {runtime.code})"
        codes = ", ".join(sorted({str(d.code) for d in confirmed}))
        runtime.message += f" (torchls also finds this statically: {codes})"
