"""Closed documents keep nothing: no parse tree, no cached results, nothing the project learnt
from their unsaved text, and no state at all for a document closed before its analysis ended.

Driven in-process (the `Documents` of a server that never starts its transport), so the test
can look at what the server holds instead of guessing from its memory figures.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from lsprotocol import types

from torchls.lsp.documents import LspWorkspace
from torchls.lsp.server import TorchLanguageServer

MODELS = (
    "import torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
    "class Net(nn.Module):\n    def forward(self, x):\n        return F.softmax(x, dim=-1)\n"
)
TRAIN = (
    "import torch.nn as nn\nfrom models import Net\n\n\n"
    "def train(loader):\n    model = Net()\n    criterion = nn.CrossEntropyLoss()\n"
    "    for x, y in loader:\n        criterion(model(x), y).backward()\n"
)


def server_for(root: Path) -> TorchLanguageServer:
    server = TorchLanguageServer()
    server.protocol._workspace = LspWorkspace(
        root.as_uri(), sync_kind=types.TextDocumentSyncKind.Incremental
    )
    server.settings_ready.set()
    server.docs.push = False  # nothing is sent: there is no client
    return server


def open_document(server: TorchLanguageServer, path: Path, text: str) -> str:
    uri = path.as_uri()
    server.workspace.put_text_document(
        types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)
    )
    server.docs.opened(uri)
    return uri


async def analysed(server: TorchLanguageServer, uri: str, cross_file: bool = True) -> list[str]:
    snapshot = server.docs.snapshot(uri)
    assert snapshot is not None
    outcome = await server.docs.analyse(snapshot, cross_file=cross_file)
    return [finding.code for finding in outcome.findings]


async def settled(server: TorchLanguageServer) -> None:
    """Wait until the analysis thread has run everything queued so far."""
    await asyncio.wrap_future(server.docs.analysis_pool.submit(lambda: None))


@pytest.mark.asyncio
async def test_closing_frees_the_parse_tree_results_and_project_state(tmp_path: Path):
    (tmp_path / "models.py").write_text(MODELS, encoding="utf-8")
    server = server_for(tmp_path)
    try:
        models = open_document(
            server, tmp_path / "models.py", MODELS.replace("F.softmax", "F.relu")
        )
        train = open_document(server, tmp_path / "train.py", TRAIN)
        assert "TL101" not in await analysed(server, train)  # the editor's text of models.py
        await analysed(server, models)
        assert set(server.docs.parsed_by_uri) == {models, train}

        server.docs.closed(models)
        await settled(server)
        assert models not in server.docs.parsed_by_uri
        assert models not in server.docs.states
        # The project forgot the unsaved text: models.py is read from disk again.
        assert "TL101" in await analysed(server, train)

        server.docs.closed(train)
        await settled(server)
        assert server.docs.parsed_by_uri == {}
        assert server.docs.states == {}
    finally:
        server.docs.shutdown()


@pytest.mark.asyncio
async def test_a_document_closed_while_queued_keeps_no_parse_tree(tmp_path: Path):
    server = server_for(tmp_path)
    try:
        uri = open_document(server, tmp_path / "train.py", TRAIN)
        pending = asyncio.ensure_future(analysed(server, uri, cross_file=False))
        await asyncio.sleep(0)  # the analysis is queued on the worker thread
        server.docs.closed(uri)
        await pending
        await settled(server)
        assert server.docs.parsed_by_uri == {}
    finally:
        server.docs.shutdown()
