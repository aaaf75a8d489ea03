"""The editor's workflows over the probe, end to end over stdio with real torch in the sandbox.

"Inspect checkpoint PATH" is offered on a `torch.load`/`torch.save` whose literal names an
existing file (and only there); `torchls.inspectCheckpoint` on a checkpoint holding an
`argparse.Namespace` answers "blocked" with where the global sits, and afterwards the hover on
those lines shows the summary (on the `torch.save` with TL301: that the file confirms it).
`torchls.compareRepro` on a git repository whose committed script is buggy and whose working
copy is fixed exits 0 with the fix in its Markdown and a "(fixed vs HEAD)" diagnostic.
`torchls.showReproReport` after a real repro returns the HTML report and asks a client with
`window/showDocument` to open it externally, but not one that sends `webviewReports: true`.
"""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import torch
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pygls.uris import from_fs_path, to_fs_path

from .support import RecordingClient, diagnostics_of, open_doc, position_of, range_of, session
from .test_eglot_like import eglot
from .test_eglot_like import message as eglot_message
from .test_repro import PROBS_AS_LOGITS

PROBE = {"device": "cpu", "timeout": 30}

CHECKPOINT_USER = """\
import argparse

import torch


def save(model):
    args = argparse.ArgumentParser().parse_args()
    torch.save({"model": model.state_dict(), "args": args}, "ckpt.pt")


def resume():
    return torch.load("ckpt.pt", map_location="cpu")


def other():
    return torch.load("missing.pt", map_location="cpu")
"""

# Softmax output passed to cross_entropy as logits: TL903 at run time.
BUGGY = PROBS_AS_LOGITS
FIXED = BUGGY.replace("F.cross_entropy(probs, y)", "F.cross_entropy(model(x), y)")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def workspace(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Path]:
    yield tmp_path_factory.mktemp("workflows")


async def execute(client: RecordingClient, command: str, *arguments: Any) -> Any:
    return await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command=command, arguments=list(arguments))
    )


async def actions_at(client: RecordingClient, uri: str, text: str, needle: str) -> list[Any]:
    actions = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri),
            range=range_of(text, needle, client.encoding),
            context=types.CodeActionContext(diagnostics=[]),
        )
    )
    return [a for a in actions or [] if isinstance(a, types.CodeAction)]


async def hover_text(client: RecordingClient, uri: str, where: types.Position) -> str:
    hover = await client.text_document_hover_async(
        types.HoverParams(text_document=types.TextDocumentIdentifier(uri), position=where)
    )
    if hover is None:
        return ""
    assert isinstance(hover.contents, types.MarkupContent)
    return hover.contents.value


async def opened(client: RecordingClient, path: Path, text: str) -> str:
    since = len(client.publishes)
    doc = open_doc(client, path, text)
    await diagnostics_of(client, doc, since)
    return doc.uri


# -- inspect ------------------------------------------------------------------------------------


async def test_inspect_checkpoint_action_command_and_hover(workspace: Path):
    folder = workspace / "inspect"
    folder.mkdir()
    checkpoint = folder / "ckpt.pt"
    model = torch.nn.Linear(4, 2)
    torch.save({"model": model.state_dict(), "args": argparse.Namespace(lr=0.1)}, checkpoint)
    async with session("visual_studio_code", configuration={"probe": PROBE}, root=folder) as client:
        uri = await opened(client, folder / "train.py", CHECKPOINT_USER)
        text = CHECKPOINT_USER

        def inspect_actions(actions: list[types.CodeAction]) -> list[types.CodeAction]:
            return [a for a in actions if a.title.startswith("Inspect checkpoint")]

        [action] = inspect_actions(await actions_at(client, uri, text, 'torch.load("ckpt.pt"'))
        assert action.title == "Inspect checkpoint ckpt.pt"
        assert action.kind == "torchls.inspect"
        assert action.command is not None and action.command.command == "torchls.inspectCheckpoint"
        assert list(action.command.arguments or []) == [str(checkpoint)]
        assert inspect_actions(await actions_at(client, uri, text, 'torch.save({"model"'))
        # A literal that names no file, and a line without a checkpoint call: nothing offered.
        assert inspect_actions(await actions_at(client, uri, text, '"missing.pt"')) == []
        assert inspect_actions(await actions_at(client, uri, text, "def resume")) == []

        result = await execute(client, "torchls.inspectCheckpoint", str(checkpoint))

        assert set(result) == {"status", "markdown", "loads"}
        assert result["status"] == "blocked" and result["loads"] is False
        assert "refused" in result["markdown"] and "TL911" in result["markdown"]
        assert "`ckpt['args']`" in result["markdown"]
        assert "`argparse.Namespace`" in result["markdown"]
        assert "optimizer" in result["markdown"]  # missing to resume
        assert any("TL911" in m.message and "ckpt.pt" in m.message for m in client.messages)

        load_hover = await hover_text(client, uri, position_of(text, "torch.load", client.encoding))
        assert "`argparse.Namespace`" in load_hover and "refused" in load_hover
        assert "confirms TL301" not in load_hover
        save_hover = await hover_text(client, uri, position_of(text, "torch.save", client.encoding))
        assert "`argparse.Namespace`" in save_hover and "confirms TL301" in save_hover
        assert (
            await hover_text(client, uri, position_of(text, '"missing.pt"', client.encoding)) == ""
        )

        # Rewritten (plain data now): the old summary no longer describes it.
        torch.save({"model": model.state_dict()}, checkpoint)
        load_hover = await hover_text(client, uri, position_of(text, "torch.load", client.encoding))
        assert "argparse" not in load_hover


async def test_inspect_of_a_missing_file_is_an_error():
    async with session("visual_studio_code") as client:
        result = await execute(client, "torchls.inspectCheckpoint", "/nonexistent/ckpt.pt")
        assert result["status"] == "error" and result["loads"] is None
        assert "no such file" in result["markdown"]


async def test_untrusted_workspace_gets_no_action_and_a_refusal(workspace: Path):
    folder = workspace / "untrusted"
    folder.mkdir()
    torch.save({"w": torch.ones(2)}, folder / "ckpt.pt")
    options = {"trusted": False}
    async with session("visual_studio_code", initialization_options=options, root=folder) as client:
        uri = await opened(client, folder / "train.py", CHECKPOINT_USER)
        actions = await actions_at(client, uri, CHECKPOINT_USER, 'torch.load("ckpt.pt"')
        assert [a for a in actions if a.title.startswith("Inspect")] == []
        result = await execute(client, "torchls.inspectCheckpoint", str(folder / "ckpt.pt"))
        assert result["status"] == "error" and "not trusted" in result["markdown"]
        compared = await execute(client, "torchls.compareRepro", uri, "HEAD")
        assert compared["status"] == "error" and compared["exit_status"] is None


# -- compare ------------------------------------------------------------------------------------


def git(repo: Path, *arguments: str) -> None:
    identity = ["-c", "user.name=torchls test", "-c", "user.email=test@example.invalid"]
    subprocess.run(["git", "-C", str(repo), *identity, *arguments], check=True, timeout=60)


async def test_compare_with_head_shows_the_fix(workspace: Path):
    repo = workspace / "repo"
    repo.mkdir()
    git(repo, "init", "--quiet")
    (repo / "train.py").write_text(BUGGY, encoding="utf-8")
    git(repo, "add", "train.py")
    git(repo, "commit", "--quiet", "-m", "buggy")
    async with session("visual_studio_code", configuration={"probe": PROBE}, root=repo) as client:
        since = len(client.publishes)
        doc = open_doc(client, repo / "train.py", FIXED)  # the working copy holds the fix
        await diagnostics_of(client, doc, since)
        offered = await actions_at(client, doc.uri, FIXED, "opt.zero_grad()")
        [compare] = [a for a in offered if a.title == "Compare with HEAD"]
        assert compare.command is not None
        assert compare.command.command == "torchls.compareRepro"
        assert list(compare.command.arguments or []) == [doc.uri, "HEAD"]
        since = len(client.publishes)

        result = await execute(client, "torchls.compareRepro", doc.uri, "HEAD")

        assert set(result) == {"status", "exit_status", "markdown"}
        assert result["status"] == "ok" and result["exit_status"] == 0, result
        markdown = result["markdown"]
        assert "**fixed**: `TL903`" in markdown
        assert "**introduced**: none" in markdown
        assert "| step | baseline loss | candidate loss |" in markdown

        def has_fixed(params: types.PublishDiagnosticsParams) -> bool:
            return params.uri == doc.uri and any(
                "(fixed vs HEAD)" in d.message for d in params.diagnostics
            )

        published = await client.wait_for_publish(has_fixed, since)
        [fixed] = [d for d in published.diagnostics if "(fixed vs HEAD)" in d.message]
        assert fixed.code == "TL903" and fixed.source == "torchls-probe"
        assert fixed.severity == types.DiagnosticSeverity.Information
        assert fixed.range.start.line == FIXED.splitlines().index(
            "    loss = F.cross_entropy(model(x), y)"
        )


async def test_compare_answers_at_once_for_clients_without_progress(workspace: Path):
    repo = workspace / "repo-eglot"
    repo.mkdir()
    git(repo, "init", "--quiet")
    (repo / "train.py").write_text(BUGGY, encoding="utf-8")
    git(repo, "add", "train.py")
    git(repo, "commit", "--quiet", "-m", "buggy")
    async with eglot(repo) as client:
        since = len(client.publishes)
        doc = open_doc(client, repo / "train.py", FIXED)
        await diagnostics_of(client, doc, since)
        offered = await actions_at(client, doc.uri, FIXED, "opt.zero_grad()")
        # Not in the menu: eglot would block on it. The command still works, answered at once.
        assert [a.title for a in offered if a.kind == "torchls.repro"] == ["Run bounded repro"]
        since = len(client.publishes)

        result = await execute(client, "torchls.compareRepro", doc.uri, "HEAD")

        assert result["status"] == "started" and result["exit_status"] is None
        done = await eglot_message(client, "compare with HEAD:")
        assert "1 fixed" in done.message and "exit status 0" in done.message

        def has_fixed(params: types.PublishDiagnosticsParams) -> bool:
            return params.uri == doc.uri and any(
                "(fixed vs HEAD)" in d.message for d in params.diagnostics
            )

        await client.wait_for_publish(has_fixed, since)


# -- the report ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flavour", "webview"),
    [("visual_studio_code", False), ("visual_studio_code", True), ("neovim@v0.7.0", False)],
    ids=["show-document", "webview", "no-show-document"],
)
async def test_show_repro_report_after_a_run(workspace: Path, flavour: str, webview: bool):
    folder = workspace / f"report-{flavour}-{webview}"
    folder.mkdir()
    options = {"webviewReports": True} if webview else None
    async with session(
        flavour, initialization_options=options, configuration={"probe": PROBE}, root=folder
    ) as client:
        uri = await opened(client, folder / "train.py", BUGGY)
        with pytest.raises(JsonRpcException):  # nothing ran yet
            await execute(client, "torchls.showReproReport", uri)

        ran = await execute(client, "torchls.runRepro", {"uri": uri})
        assert ran["status"] == "ok", ran
        assert ("torchls.showReproReport" in ran["message"]) is webview
        result = await execute(client, "torchls.showReproReport", uri)

        assert set(result) == {"path", "html"}
        assert "Gradient flow" in result["html"]
        page = Path(result["path"])
        assert page.read_text(encoding="utf-8") == result["html"]
        assert page.parent.name.startswith("torchls-repro-")
        told = [m.message for m in client.messages if str(page) in m.message]
        if flavour.startswith("neovim"):  # no showDocument: the path as a message
            assert client.shown_documents == [] and len(told) == 1
        elif webview:  # the extension opens its webview itself
            assert client.shown_documents == [] and told == []
        else:
            [shown] = client.shown_documents
            assert shown.external is True and told == []
            assert Path(to_fs_path(shown.uri) or "") == page
            assert shown.uri == from_fs_path(str(page))
