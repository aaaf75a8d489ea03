"""Settings end to end: initializationOptions, workspace/configuration (in force before the
first diagnostics), didChangeConfiguration, run=onSave, enable=false, pyproject.toml, and
invalid values. Most tests start their own server, since settings are per server."""

from __future__ import annotations

from pathlib import Path

import pytest
from lsprotocol import types

from .conftest import CLIENTS
from .support import (
    MIXED,
    TRAIN,
    TRAIN_FIXED,
    Doc,
    RecordingClient,
    change_doc,
    codes,
    diagnostics_of,
    open_doc,
    save_doc,
    session,
)
from .test_diagnostics import barrier

ALL_MIXED = ["TL101", "TL106", "TL302"]


async def first_diagnostics(client: RecordingClient, doc: Doc) -> list[types.Diagnostic]:
    """The very first diagnostics the client gets for `doc` (publish or pull)."""
    if client.pull:
        return await diagnostics_of(client, doc, 0)
    first = await client.wait_for_publish(lambda p: p.uri == doc.uri, 0)
    return list(first.diagnostics)


@pytest.mark.parametrize("name", CLIENTS)
@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"settings": {"ignore": ["TL101"]}}, ["TL106", "TL302"]),
        ({"select": ["TL3"]}, ["TL302"]),
        ({"settings": {"torchls": {"select": ["TL1"], "ignore": ["TL106"]}}}, ["TL101"]),
    ],
    ids=["wrapped", "flat", "sectioned"],
)
async def test_initialization_options_select_rules(name, options, expected, tmp_path):
    async with session(name, initialization_options=options) as client:
        doc = open_doc(client, tmp_path / "train.py", MIXED)

        assert codes(await first_diagnostics(client, doc)) == expected


@pytest.mark.parametrize("name", CLIENTS)
async def test_workspace_configuration_is_in_force_for_the_first_diagnostics(name, tmp_path):
    # The document is opened right after `initialized`, while the server's configuration
    # request is still out: the first diagnostics must already honour it.
    async with session(name, configuration={"ignore": ["TL1"]}) as client:
        doc = open_doc(client, tmp_path / "train.py", MIXED)

        assert codes(await first_diagnostics(client, doc)) == ["TL302"]
        assert codes(await diagnostics_of(client, doc, 0)) == ["TL302"]


@pytest.mark.parametrize("name", CLIENTS)
async def test_workspace_configuration_overrides_initialization_options(name, tmp_path):
    async with session(
        name,
        initialization_options={"settings": {"ignore": ["TL101"]}},
        configuration={"ignore": ["TL302"]},
    ) as client:
        doc = open_doc(client, tmp_path / "train.py", MIXED)

        assert codes(await first_diagnostics(client, doc)) == ["TL101", "TL106"]


async def test_did_change_configuration_republishes(client: RecordingClient, tmp_path):
    since = len(client.publishes)
    doc = open_doc(client, tmp_path / "train.py", MIXED)
    assert codes(await diagnostics_of(client, doc, since)) == ALL_MIXED
    # VS Code only sends didChangeConfiguration for sections a server registered for; Neovim
    # (no dynamic registration) sends it anyway. The server asks right after its configuration
    # arrives, which is before any diagnostics can go out.
    registered = [r.method for r in client.registrations]
    expected = (
        ["workspace/didChangeConfiguration"] if client.flavour == "visual_studio_code" else []
    )
    # (VS Code also gets a file watcher for cross-file checks; that one is not about settings.)
    assert [m for m in registered if m != "workspace/didChangeWatchedFiles"] == expected
    mark = len(client.publishes)

    client.set_configuration({"select": ["TL302"]}, section="torchls")
    try:
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=None))
        if client.pull:
            assert codes(await diagnostics_of(client, doc, mark)) == ["TL302"]
        else:
            # Same version, new settings: a publish that was not asked for by a document event.
            republished = await client.wait_for_publish(
                lambda p: p.uri == doc.uri and codes(list(p.diagnostics)) == ["TL302"], mark
            )
            assert republished.version == doc.version
    finally:
        # The server is shared: put the settings back and wait until they are in force.
        client.set_configuration(None, section="torchls")
        mark = len(client.publishes)
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=None))
        if not client.pull:
            await client.wait_for_publish(
                lambda p: p.uri == doc.uri and codes(list(p.diagnostics)) == ALL_MIXED, mark
            )
    assert codes(await diagnostics_of(client, doc, mark)) == ALL_MIXED


async def test_settings_pushed_by_clients_without_workspace_configuration(tmp_path):
    # Neovim 0.7 cannot answer workspace/configuration (the strict spec check would fail the
    # test if the server asked); its settings arrive in didChangeConfiguration instead.
    async with session("neovim@v0.7.0") as client:
        doc = open_doc(client, tmp_path / "train.py", MIXED)
        assert codes(await diagnostics_of(client, doc, 0)) == ALL_MIXED
        mark = len(client.publishes)

        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"torchls": {"ignore": ["TL1"]}})
        )

        republished = await client.wait_for_publish(lambda p: p.uri == doc.uri, mark)
        assert codes(list(republished.diagnostics)) == ["TL302"]


@pytest.mark.parametrize("name", CLIENTS)
async def test_run_on_save_publishes_on_open_and_save_only(name, tmp_path):
    async with session(name, initialization_options={"run": "onSave"}) as client:
        doc = open_doc(client, tmp_path / "train.py", TRAIN)
        assert codes(await first_diagnostics(client, doc)) == ["TL101"]
        mark = len(client.publishes)

        change_doc(client, doc, TRAIN_FIXED)

        if client.pull:
            # Still the diagnostics of the saved text.
            assert codes(await diagnostics_of(client, doc, mark)) == ["TL101"]
        else:
            await barrier(client, tmp_path)
            assert client.publishes_for(doc.uri, mark) == []
        save_doc(client, doc)
        assert await diagnostics_of(client, doc, mark) == []


@pytest.mark.parametrize("name", CLIENTS)
async def test_disabled_server_reports_nothing(name, tmp_path):
    async with session(name, initialization_options={"settings": {"enable": False}}) as client:
        doc = open_doc(client, tmp_path / "train.py", TRAIN)

        assert await first_diagnostics(client, doc) == []
        hover = await client.text_document_hover_async(
            types.HoverParams(
                text_document=types.TextDocumentIdentifier(doc.uri),
                position=types.Position(9, 40),
            )
        )
        assert hover is None


def write_pyproject(folder: Path, body: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text(f"[project]\nname = 'demo'\n\n{body}", encoding="utf-8")


async def test_pyproject_selection_is_honoured(client: RecordingClient, tmp_path):
    write_pyproject(tmp_path, '[tool.torchls]\nignore = ["TL101"]\n')
    since = len(client.publishes)

    doc = open_doc(client, tmp_path / "src" / "train.py", MIXED)

    assert codes(await diagnostics_of(client, doc, since)) == ["TL106", "TL302"]


async def test_broken_pyproject_warns_once_and_uses_defaults(client: RecordingClient, tmp_path):
    write_pyproject(tmp_path, '[tool.torchls]\nselct = ["TL1"]\n')
    since = len(client.publishes)

    first = open_doc(client, tmp_path / "a.py", TRAIN)
    second = open_doc(client, tmp_path / "b.py", TRAIN)

    assert codes(await diagnostics_of(client, first, since)) == ["TL101"]
    assert codes(await diagnostics_of(client, second, since)) == ["TL101"]
    warnings = [m for m in client.messages if "selct" in m.message and str(tmp_path) in m.message]
    assert len(warnings) == 1
    assert warnings[0].type == types.MessageType.Warning


@pytest.mark.parametrize("name", CLIENTS)
async def test_invalid_setting_is_reported_and_ignored(name, tmp_path):
    options = {"settings": {"run": "sometimes", "ignore": ["TL302"]}}
    async with session(name, initialization_options=options) as client:
        doc = open_doc(client, tmp_path / "train.py", MIXED)

        # The bad `run` is dropped (on-type stays), the good `ignore` still applies.
        assert codes(await first_diagnostics(client, doc)) == ["TL101", "TL106"]
        change_doc(client, doc, MIXED.replace("probs, y", "logits, y"))
        assert codes(await diagnostics_of(client, doc, 0)) == ["TL106"]
        [warning] = [m for m in client.messages if "torchls.run" in m.message]
        assert warning.type == types.MessageType.Warning


async def test_pyproject_edits_count_from_the_next_save(client: RecordingClient, tmp_path):
    write_pyproject(tmp_path, "[tool.torchls]\n")
    since = len(client.publishes)
    doc = open_doc(client, tmp_path / "train.py", MIXED)
    assert codes(await diagnostics_of(client, doc, since)) == ALL_MIXED
    write_pyproject(tmp_path, '[tool.torchls]\nselect = ["TL302"]\n')
    mark = len(client.publishes)

    save_doc(client, doc)

    if client.pull:
        assert codes(await diagnostics_of(client, doc, mark)) == ["TL302"]
    else:
        republished = await client.wait_for_publish(lambda p: p.uri == doc.uri, mark)
        assert codes(list(republished.diagnostics)) == ["TL302"]
