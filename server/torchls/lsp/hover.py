"""Hover: the static contract of the loss under the cursor, and the last repro's trace.

In: `textDocument/hover` at an LSP position (in a notebook cell: the same place in the
notebook's module). Out: Markdown from the document version's
`torchls.analysis.loss_contracts` table (built at its first hover) when the cursor is on a
loss, and from the hover layers other features subscribe on the server (the repro's, when the
last repro traced the line or the value under the cursor; both, one after the other, when
both apply), or None. Clients that
take only plain text get the same rendered by `plaintext` (tables aligned, no Markdown
markers).
"""

from __future__ import annotations

import asyncio
import logging

from lsprotocol import types

from torchls.analysis import loss_contracts
from torchls.analysis.contracts import ContractTable
from torchls.analysis.resolver import CachedView
from torchls.lsp import plaintext
from torchls.lsp.documents import Snapshot
from torchls.lsp.server import MAX_DOCUMENT_CHARS, TorchLanguageServer

logger = logging.getLogger(__name__)


def _contracts(source: str, filename: str, workspace: CachedView | None) -> ContractTable | None:
    try:
        return loss_contracts(source, filename, workspace)
    except Exception:  # a hover must never take the server down
        logger.exception("loss contract lookup failed")
        return None


async def hover(server: TorchLanguageServer, params: types.HoverParams) -> types.Hover | None:
    """The loss contract and the repro trace at `params.position`, or None."""
    await server.docs.wait_for_settings()
    uri, position = params.text_document.uri, params.position
    if (notebook_uri := server.docs.notebook_of(uri)) is not None:
        # In a cell: the same place in the notebook's module (a markdown cell has none).
        snapshot = server.docs.snapshot(notebook_uri)
        cells = snapshot.notebook if snapshot is not None else None
        moved = cells.to_module_position(uri, position) if cells is not None else None
        if moved is None:
            return None
        position = moved
    else:
        snapshot = server.docs.snapshot(uri)
    if snapshot is None or not server.settings.enable:
        return None
    if len(snapshot.source) > MAX_DOCUMENT_CHARS:
        return None
    row, column = server.line_index(snapshot.source).from_position(position)
    table = await _table_for(server, snapshot)
    markdown = table.markdown_at(row, column) if table is not None else None
    # What other features add (the repro's traced tensors), subscribed on the server.
    runtime = [await layer(snapshot, row, column) for layer in server.hover_layers]
    parts = [part for part in (markdown, *runtime) if part]
    if not parts:
        return None
    markdown = "\n\n---\n\n".join(parts)
    if not plaintext.accepts_markdown(server):
        text = plaintext.render(markdown)
        content = types.MarkupContent(kind=types.MarkupKind.PlainText, value=text)
    else:
        content = types.MarkupContent(kind=types.MarkupKind.Markdown, value=markdown)
    return types.Hover(contents=content)


async def _table_for(server: TorchLanguageServer, snapshot: Snapshot) -> ContractTable | None:
    """The contracts of this text: built on the analysis thread at its first hover, then
    reused until the text (or what other project files say) changes."""
    state = server.docs.states.get(snapshot.uri)
    key = (snapshot.source, server.docs.dependency_generation)
    if state is not None and state.contracts is not None and state.contracts[0] == key:
        return state.contracts[1]
    path, _ = server.docs.paths_of(snapshot.uri)
    # Names imported from other project files are followed as far as already resolved.
    workspace = server.docs.project.cached_view() if path is not None else None
    loop = asyncio.get_running_loop()
    table = await loop.run_in_executor(
        server.docs.analysis_pool, _contracts, snapshot.source, path or snapshot.uri, workspace
    )
    if state is not None and server.docs.states.get(snapshot.uri) is state:
        state.contracts = (key, table)
    return table


def register(server: TorchLanguageServer) -> None:
    """Attach the hover handler to `server`."""

    @server.feature(types.TEXT_DOCUMENT_HOVER)
    async def on_hover(ls: TorchLanguageServer, params: types.HoverParams) -> types.Hover | None:
        return await hover(ls, params)
