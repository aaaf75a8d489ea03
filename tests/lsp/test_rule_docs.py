"""Rule documentation in the editor: the "Show documentation for TLxxx" code action and the
`torchls.showRuleDoc` command it runs (returns the Markdown; opens it, or the configured docs
URL, in clients that announce `window/showDocument`; the strict-spec check fails the test if
it is sent to any other client)."""

from __future__ import annotations

from pathlib import Path

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams
from pygls.uris import to_fs_path

from torchls.analysis import get_rule
from torchls.docs import rule_markdown

from .support import (
    MIXED,
    SERVER_COMMAND,
    TRAIN,
    RecordingClient,
    diagnostics_of,
    end_session,
    initialize,
    make_client,
    open_doc,
    session,
)
from .test_code_actions import request_actions, whole

COMMAND = "torchls.showRuleDoc"


async def show(client: RecordingClient, *arguments: object) -> object:
    return await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command=COMMAND, arguments=list(arguments))
    )


async def test_each_code_in_range_gets_one_show_documentation_action(
    client: RecordingClient, tmp_path: Path
):
    since = len(client.publishes)
    doc = open_doc(client, tmp_path / "train.py", MIXED)
    diagnostics = await diagnostics_of(client, doc, since)

    actions = await request_actions(client, doc, whole(MIXED), diagnostics, only=["quickfix"])

    docs = [a for a in actions if a.title.startswith("Show documentation")]
    assert [a.title for a in docs] == [
        "Show documentation for TL302",
        "Show documentation for TL101",
        "Show documentation for TL106",
    ]
    for action in docs:
        code = action.title.rsplit(" ", 1)[1]
        assert action.kind == types.CodeActionKind.QuickFix
        assert action.edit is None and not action.is_preferred
        assert action.command is not None
        assert (action.command.command, list(action.command.arguments or [])) == (COMMAND, [code])
        assert [d.code for d in action.diagnostics or []] == [code]


async def test_action_for_one_diagnostic_names_only_its_code(
    client: RecordingClient, tmp_path: Path
):
    since = len(client.publishes)
    doc = open_doc(client, tmp_path / "train.py", TRAIN)
    [diagnostic] = await diagnostics_of(client, doc, since)

    actions = await request_actions(client, doc, diagnostic.range, [diagnostic])

    shown = [a.title for a in actions if a.command and a.command.command == COMMAND]
    assert shown == ["Show documentation for TL101"]


@pytest.mark.parametrize("name", ["visual_studio_code", "neovim"])
async def test_command_returns_the_markdown_and_opens_it_in_the_editor(name: str, tmp_path: Path):
    async with session(name, root=tmp_path) as client:
        markdown = await show(client, "TL101")

        assert markdown == rule_markdown(get_rule("TL101"))
        [shown] = client.shown_documents
        assert not shown.external and shown.take_focus
        page = Path(to_fs_path(shown.uri) or "")
        assert page.name == "TL101.md"
        assert page.read_text(encoding="utf-8") == markdown


async def test_command_is_advertised_and_takes_the_object_form():
    client = make_client()
    await client.start_io(*SERVER_COMMAND)
    try:
        result = await initialize(client, "visual_studio_code")
        provider = result.capabilities.execute_command_provider
        assert provider is not None and COMMAND in provider.commands

        markdown = await show(client, {"code": "tl302"})  # an object, any case

        assert markdown == rule_markdown(get_rule("TL302"))
        [shown] = client.shown_documents
        assert shown.uri.endswith("/TL302.md")
    finally:
        await end_session(client)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (
            {"docsUrl": "https://example.invalid/torchls/rules.md"},
            "https://example.invalid/torchls/rules.md#tl101-softmax-before-cross-entropy",
        ),
        (
            {"settings": {"docsUrl": "https://example.invalid/rules/{code}.html"}},
            "https://example.invalid/rules/TL101.html",
        ),
    ],
    ids=["anchor", "template"],
)
async def test_configured_docs_url_opens_externally(options, expected):
    async with session("visual_studio_code", initialization_options=options) as client:
        markdown = await show(client, "TL101")

        assert markdown == rule_markdown(get_rule("TL101"))
        assert [(d.uri, d.external) for d in client.shown_documents] == [(expected, True)]


async def test_client_without_show_document_gets_the_markdown_only():
    options = {"docsUrl": "https://example.invalid/rules.md"}
    async with session("neovim@v0.7.0", initialization_options=options) as client:
        markdown = await show(client, "TL303")

        assert markdown == rule_markdown(get_rule("TL303"))
        assert client.shown_documents == []


async def test_the_syntax_error_code_is_documented_too():
    async with session("neovim@v0.7.0") as client:
        markdown = await show(client, "TL000")

        assert markdown == rule_markdown(get_rule("TL000"))
        assert markdown.startswith("# TL000 syntax-error\n")
        assert "# noqa: TL000" not in markdown


@pytest.mark.parametrize("arguments", [["TL999"], [], ["TL101", "TL102"], [42]])
async def test_bad_arguments_are_invalid_params(arguments):
    async with session("visual_studio_code") as client:
        with pytest.raises(JsonRpcInvalidParams):
            await show(client, *arguments)
        assert client.shown_documents == []
