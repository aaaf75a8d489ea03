"""Diagnostics: analysis results → `publishDiagnostics`, or answers to pull requests.

In: `Results` events from the open documents (`documents.Documents`, which owns text sync,
snapshots, the analysis and its cache, and decides which request may publish), settings
changes, and `textDocument/diagnostic` requests. Out: `publishDiagnostics` notifications
(push, the default) or diagnostic reports (pull, only for clients that announce
`textDocument.diagnostic`; then nothing is pushed to them, as esbonio does).

The push path is one-way: documents → this module (conversion in `convert`, the repro's
layers) → the client. A result is dropped unless its request still holds the document's claim
and (when running on type) its snapshot still is the document's text, checked again after the
layers ran.
"""

from __future__ import annotations

import asyncio
import logging

from lsprotocol import types
from pygls.capabilities import get_capability
from pygls.exceptions import JsonRpcException

from torchls.lsp.convert import SOURCE, to_diagnostics
from torchls.lsp.documents import Results, Snapshot
from torchls.lsp.server import TorchLanguageServer

logger = logging.getLogger(__name__)

__all__ = ["SOURCE", "pull_diagnostics", "register"]


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


async def publish(server: TorchLanguageServer, results: Results) -> None:
    """Publish one document's results (the `Results` listener)."""
    related = _related_support(server, pull=False)
    diagnostics: list[types.Diagnostic] = []
    snapshot = results.snapshot
    try:
        if server.settings.enable:
            diagnostics = to_diagnostics(server, results.outcome, related, results.encoding)
            diagnostics = await layered_diagnostics(server, snapshot, diagnostics, related)
        if not _still_wanted(server, results):
            return
        if snapshot.notebook is not None:
            _publish_cells(server, results, diagnostics)
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


def _publish_cells(
    server: TorchLanguageServer, results: Results, diagnostics: list[types.Diagnostic]
) -> None:
    """A notebook's diagnostics, one publish per code cell (an empty one clears a cell), and
    an empty one for each cell that had some and is gone."""
    snapshot, state = results.snapshot, results.state
    assert snapshot.notebook is not None
    cells = snapshot.notebook
    split = cells.split_diagnostics(snapshot.uri, diagnostics)
    for uri in state.published_cells:
        if uri not in split:
            server.text_document_publish_diagnostics(
                types.PublishDiagnosticsParams(uri=uri, diagnostics=[])
            )
    for uri, version in zip(cells.uris, cells.versions, strict=True):
        server.text_document_publish_diagnostics(
            types.PublishDiagnosticsParams(uri=uri, version=version, diagnostics=split[uri])
        )
    state.published_cells = cells.uris


def _still_wanted(server: TorchLanguageServer, results: Results) -> bool:
    """The same test the documents made before handing `results` on, made again after the
    layers' awaits, from the data the event carries (pygls holds the current text)."""
    state, snapshot = results.state, results.snapshot
    if state.closed or state.claimed != results.sequence:
        return False  # closed, reopened or superseded while we worked
    if not results.on_type:
        return True
    # An outdated version is never published: the request for the newer one does that.
    return server.docs.is_current(snapshot)


async def layered_diagnostics(
    server: TorchLanguageServer,
    snapshot: Snapshot,
    diagnostics: list[types.Diagnostic],
    related_support: bool,
) -> list[types.Diagnostic]:
    """`diagnostics` (the static ones of `snapshot`) with every diagnostic layer applied."""
    for layer in server.diagnostic_layers:
        try:
            diagnostics = await layer(snapshot, diagnostics, related_support)
        except asyncio.CancelledError:
            raise
        except Exception:  # a layer's bug must not cost the user the static findings
            logger.exception("a diagnostic layer failed for %s", snapshot.uri)
    return diagnostics


def _ask_client_to_pull(server: TorchLanguageServer) -> None:
    """Pull clients see new settings or repro results only when they pull again."""
    refresh = get_capability(
        server.client_capabilities, "workspace.diagnostics.refresh_support", False
    )
    if refresh:
        server.workspace_diagnostic_refresh(None)


# -- pull ---------------------------------------------------------------------------------------


async def pull_diagnostics(
    server: TorchLanguageServer, params: types.DocumentDiagnosticParams
) -> types.FullDocumentDiagnosticReport:
    """Answer `textDocument/diagnostic` for one document."""
    uri = params.text_document.uri
    await server.docs.wait_for_settings()
    if (notebook_uri := server.docs.notebook_of(uri)) is not None:
        return await _pull_cell(server, uri, notebook_uri)
    settings = server.settings
    state = server.docs.states.get(uri)
    if state is not None:
        snapshot = server.docs.snapshot(uri)
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
    items = await _pulled_items(server, snapshot, check_current=state is not None)
    return types.FullDocumentDiagnosticReport(items=items, result_id=_result_id(server, snapshot))


async def _pulled_items(
    server: TorchLanguageServer, snapshot: Snapshot, check_current: bool
) -> list[types.Diagnostic]:
    """The diagnostics a pull hands back for `snapshot` (a file or a whole notebook): its
    analysis with what other project files contribute (a pull answers once), then the layers."""
    outcome = await server.docs.analyse(snapshot, cross_file=True)
    if check_current and server.settings.run == "onType" and not server.docs.is_current(snapshot):
        # The text changed while we analysed: ask the client to pull again rather than hand it
        # diagnostics for a version it no longer has.
        raise JsonRpcException(
            message="document changed during analysis",
            code=types.LSPErrorCodes.ServerCancelled.value,
            data={"retriggerRequest": True},
        )
    related = _related_support(server, pull=True)
    items = to_diagnostics(server, outcome, related)
    return await layered_diagnostics(server, snapshot, items, related)


def _result_id(server: TorchLanguageServer, snapshot: Snapshot) -> str:
    """Changes with the text, the settings and the repro results: what a pull's answer is of."""
    return f"{snapshot.version}:{server.settings_generation}:{server.repro_store.generation}"


async def _pull_cell(
    server: TorchLanguageServer, cell_uri: str, notebook_uri: str
) -> types.FullDocumentDiagnosticReport:
    """A pull for one cell: the notebook's module analysed (cached: the other cells' pulls of
    the same version reuse it), this cell's part of its diagnostics."""
    settings = server.settings
    state = server.docs.states.get(notebook_uri)
    snapshot = server.docs.snapshot(notebook_uri)
    if state is not None and settings.run == "onSave" and state.saved is not None:
        snapshot = state.saved
    if snapshot is None or snapshot.notebook is None or not settings.enable:
        return types.FullDocumentDiagnosticReport(items=[], result_id=None)
    items = await _pulled_items(server, snapshot, check_current=True)
    split = snapshot.notebook.split_diagnostics(notebook_uri, items)
    return types.FullDocumentDiagnosticReport(
        items=split.get(cell_uri, []), result_id=_result_id(server, snapshot)
    )


def _enable_pull(server: TorchLanguageServer, params: types.InitializeParams) -> None:
    """Register pull diagnostics only for clients that announce them (esbonio's switch)."""
    if get_capability(params.capabilities, "text_document.diagnostic", None) is None:
        return
    server.docs.push = False  # the documents push no results; the client asks for them

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


# -- registration -------------------------------------------------------------------------------


def register(server: TorchLanguageServer) -> None:
    """Subscribe to the documents' results and to settings changes, and answer pulls."""
    server.initialize_hooks.append(lambda params: _enable_pull(server, params))

    async def on_results(results: Results) -> None:
        await publish(server, results)

    server.docs.result_listeners.append(on_results)
    server.docs.pull_refresh_listeners.append(lambda: _ask_client_to_pull(server))
    server.settings_listeners.append(lambda: server.docs.refresh_all("settings"))
