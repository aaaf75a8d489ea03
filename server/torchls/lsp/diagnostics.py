"""Diagnostics: findings → LSP `Diagnostic`s, pushed on open/change/save or pulled on request.

In: document events and `textDocument/diagnostic` requests. Out: `publishDiagnostics`
notifications (push, the default) or diagnostic reports (pull, only for clients that announce
`textDocument.diagnostic`; then nothing is pushed to them, as esbonio does).

Stale results are never published: each request takes a numbered snapshot of the text, the
newest request that decides to publish "claims" the document and cancels older work, and a
result is dropped unless its request still holds the claim and (when running on type) its
snapshot still is the document's text.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any, Literal

from lsprotocol import types
from pygls.capabilities import get_capability
from pygls.exceptions import JsonRpcException
from pygls.uris import from_fs_path, to_fs_path

from torchls.analysis import Finding
from torchls.lsp.positions import LineIndex
from torchls.lsp.server import DocumentState, Outcome, Snapshot, TorchLanguageServer

logger = logging.getLogger(__name__)

SOURCE = "torchls"
Trigger = Literal["open", "change", "save", "settings", "dependency", "repro"]

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
    target_uri, target_index = uri, index
    if related.filename is not None:
        path = Path(related.filename)
        if not path.is_absolute() and (own := to_fs_path(uri)) is not None:
            path = Path(own).parent / path
        target_uri = from_fs_path(str(path)) or uri
        text = None
        if target_uri in server.documents:
            text = server.workspace.get_text_document(target_uri).source
        else:
            with contextlib.suppress(OSError, UnicodeDecodeError):
                text = path.read_text(encoding="utf-8")
        # Without the other file's text, code-point columns are the best available guess.
        target_index = server.line_index(text) if text is not None else LineIndex("", "utf-32")
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
    server: TorchLanguageServer, outcome: Outcome, related_support: bool
) -> list[types.Diagnostic]:
    """The LSP diagnostics for one analysis outcome, in the snapshot's coordinates."""
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
    index = server.line_index(snapshot.source)
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


def _related_support(server: TorchLanguageServer, pull: bool) -> bool:
    capabilities = server.client_capabilities
    push_support = get_capability(
        capabilities, "text_document.publish_diagnostics.related_information", False
    )
    if not pull:
        return bool(push_support)
    pull_support = get_capability(
        capabilities, "text_document.diagnostic.related_information", False
    )
    return bool(pull_support or push_support)


# -- push ---------------------------------------------------------------------------------------


def request_diagnostics(server: TorchLanguageServer, uri: str, trigger: Trigger) -> None:
    """Schedule a publish for `uri` after `trigger`; newer requests supersede older ones."""
    state = server.documents.get(uri)
    if state is None or server.pull_diagnostics:
        return
    snapshot = server.snapshot(uri)
    if snapshot is None:
        return
    state.sequence += 1
    state.keep(asyncio.ensure_future(_publish(server, state, state.sequence, trigger, snapshot)))


def republish_all(server: TorchLanguageServer) -> None:
    """After a settings change: fresh diagnostics for every open document."""
    if server.pull_diagnostics:
        refresh = get_capability(
            server.client_capabilities, "workspace.diagnostics.refresh_support", False
        )
        if refresh:
            server.workspace_diagnostic_refresh(None)
        return
    for uri in list(server.documents):
        request_diagnostics(server, uri, "settings")


async def _publish(
    server: TorchLanguageServer,
    state: DocumentState,
    sequence: int,
    trigger: Trigger,
    snapshot: Snapshot,
) -> None:
    try:
        await server.wait_for_settings()
        settings = server.settings
        if settings.run == "onSave":
            if trigger in ("change", "dependency"):
                return  # typing does not publish; the diagnostics of the last save stay
            if trigger in ("settings", "repro") and state.saved is not None:
                snapshot = state.saved
        if sequence < state.claimed:
            return  # a newer request already owns this document's next publish
        state.claimed = sequence
        current = asyncio.current_task()
        if state.task is not None and state.task is not current and not state.task.done():
            state.task.cancel()  # drops its queued analysis too
        state.task = current
        diagnostics: list[types.Diagnostic] = []
        outcome = None
        related = _related_support(server, pull=False)
        if settings.enable:
            outcome = await server.analyse(snapshot)
            diagnostics = to_diagnostics(server, outcome, related)
            diagnostics = await server.layered_diagnostics(snapshot, diagnostics, related)
        if not _still_wanted(server, state, sequence, snapshot):
            return
        server.text_document_publish_diagnostics(
            types.PublishDiagnosticsParams(
                uri=snapshot.uri, version=snapshot.version, diagnostics=diagnostics
            )
        )
        if outcome is None or not outcome.needs_cross_file:
            return
        # In-file findings are out; now follow imports into other project files (jedi), off
        # the typing path, and publish again only if that found something different.
        full = await server.analyse(snapshot, cross_file=True)
        if full.findings == outcome.findings or not _still_wanted(
            server, state, sequence, snapshot
        ):
            return
        diagnostics = to_diagnostics(server, full, related)
        diagnostics = await server.layered_diagnostics(snapshot, diagnostics, related)
        if not _still_wanted(server, state, sequence, snapshot):
            return
        server.text_document_publish_diagnostics(
            types.PublishDiagnosticsParams(
                uri=snapshot.uri, version=snapshot.version, diagnostics=diagnostics
            )
        )
    except asyncio.CancelledError:
        raise
    except Exception:
        logger.exception("publishing diagnostics for %s failed", snapshot.uri)


def _still_wanted(
    server: TorchLanguageServer, state: DocumentState, sequence: int, snapshot: Snapshot
) -> bool:
    if server.documents.get(snapshot.uri) is not state or state.claimed != sequence:
        return False  # closed, reopened or superseded while we worked
    # An outdated version is never published: the request for the newer one does that.
    return not (server.settings.run == "onType" and not server.is_current(snapshot))


# -- pull ---------------------------------------------------------------------------------------


async def pull_diagnostics(
    server: TorchLanguageServer, params: types.DocumentDiagnosticParams
) -> types.FullDocumentDiagnosticReport:
    """Answer `textDocument/diagnostic` for one document."""
    uri = params.text_document.uri
    await server.wait_for_settings()
    settings = server.settings
    state = server.documents.get(uri)
    if state is not None:
        snapshot = server.snapshot(uri)
        if settings.run == "onSave" and state.saved is not None:
            snapshot = state.saved
    else:
        try:
            document = server.workspace.get_text_document(uri)
            snapshot = Snapshot(uri, document.version, document.source)
        except (OSError, UnicodeDecodeError):
            snapshot = None
    if snapshot is None or not settings.enable:
        return types.FullDocumentDiagnosticReport(items=[], result_id=None)
    # A pull answers once, so it includes what other project files contribute.
    outcome = await server.analyse(snapshot, cross_file=True)
    if state is not None and settings.run == "onType" and not server.is_current(snapshot):
        # The text changed while we analysed: ask the client to pull again rather than hand it
        # diagnostics for a version it no longer has.
        raise JsonRpcException(
            message="document changed during analysis",
            code=types.LSPErrorCodes.ServerCancelled.value,
            data={"retriggerRequest": True},
        )
    related = _related_support(server, pull=True)
    items = to_diagnostics(server, outcome, related)
    items = await server.layered_diagnostics(snapshot, items, related)
    return types.FullDocumentDiagnosticReport(
        items=items,
        result_id=f"{snapshot.version}:{server.settings_generation}:{server.repro_store.generation}",
    )


def _enable_pull(server: TorchLanguageServer, params: types.InitializeParams) -> None:
    """Register pull diagnostics only for clients that announce them (esbonio's switch)."""
    if get_capability(params.capabilities, "text_document.diagnostic", None) is None:
        return
    server.pull_diagnostics = True

    @server.feature(
        types.TEXT_DOCUMENT_DIAGNOSTIC,
        types.DiagnosticOptions(
            identifier=SOURCE, inter_file_dependencies=False, workspace_diagnostics=False
        ),
    )
    async def document_diagnostic(
        ls: TorchLanguageServer, params: types.DocumentDiagnosticParams
    ) -> types.FullDocumentDiagnosticReport:
        return await pull_diagnostics(ls, params)


def refresh_dependents(server: TorchLanguageServer, uri: str) -> None:
    """`uri` changed: re-check the open documents whose findings came through it (a model
    class's forward, a factory) so they never show results for its old text."""
    path = to_fs_path(uri)
    if path is None or server._project is None:
        return
    dependents = server.project.dependents_of(path)
    if not dependents:
        return
    server.dependencies_changed()
    for other in list(server.documents):
        own = to_fs_path(other)
        if other != uri and own is not None and Path(own).resolve() in dependents:
            request_diagnostics(server, other, "dependency")


# -- registration -------------------------------------------------------------------------------


def register(server: TorchLanguageServer) -> None:
    """Attach the document-sync and diagnostics handlers to `server`."""
    server.initialize_hooks.append(lambda params: _enable_pull(server, params))

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: TorchLanguageServer, params: types.DidOpenTextDocumentParams) -> None:
        uri = params.text_document.uri
        if (old := ls.documents.get(uri)) is not None:
            old.cancel_all()  # a repeated didOpen replaces the document
        state = ls.documents[uri] = DocumentState()
        state.saved = ls.snapshot(uri)
        request_diagnostics(ls, uri, "open")

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: TorchLanguageServer, params: types.DidChangeTextDocumentParams) -> None:
        uri = params.text_document.uri
        request_diagnostics(ls, uri, "change")
        refresh_dependents(ls, uri)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: TorchLanguageServer, params: types.DidSaveTextDocumentParams) -> None:
        uri = params.text_document.uri
        if (state := ls.documents.get(uri)) is not None:
            state.saved = ls.snapshot(uri)
        ls.forget_results(uri)  # saving is when users expect pyproject.toml edits to count
        request_diagnostics(ls, uri, "save")

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: TorchLanguageServer, params: types.DidCloseTextDocumentParams) -> None:
        uri = params.text_document.uri
        state = ls.documents.pop(uri, None)
        if state is not None:
            state.cancel_all()
        if not ls.pull_diagnostics:
            ls.text_document_publish_diagnostics(
                types.PublishDiagnosticsParams(uri=uri, diagnostics=[])
            )
