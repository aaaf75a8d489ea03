"""torchls with a client that behaves like Helix: push diagnostics only (no
`textDocument.diagnostic`), no `workspace/configuration`, no dynamic registration, settings
only through `initializationOptions` (Helix's `config` table in languages.toml) and, later,
`workspace/didChangeConfiguration` pushes. The capabilities below are what Helix sends,
minus `workspace.configuration` (as in the issue: the server must not depend on it).

Any message the server sends that these capabilities do not allow (a configuration request,
a showDocument, a registration) fails the test through pytest-lsp's specification check.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from lsprotocol import types
from pygls.protocol import default_converter
from pygls.uris import from_fs_path

from tests.lsp.support import (
    MIXED,
    SERVER_COMMAND,
    TRAIN,
    RecordingClient,
    codes,
    edit_doc,
    edits_in,
    end_session,
    make_client,
    open_doc,
    position_of,
)
from torchls.analysis import get_rule
from torchls.docs import rule_markdown

pytestmark = pytest.mark.filterwarnings("error::pytest_lsp.LspSpecificationWarning")

# Helix's InitializeParams.capabilities (helix-lsp client.rs), without workspace.configuration.
HELIX_CAPABILITIES: dict[str, Any] = {
    "workspace": {
        "didChangeConfiguration": {"dynamicRegistration": False},
        "workspaceFolders": True,
        "applyEdit": True,
        "executeCommand": {"dynamicRegistration": False},
        "workspaceEdit": {
            "documentChanges": True,
            "resourceOperations": ["create", "rename", "delete"],
            "failureHandling": "abort",
            "normalizesLineEndings": False,
        },
    },
    "textDocument": {
        "hover": {"contentFormat": ["markdown"]},
        "codeAction": {
            "codeActionLiteralSupport": {
                "codeActionKind": {
                    "valueSet": [
                        "",
                        "quickfix",
                        "refactor",
                        "refactor.extract",
                        "refactor.inline",
                        "refactor.rewrite",
                        "source",
                        "source.organizeImports",
                    ]
                }
            },
            "isPreferredSupport": True,
            "disabledSupport": True,
            "dataSupport": True,
            "resolveSupport": {"properties": ["edit", "command"]},
        },
        "publishDiagnostics": {"versionSupport": True, "tagSupport": {"valueSet": [1, 2]}},
    },
    "window": {"workDoneProgress": True},
    "general": {"positionEncodings": ["utf-8", "utf-32", "utf-16"]},
}
CONFIG_SHAPES = {
    # languages.toml `config = { ignore = ["TL303"] }`, sent as is.
    "flat": {"ignore": ["TL303"]},
    # `[language-server.torchls.config.settings]`, ruff-lsp's documented Helix shape.
    "settings": {"settings": {"ignore": ["TL303"]}},
    # `[language-server.torchls.config.torchls]`, the section name as key.
    "section": {"torchls": {"ignore": ["TL303"]}},
}
BOTH = MIXED.replace(
    "model.load_state_dict(torch.load(checkpoint))",
    'model.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=False))',
).replace(" + criterion(logits, y.float())", "")


@contextlib.asynccontextmanager
async def helix(config: Any, root: Path) -> AsyncIterator[tuple[RecordingClient, Any]]:
    """A started server, initialised the way Helix does it; yields the client and the
    server's InitializeResult. Records every workspace/configuration request it gets."""
    client = make_client()
    asked: list[str | None] = []
    answer = client.get_configuration  # what pytest-lsp's workspace/configuration handler calls

    def recording(*, section: str | None = None, scope_uri: str | None = None) -> Any:
        asked.append(section)
        return answer(section=section, scope_uri=scope_uri)

    client.get_configuration = recording  # type: ignore[method-assign]
    client.configuration_requests = asked  # type: ignore[attr-defined]
    await client.start_io(*SERVER_COMMAND)
    try:
        capabilities = default_converter().structure(HELIX_CAPABILITIES, types.ClientCapabilities)
        uri = from_fs_path(str(root)) or ""
        result = await client.initialize_session(
            types.InitializeParams(
                capabilities=capabilities,
                initialization_options=config,
                root_uri=uri,
                workspace_folders=[types.WorkspaceFolder(uri=uri, name=root.name)],
                client_info=types.ClientInfo(name="helix", version="24.07"),
            )
        )
        encoding = result.capabilities.position_encoding
        client.encoding = str(getattr(encoding, "value", encoding) or "utf-16")
        client.document_changes = True
        if config is not None:
            # Helix pushes its `config` once more right after `initialized`.
            client.workspace_did_change_configuration(
                types.DidChangeConfigurationParams(settings=config)
            )
        yield client, result
    finally:
        await end_session(client)


async def publish_for(client: RecordingClient, uri: str, version: int, since: int) -> list[str]:
    params = await client.wait_for_publish(lambda p: p.uri == uri and p.version == version, since)
    return codes(list(params.diagnostics))


@pytest.mark.parametrize("shape", list(CONFIG_SHAPES))
async def test_settings_come_from_initialization_options_alone(shape: str, tmp_path: Path):
    async with helix(CONFIG_SHAPES[shape], tmp_path) as (client, result):
        assert result.capabilities.diagnostic_provider is None  # push: Helix pulls nothing
        assert client.encoding == "utf-8"  # Helix's first choice
        doc = open_doc(client, tmp_path / "train.py", BOTH)

        assert await publish_for(client, doc.uri, doc.version, 0) == ["TL101"]  # TL303 ignored
        assert client.configuration_requests == []
        assert client.registrations == []


async def test_defaults_without_any_config(tmp_path: Path):
    async with helix(None, tmp_path) as (client, _):
        doc = open_doc(client, tmp_path / "train.py", BOTH)

        assert await publish_for(client, doc.uri, doc.version, 0) == ["TL101", "TL303"]


async def test_did_change_configuration_push_replaces_the_settings(tmp_path: Path):
    async with helix(CONFIG_SHAPES["flat"], tmp_path) as (client, _):
        doc = open_doc(client, tmp_path / "train.py", BOTH)
        assert await publish_for(client, doc.uri, doc.version, 0) == ["TL101"]
        since = len(client.publishes)

        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"ignore": ["TL101"]})
        )

        assert await publish_for(client, doc.uri, doc.version, since) == ["TL303"]
        assert client.configuration_requests == []


async def test_quick_fix_hover_and_rule_docs_work_without_the_optional_capabilities(
    tmp_path: Path,
):
    async with helix(CONFIG_SHAPES["flat"], tmp_path) as (client, _):
        doc = open_doc(client, tmp_path / "train.py", TRAIN)
        params = await client.wait_for_publish(lambda p: p.uri == doc.uri, 0)
        [diagnostic] = params.diagnostics
        # Columns in UTF-8 bytes: the line has an emoji before the finding.
        assert diagnostic.range.start == position_of(TRAIN, "probs, y", "utf-8")

        actions = await client.text_document_code_action_async(
            types.CodeActionParams(
                text_document=types.TextDocumentIdentifier(doc.uri),
                range=diagnostic.range,
                context=types.CodeActionContext(diagnostics=[diagnostic]),
            )
        )
        by_title = {action.title: action for action in actions or []}
        [fix] = [a for title, a in by_title.items() if title.startswith("Fix TL101")]
        docs = by_title["Show documentation for TL101"]
        assert isinstance(docs, types.CodeAction) and docs.command is not None

        markdown = await client.workspace_execute_command_async(
            types.ExecuteCommandParams(
                command=docs.command.command, arguments=docs.command.arguments
            )
        )
        assert markdown == rule_markdown(get_rule("TL101"))
        assert client.shown_documents == []  # no window.showDocument: nothing is opened

        hover = await client.text_document_hover_async(
            types.HoverParams(
                text_document=types.TextDocumentIdentifier(doc.uri),
                position=position_of(TRAIN, "cross_entropy(probs", "utf-8"),
            )
        )
        assert hover is not None and isinstance(hover.contents, types.MarkupContent)
        assert hover.contents.kind == types.MarkupKind.Markdown
        assert "CrossEntropyLoss" in hover.contents.value

        since = len(client.publishes)
        assert isinstance(fix, types.CodeAction) and fix.edit is not None
        edit_doc(client, doc, edits_in(fix.edit, doc, document_changes=True))
        assert "F.cross_entropy(logits, y)" in doc.text
        assert await publish_for(client, doc.uri, doc.version, since) == []
