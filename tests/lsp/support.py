"""Helpers for the language-server tests: a recording client, sessions, documents, edits.

In: client capability names ("visual_studio_code", "neovim", ...) and settings. Out: a started,
initialised pytest-lsp client that records every `publishDiagnostics` and can wait for one by
predicate, plus a test-side mirror of open documents that applies LSP edits independently of
the server's own position code (so the tests really check the server's conversions). For the
repro tests: a script that trains cleanly, `torchls.runRepro` over the client, and a bubblewrap
that is installed but always fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lsprotocol import types
from pygls.protocol import default_converter
from pygls.uris import from_fs_path
from pytest_lsp import LanguageClient, client_capabilities
from pytest_lsp.client import DEFAULT_CLIENT_FEATURES, register_lsp_features

SERVER_COMMAND = [sys.executable, "-m", "torchls", "server"]
WAIT_S = 30.0  # a safety net against hangs, not a timing assertion

TRAIN = """\
import torch
import torch.nn.functional as F


def train(model, loader, optimizer):
    model.train()
    for x, y in loader:
        logits = model(x)
        probs = F.softmax(logits, dim=1)
        print("🔥 step"); loss = F.cross_entropy(probs, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""
TRAIN_FIXED = TRAIN.replace("F.cross_entropy(probs, y)", "F.cross_entropy(logits, y)")

MIXED = """\
import torch
import torch.nn as nn
import torch.nn.functional as F


def train(model, loader, optimizer, checkpoint):
    model.load_state_dict(torch.load(checkpoint))
    criterion = nn.CrossEntropyLoss()
    for x, y in loader:
        logits = model(x)
        probs = F.softmax(logits, dim=1)
        print("🔥 step"); loss = F.cross_entropy(probs, y)
        loss = loss + criterion(logits, y.float())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


class RecordingClient(LanguageClient):
    """A pytest-lsp client that keeps every publishDiagnostics, in arrival order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.publishes: list[types.PublishDiagnosticsParams] = []
        self.registrations: list[types.Registration] = []
        self.flavour = ""
        self.encoding = "utf-16"
        self.pull = False
        self.document_changes = False
        self._waiters: list[tuple[Callable[[types.PublishDiagnosticsParams], bool], Any]] = []
        self._progress_waiters: list[tuple[Callable[[Any, Any], bool], Any]] = []

    def record(self, params: types.PublishDiagnosticsParams) -> None:
        self.publishes.append(params)
        self.diagnostics[params.uri] = params.diagnostics
        for waiter in list(self._waiters):
            predicate, future = waiter
            if not future.done() and predicate(params):
                future.set_result(params)
                self._waiters.remove(waiter)

    def publishes_for(self, uri: str, since: int = 0) -> list[types.PublishDiagnosticsParams]:
        return [p for p in self.publishes[since:] if p.uri == uri]

    async def wait_for_publish(
        self, predicate: Callable[[types.PublishDiagnosticsParams], bool], since: int
    ) -> types.PublishDiagnosticsParams:
        """The first publish at or after index `since` that satisfies `predicate`."""
        for params in self.publishes[since:]:
            if predicate(params):
                return params
        future = asyncio.get_running_loop().create_future()
        self._waiters.append((predicate, future))
        return await asyncio.wait_for(future, WAIT_S)

    def progress_arrived(self, token: Any, value: Any) -> None:
        for waiter in list(self._progress_waiters):
            predicate, future = waiter
            if not future.done() and predicate(token, value):
                future.set_result((token, value))
                self._progress_waiters.remove(waiter)

    async def wait_for_progress(self, predicate: Callable[[Any, Any], bool]) -> tuple[Any, Any]:
        """The first `$/progress` (token, value) satisfying `predicate`, already received or
        still to come."""
        for token, values in list(self.progress_reports.items()):
            for value in values:
                if predicate(token, value):
                    return token, value
        future = asyncio.get_running_loop().create_future()
        self._progress_waiters.append((predicate, future))
        return await asyncio.wait_for(future, WAIT_S)


def _record_publish(client: RecordingClient, params: types.PublishDiagnosticsParams) -> None:
    client.record(params)


def _record_progress(client: RecordingClient, params: types.ProgressParams) -> None:
    # pytest-lsp's own handler checks the token and stores the structured value.
    DEFAULT_CLIENT_FEATURES[types.PROGRESS](client, params)
    values = client.progress_reports.get(params.token) or []
    if values:
        client.progress_arrived(params.token, values[-1])


def _accept_registration(client: RecordingClient, params: types.RegistrationParams) -> None:
    # What VS Code does with the server's didChangeConfiguration registration: accept it.
    client.registrations.extend(params.registrations)


def converter() -> Any:
    """pygls' converter, except that a code action carrying a `command` stays a `CodeAction`.

    lsprotocol structures any `Command | CodeAction` object with a `command` key as a Command,
    but a CodeAction's `command` is an object; only a string `command` makes a Command (the
    test real clients apply: VS Code, Neovim, lsp-mode).
    """
    base = default_converter()

    def command_or_code_action(value: Any, _: Any) -> types.Command | types.CodeAction:
        kind = types.Command if isinstance(value.get("command"), str) else types.CodeAction
        return base.structure(value, kind)

    base.register_structure_hook(types.Command | types.CodeAction, command_or_code_action)
    return base


def make_client() -> RecordingClient:
    client = RecordingClient(converter_factory=converter)
    features = dict(DEFAULT_CLIENT_FEATURES)
    features[types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS] = _record_publish
    features[types.CLIENT_REGISTER_CAPABILITY] = _accept_registration
    features[types.PROGRESS] = _record_progress
    register_lsp_features(client, features)
    return client


async def initialize(
    client: RecordingClient,
    capabilities: str,
    initialization_options: Any = None,
    root: Path | None = None,
    notebooks: bool = False,
) -> types.InitializeResult:
    """`initialize` + `initialized` with the named client's real capabilities (and, with
    `notebooks`, LSP 3.17 notebook sync, as VS Code 1.74 and later announce it)."""
    params = types.InitializeParams(
        capabilities=client_capabilities(capabilities),
        initialization_options=initialization_options,
    )
    if notebooks:
        params.capabilities.notebook_document = types.NotebookDocumentClientCapabilities(
            synchronization=types.NotebookDocumentSyncClientCapabilities()
        )
    if root is not None:
        params.root_uri = from_fs_path(str(root))
        params.workspace_folders = [types.WorkspaceFolder(uri=params.root_uri, name=root.name)]
    result = await client.initialize_session(params)
    client.flavour = capabilities
    encoding = result.capabilities.position_encoding
    client.encoding = str(getattr(encoding, "value", encoding) or "utf-16")
    client.pull = result.capabilities.diagnostic_provider is not None
    workspace_edit = client.capabilities.workspace and client.capabilities.workspace.workspace_edit
    client.document_changes = bool(workspace_edit and workspace_edit.document_changes)
    return result


@contextlib.asynccontextmanager
async def session(
    capabilities: str,
    initialization_options: Any = None,
    configuration: Any = None,
    root: Path | None = None,
    notebooks: bool = False,
) -> AsyncIterator[RecordingClient]:
    """A fresh server for tests that need their own settings."""
    client = make_client()
    await client.start_io(*SERVER_COMMAND)
    try:
        if configuration is not None:
            client.set_configuration(configuration, section="torchls")
        await initialize(client, capabilities, initialization_options, root, notebooks)
        yield client
    finally:
        await end_session(client)


async def end_session(client: RecordingClient) -> None:
    """shutdown + exit, even after a failed test; `stop()` alone waits for the server to exit
    and would hang forever on one that was never told to."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(client.shutdown_session(), WAIT_S)
    server = client._server
    if server is not None and server.returncode is None:
        server.terminate()
    await client.stop()


# -- documents ----------------------------------------------------------------------------------


@dataclass
class Doc:
    """The test's copy of an open document."""

    uri: str
    text: str
    version: int = 1


def open_doc(client: RecordingClient, path: Path, text: str) -> Doc:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    doc = Doc(from_fs_path(str(path)) or "", text)
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(
                uri=doc.uri, language_id="python", version=doc.version, text=text
            )
        )
    )
    return doc


def change_doc(client: RecordingClient, doc: Doc, text: str) -> None:
    """Replace the whole text (a full-document change event)."""
    doc.version += 1
    doc.text = text
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=doc.uri, version=doc.version),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)],
        )
    )


def edit_doc(client: RecordingClient, doc: Doc, edits: list[types.TextEdit]) -> None:
    """Send `edits` as incremental (ranged) changes, as an editor applying them would."""
    doc.version += 1
    changes = []
    # Apply bottom-up so earlier ranges stay valid, both here and on the server.
    for edit in sorted(edits, key=lambda e: (e.range.start.line, e.range.start.character))[::-1]:
        doc.text = apply_edit(doc.text, edit, client.encoding)
        changes.append(types.TextDocumentContentChangePartial(range=edit.range, text=edit.new_text))
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=doc.uri, version=doc.version),
            content_changes=changes,
        )
    )


def save_doc(client: RecordingClient, doc: Doc) -> None:
    client.text_document_did_save(
        types.DidSaveTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=doc.uri))
    )


def close_doc(client: RecordingClient, doc: Doc) -> None:
    client.text_document_did_close(
        types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=doc.uri))
    )


async def diagnostics_of(client: RecordingClient, doc: Doc, since: int) -> list[types.Diagnostic]:
    """The diagnostics for the doc's current version: the matching publish (push clients) or a
    `textDocument/diagnostic` answer (pull clients)."""
    if client.pull:
        report = await client.text_document_diagnostic_async(
            types.DocumentDiagnosticParams(text_document=types.TextDocumentIdentifier(doc.uri))
        )
        assert isinstance(
            report, types.RelatedFullDocumentDiagnosticReport | types.FullDocumentDiagnosticReport
        )
        return list(report.items)
    version = doc.version
    params = await client.wait_for_publish(
        lambda p: p.uri == doc.uri and p.version == version, since
    )
    return list(params.diagnostics)


def codes(diagnostics: list[types.Diagnostic]) -> list[str]:
    return sorted(str(d.code) for d in diagnostics)


# -- positions, computed independently of the server -------------------------------------------

_CODECS = {"utf-8": ("utf-8", 1), "utf-16": ("utf-16-le", 2), "utf-32": ("utf-32-le", 4)}


def client_column(line: str, codepoints: int, encoding: str) -> int:
    codec, width = _CODECS[encoding]
    return len(line[:codepoints].encode(codec)) // width


def codepoint_column(line: str, units: int, encoding: str) -> int:
    codec, width = _CODECS[encoding]
    return len(line.encode(codec)[: units * width].decode(codec))


def position_of(text: str, needle: str, encoding: str, occurrence: int = 0) -> types.Position:
    """The LSP position of the `occurrence`-th `needle` in `text`."""
    offset = -1
    for _ in range(occurrence + 1):
        offset = text.index(needle, offset + 1)
    line_number = text.count("\n", 0, offset)
    line_start = text.rfind("\n", 0, offset) + 1
    line = text[line_start:].split("\n", 1)[0]
    return types.Position(line_number, client_column(line, offset - line_start, encoding))


def range_of(text: str, needle: str, encoding: str, occurrence: int = 0) -> types.Range:
    start = position_of(text, needle, encoding, occurrence)
    return types.Range(start, types.Position(start.line, start.character + len(needle)))


def apply_edit(text: str, edit: types.TextEdit, encoding: str) -> str:
    lines = text.split("\n")

    def offset(position: types.Position) -> int:
        before = sum(len(line) + 1 for line in lines[: position.line])
        return before + codepoint_column(lines[position.line], position.character, encoding)

    return text[: offset(edit.range.start)] + edit.new_text + text[offset(edit.range.end) :]


def edits_in(edit: types.WorkspaceEdit, doc: Doc, document_changes: bool) -> list[types.TextEdit]:
    """The text edits for `doc`, checking the shape the client asked for."""
    if document_changes:
        assert edit.changes is None
        assert edit.document_changes is not None and len(edit.document_changes) == 1
        change = edit.document_changes[0]
        assert isinstance(change, types.TextDocumentEdit)
        assert change.text_document.uri == doc.uri
        assert change.text_document.version == doc.version
        return [e for e in change.edits if isinstance(e, types.TextEdit)]
    assert edit.document_changes is None
    assert edit.changes is not None and set(edit.changes) == {doc.uri}
    return list(edit.changes[doc.uri])


# --- the repro ----------------------------------------------------------------------------------

# Trains without a static finding and without a runtime one: what a run reports is about the
# sandbox alone.
QUIET_TRAIN = """\
import torch

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""
# How the editor's notice of a run with weaker isolation begins.
WEAKER_ISOLATION = "torchls: the repro ran with weaker isolation: "


def repro_configuration(sandbox: Any = None) -> dict[str, Any]:
    """`torchls` settings for a short CPU repro, with `probe.sandbox` when given."""
    probe: dict[str, Any] = {"device": "cpu", "timeout": 30}
    if sandbox is not None:
        probe["sandbox"] = sandbox
    return {"probe": probe}


async def run_repro(client: RecordingClient, doc: Doc) -> dict[str, Any]:
    """`torchls.runRepro` on `doc`; its result, which is always an object."""
    result = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="torchls.runRepro", arguments=[{"uri": doc.uri}])
    )
    assert isinstance(result, dict), result
    return result


async def opened_quiet_train(client: RecordingClient, path: Path) -> Doc:
    """`QUIET_TRAIN` opened at `path`, once its first diagnostics are in."""
    since = len(client.publishes)
    doc = open_doc(client, path, QUIET_TRAIN)
    await diagnostics_of(client, doc, since)
    return doc


def install_failing_bwrap(folder: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `bwrap` in `folder` that prints an error and exits 1, first on the PATH a server
    started afterwards inherits: installed, so the sandbox tries it, and always failing."""
    folder.mkdir()
    script = folder / "bwrap"
    script.write_text('#!/bin/sh\necho "bwrap: simulated failure" >&2\nexit 1\n', encoding="utf-8")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return script
