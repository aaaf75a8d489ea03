"""Findings as LSP objects: the conversion every feature that shows findings shares.

Why a module of its own: diagnostics, code actions and the repro's diagnostic layer all turn
findings into `Diagnostic`s; keeping that here lets those features depend on this module and
never on each other. In: analysis `Outcome`s (findings with 1-based rows and code-point
columns). Out: `Diagnostic`s in the client's position encoding, with the fix data code actions
read back, related locations when the client takes them, and notes about the analysis itself.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lsprotocol import types
from pygls.uris import from_fs_path, to_fs_path

from torchls.analysis import Finding
from torchls.lsp.documents import Outcome
from torchls.lsp.positions import LineIndex

if TYPE_CHECKING:
    from torchls.lsp.server import TorchLanguageServer

SOURCE = "torchls"
SEVERITIES = {
    "error": types.DiagnosticSeverity.Error,
    "warning": types.DiagnosticSeverity.Warning,
    "information": types.DiagnosticSeverity.Information,
}


def finding_data(finding: Finding, version: int | None) -> dict[str, Any]:
    """What a diagnostic carries for code actions and clients: fixability and the noqa line."""
    fix = finding.fix
    return {
        "version": version,
        "fix": None
        if fix is None
        else {"applicability": fix.applicability, "message": fix.message},
        "noqaLine": finding.span.start.row - 1,
    }


def _related_location(
    server: TorchLanguageServer, uri: str, index: LineIndex, related: Any
) -> types.DiagnosticRelatedInformation:
    # Reads the other file's open text straight from the workspace (never through a feature).
    target_uri, target_index = uri, index
    if related.filename is not None:
        path = Path(related.filename)
        if not path.is_absolute() and (own := to_fs_path(uri)) is not None:
            path = Path(own).parent / path
        target_uri = from_fs_path(str(path)) or uri
        text = None
        if target_uri in server.docs.states:
            text = server.workspace.get_text_document(target_uri).source
        else:
            with contextlib.suppress(OSError, UnicodeDecodeError):
                text = path.read_text(encoding="utf-8")
        # Without the other file's text, code-point columns are the best available guess.
        target_index = (
            LineIndex(text, index.encoding) if text is not None else LineIndex("", "utf-32")
        )
    return types.DiagnosticRelatedInformation(
        location=types.Location(uri=target_uri, range=target_index.range(related.span)),
        message=related.message,
    )


def _note(message: str) -> types.Diagnostic:
    """An information diagnostic at the top of the file, about the analysis itself."""
    return types.Diagnostic(
        range=types.Range(types.Position(0, 0), types.Position(0, 0)),
        message=message,
        severity=types.DiagnosticSeverity.Information,
        source=SOURCE,
    )


def to_diagnostics(
    server: TorchLanguageServer,
    outcome: Outcome,
    related_support: bool,
    encoding: str | None = None,
) -> list[types.Diagnostic]:
    """The LSP diagnostics for one analysis outcome, in the snapshot's coordinates
    (`encoding`: the client's position encoding, when the caller has it already)."""
    diagnostics = []
    if outcome.error:
        # A file torchls could not analyse (too large, not text, an internal error) must not
        # look like a clean one.
        diagnostics.append(_note(f"torchls: not analysed: {outcome.error}"))
    if outcome.stopped_early:
        # Silence would read as "no bugs"; say that part of the file went unchecked.
        diagnostics.append(_note(f"torchls: {outcome.stopped_early}"))
    if not outcome.findings:
        return diagnostics
    snapshot = outcome.snapshot
    index = LineIndex(snapshot.source, encoding or server.position_encoding)
    for finding in outcome.findings:
        related = None
        if related_support and finding.related:
            related = [
                _related_location(server, snapshot.uri, index, item) for item in finding.related
            ]
        diagnostics.append(
            types.Diagnostic(
                range=index.range(finding.span),
                message=finding.message,
                severity=SEVERITIES.get(finding.severity, types.DiagnosticSeverity.Warning),
                code=finding.code,
                source=SOURCE,
                related_information=related,
                data=finding_data(finding, snapshot.version),
            )
        )
    return diagnostics
