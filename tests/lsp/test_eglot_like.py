"""torchls with a client that sends exactly what eglot 1.9 sends (Debian 12's Emacs 28.2 with
elpa-eglot, markdown-mode not installed): no `window` capabilities (no work-done progress, no
showDocument), hover `contentFormat: ["plaintext"]`, push diagnostics, `workspace/configuration`.
`tests/editors/test_emacs.py` checks that a real eglot sends these capabilities.

The five problems of issue #21, over stdio:
- `shutdown` is answered without waiting for the repro session to close, `exit` still waits
  for it, and a server killed right after `exit` (as eglot does) or without any shutdown still
  leaves no process and no temporary folder; a new server removes the folders of dead ones
  (and of no live one) at start-up;
- `torchls.runRepro` answers "started" at once; the findings and a short message come later;
- hovers and the rule documentation are readable plain text;
- "Show documentation" arrives as a message when showDocument is not there;
- only the finding's own fix is preferred, and no fix-all is offered off a finding.

pytest-lsp's specification check fails a test on anything these capabilities do not allow
(a `window/workDoneProgress/create`, for instance).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import stat
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from lsprotocol import types
from pygls.protocol import default_converter
from pygls.uris import from_fs_path

from tests.lsp.test_repro import NAN  # the same NaN-born-on-torch.log script
from tests.probe.support import leftovers
from torchls.analysis import get_rule
from torchls.docs import rule_markdown
from torchls.lsp.plaintext import inline, render
from torchls.lsp.repro import ReproController
from torchls.probe.leftovers import pid_namespace

from .support import (
    MIXED,
    SERVER_COMMAND,
    TRAIN,
    WAIT_S,
    Doc,
    RecordingClient,
    diagnostics_of,
    end_session,
    make_client,
    open_doc,
    position_of,
    range_of,
)

EGLOT_19_CAPABILITIES: dict[str, Any] = {
    "workspace": {
        "applyEdit": True,
        "executeCommand": {"dynamicRegistration": False},
        "workspaceEdit": {"documentChanges": True},
        "didChangeWatchedFiles": {"dynamicRegistration": True},
        "symbol": {"dynamicRegistration": False},
        "configuration": True,
        "workspaceFolders": True,
    },
    "textDocument": {
        "synchronization": {
            "dynamicRegistration": False,
            "willSave": True,
            "willSaveWaitUntil": True,
            "didSave": True,
        },
        "completion": {
            "dynamicRegistration": False,
            "completionItem": {
                "snippetSupport": False,
                "deprecatedSupport": True,
                "tagSupport": {"valueSet": [1]},
            },
            "contextSupport": True,
        },
        "hover": {"dynamicRegistration": False, "contentFormat": ["plaintext"]},
        "signatureHelp": {
            "dynamicRegistration": False,
            "signatureInformation": {
                "parameterInformation": {"labelOffsetSupport": True},
                "activeParameterSupport": True,
            },
        },
        "references": {"dynamicRegistration": False},
        "definition": {"dynamicRegistration": False, "linkSupport": True},
        "declaration": {"dynamicRegistration": False, "linkSupport": True},
        "implementation": {"dynamicRegistration": False, "linkSupport": True},
        "typeDefinition": {"dynamicRegistration": False, "linkSupport": True},
        "documentSymbol": {
            "dynamicRegistration": False,
            "hierarchicalDocumentSymbolSupport": True,
            "symbolKind": {
                "valueSet": [
                    1,
                    2,
                    3,
                    4,
                    5,
                    6,
                    7,
                    8,
                    9,
                    10,
                    11,
                    12,
                    13,
                    14,
                    15,
                    16,
                    17,
                    18,
                    19,
                    20,
                    21,
                    22,
                    23,
                    24,
                    25,
                    26,
                ],
            },
        },
        "documentHighlight": {"dynamicRegistration": False},
        "codeAction": {
            "dynamicRegistration": False,
            "codeActionLiteralSupport": {
                "codeActionKind": {
                    "valueSet": [
                        "quickfix",
                        "refactor",
                        "refactor.extract",
                        "refactor.inline",
                        "refactor.rewrite",
                        "source",
                        "source.organizeImports",
                    ],
                },
            },
            "isPreferredSupport": True,
        },
        "formatting": {"dynamicRegistration": False},
        "rangeFormatting": {"dynamicRegistration": False},
        "rename": {"dynamicRegistration": False},
        "publishDiagnostics": {
            "relatedInformation": False,
            "codeDescriptionSupport": False,
            "tagSupport": {"valueSet": [1, 2]},
        },
    },
    "experimental": {},
}
# What eglot answers workspace/configuration with, from eglot-workspace-configuration.
CONFIGURATION = {"probe": {"device": "cpu", "timeout": 60}}


# -- an eglot-like client --------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def eglot(
    root: Path, temp: Path | None = None, options: dict[str, Any] | None = None
) -> AsyncIterator[RecordingClient]:
    """A server started and initialised the way eglot 1.9 does it (TMPDIR=`temp` if given;
    `options` as eglot's :initializationOptions)."""
    client = make_client()
    client.set_configuration(CONFIGURATION, section="torchls")
    env = dict(os.environ, TMPDIR=str(temp)) if temp is not None else None
    await client.start_io(*SERVER_COMMAND, env=env)
    try:
        uri = from_fs_path(str(root)) or ""
        result = await client.initialize_session(
            types.InitializeParams(
                capabilities=default_converter().structure(
                    EGLOT_19_CAPABILITIES, types.ClientCapabilities
                ),
                process_id=os.getpid(),
                root_path=str(root),
                root_uri=uri,
                initialization_options=options or {},
                workspace_folders=[types.WorkspaceFolder(uri=uri, name=str(root))],
            )
        )
        encoding = result.capabilities.position_encoding
        client.encoding = str(getattr(encoding, "value", encoding) or "utf-16")
        client.document_changes = True
        yield client
    finally:
        server = client._server
        if server is not None and server.returncode is not None:
            await client.stop()  # the test killed it: there is nobody to shut down
        else:
            await end_session(client)


async def opened(client: RecordingClient, path: Path, text: str) -> Doc:
    since = len(client.publishes)
    doc = open_doc(client, path, text)
    await diagnostics_of(client, doc, since)
    return doc


async def notification(
    client: RecordingClient,
    method: str,
    seen: Callable[[], list[Any]],
    wanted: Callable[[Any], bool],
) -> Any:
    """The first `method` notification satisfying `wanted`, already received (`seen`) or not.
    Checking and starting to wait happen without a pause between, so none slips by."""
    while True:
        for params in seen():
            if wanted(params):
                return params
        params = await asyncio.wait_for(client.wait_for_notification(method), WAIT_S)
        if wanted(params):
            return params


async def message(client: RecordingClient, needle: str) -> types.ShowMessageParams:
    return await notification(
        client,
        types.WINDOW_SHOW_MESSAGE,
        lambda: list(client.messages),
        lambda params: needle in params.message,
    )


async def hover(client: RecordingClient, doc: Doc, where: types.Position) -> types.MarkupContent:
    answer = await client.text_document_hover_async(
        types.HoverParams(text_document=types.TextDocumentIdentifier(doc.uri), position=where)
    )
    assert answer is not None and isinstance(answer.contents, types.MarkupContent)
    return answer.contents


async def run_repro(client: RecordingClient, doc: Doc) -> dict[str, Any]:
    result = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="torchls.runRepro", arguments=[{"uri": doc.uri}])
    )
    assert isinstance(result, dict), result
    return result


async def probe_diagnostics(client: RecordingClient, doc: Doc, since: int) -> list[Any]:
    def done(params: types.PublishDiagnosticsParams) -> bool:
        return params.uri == doc.uri and any(
            d.source == "torchls-probe" for d in params.diagnostics
        )

    return list((await client.wait_for_publish(done, since)).diagnostics)


def wait_until_gone(pids: list[int]) -> list[int]:
    """Wait for each process to end (pidfds: no polling); the ones still alive after WAIT_S."""
    alive = []
    for pid in pids:
        try:
            handle = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            if not select.select([handle], [], [], WAIT_S)[0]:
                alive.append(pid)
        finally:
            os.close(handle)
    return alive


def torchls_folders(temp: Path) -> list[str]:
    return sorted(path.name for path in temp.iterdir() if path.name.startswith("torchls-"))


# -- the repro: answered at once, reported later ---------------------------------------------------


async def test_run_repro_answers_at_once_and_reports_later(tmp_path: Path):
    async with eglot(tmp_path) as client:
        doc = await opened(client, tmp_path / "nan.py", NAN)
        since = len(client.publishes)

        result = await run_repro(client, doc)

        assert result["status"] == "started"
        assert "nan.py" in result["message"]
        assert client.progress_reports == {}  # and no progress was asked for (spec check)
        started = await message(client, "running the repro of nan.py")
        assert started.type == types.MessageType.Info
        [tl901] = [d for d in await probe_diagnostics(client, doc, since) if d.code == "TL901"]
        assert tl901.range == range_of(NAN, "torch.log(probs)", client.encoding)
        summary = await message(client, "repro of nan.py: ok")
        assert "TL901" in summary.message
        # The trace hover, as plain text: an aligned table, no Markdown left.
        trace = await hover(client, doc, position_of(NAN, "tag", client.encoding))
        assert trace.kind == types.MarkupKind.PlainText
        assert "|" not in trace.value and "**" not in trace.value and "`" not in trace.value
        lines = trace.value.splitlines()
        header = next(line for line in lines if line.startswith("expression"))
        row = next(line for line in lines if line.startswith("torch.log(probs)"))
        assert row.index("[8, 3]") == header.index("shape")
        assert "First non-finite value" in trace.value


# -- shutdown, exit, and what a killed server leaves -----------------------------------------------


class BlockingSession:
    """A repro session whose close() takes until the test releases it."""

    def __init__(self) -> None:
        self.closing = threading.Event()
        self.release = threading.Event()
        self.closed = threading.Event()

    def close(self) -> None:
        self.closing.set()
        self.release.wait(WAIT_S)
        self.closed.set()


def test_shutdown_returns_before_the_session_is_closed_and_exit_waits_for_it():
    controller = ReproController(server=None)  # type: ignore[arg-type]  # not used by closing
    session = BlockingSession()
    controller._session = session  # type: ignore[assignment]

    controller.begin_close()  # what the shutdown handler runs before it answers

    assert session.closing.wait(WAIT_S)  # the close is under way ...
    assert not session.closed.is_set()  # ... and the shutdown answer did not wait for it
    with pytest.raises(RuntimeError, match="shutting down"):
        controller.session()  # no new session (and no new worker) after shutdown
    session.release.set()
    controller.close()  # what exit runs
    assert session.closed.is_set()


@pytest.mark.parametrize("ending", ["shutdown-exit", "killed-after-exit", "killed"])
async def test_nothing_is_left_behind(tmp_path: Path, ending: str):
    """ "shutdown-exit": the polite end (the server exits by itself); "killed-after-exit": what
    eglot does (SIGKILL as soon as `exit` is written); "killed": no shutdown at all."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    async with eglot(tmp_path, temp) as client:
        doc = await opened(client, tmp_path / "nan.py", NAN)
        since = len(client.publishes)
        assert (await run_repro(client, doc))["status"] == "started"
        await probe_diagnostics(client, doc, since)
        server = client._server
        assert server is not None
        # Everything the server started: the warm worker (under bubblewrap or not) and the
        # helper that removes this server's folders once it is gone.
        started = leftovers(str(temp))
        assert started, "the helper, at least, mentions the server's temporary folder"
        if ending == "shutdown-exit":
            await client.shutdown_session()
            assert server.returncode == 0
            # The server exited only once its session was closed: nothing of it remains.
            assert torchls_folders(temp) == []
        else:
            if ending == "killed-after-exit":
                await client.shutdown_async(None)
                client.exit(None)
            server.send_signal(signal.SIGKILL)
            await server.wait()

    assert wait_until_gone(started) == []
    assert torchls_folders(temp) == []


async def test_start_up_removes_the_folders_of_dead_servers_only(tmp_path: Path):
    temp = tmp_path / "tmp"
    temp.mkdir()
    namespace = pid_namespace()
    dead = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process can have it
    gone = temp / f"torchls-repro-{dead}-{namespace}-abc123"
    (gone / "probe" / "torchls_probe").mkdir(parents=True)
    (gone / "probe" / "torchls_probe" / "worker.py").write_text("")
    (gone / "probe" / "torchls_probe" / "worker.py").chmod(stat.S_IRUSR)
    (gone / "home" / "locked").mkdir(parents=True)
    (gone / "home" / "locked" / "data").write_text("x")
    (gone / "home" / "locked").chmod(0)  # a run's code can lock its own folders
    rules = temp / f"torchls-rules-{dead}-{namespace}-zz9_x"
    rules.mkdir()
    (rules / "TL101.md").write_text("# TL101")
    kept = {
        f"torchls-repro-{os.getpid()}-{namespace}-live01",  # a live process (this test)
        f"torchls-repro-{dead}-{namespace + 1}-other1",  # another PID namespace: unknowable
        "torchls-repro-legacy1",  # made before owners were named: unknowable
        "torchls-repro-notes.txt",
    }
    for name in kept - {"torchls-repro-notes.txt"}:
        (temp / name).mkdir()
    (temp / "torchls-repro-notes.txt").write_text("a file, not a folder")
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "precious").write_text("keep me")
    link = f"torchls-repro-{dead}-{namespace}-link01"
    (temp / link).symlink_to(target, target_is_directory=True)
    kept.add(link)

    async with eglot(tmp_path, temp) as client:
        logged = await notification(
            client,
            types.WINDOW_LOG_MESSAGE,
            lambda: list(client.log_messages),
            lambda params: "left by stopped servers" in params.message,
        )

    assert "removed 2 folder(s)" in logged.message
    assert set(torchls_folders(temp)) == kept
    assert (target / "precious").read_text() == "keep me"


# -- plain text ------------------------------------------------------------------------------------


async def test_loss_contract_hover_is_plain_text(tmp_path: Path):
    async with eglot(tmp_path) as client:
        doc = await opened(client, tmp_path / "train.py", TRAIN)

        contents = await hover(client, doc, position_of(TRAIN, "cross_entropy", client.encoding))

        assert contents.kind == types.MarkupKind.PlainText
        assert contents.value.startswith("CrossEntropyLoss contract\n")
        assert "- input: [N, C]" in contents.value and "raw logits" in contents.value
        assert "**" not in contents.value and "`" not in contents.value


@pytest.mark.parametrize("docs_url", [None, "https://example.invalid/rules/{code}.html"])
async def test_show_documentation_arrives_as_a_plain_text_message(
    tmp_path: Path, docs_url: str | None
):
    options = {"docsUrl": docs_url} if docs_url else None
    async with eglot(tmp_path, options=options) as client:
        markdown = await client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="torchls.showRuleDoc", arguments=["TL101"])
        )
        page = await message(client, "What it catches")

    assert markdown == rule_markdown(get_rule("TL101"))  # the answer is unchanged
    assert client.shown_documents == []
    assert page.type == types.MessageType.Info
    assert page.message.startswith("TL101 softmax-before-cross-entropy\n=====")
    assert "##" not in page.message and "`" not in page.message
    if docs_url:
        assert page.message.endswith("\n\nOnline: https://example.invalid/rules/TL101.html")
    else:
        assert "Online:" not in page.message


# -- code actions ----------------------------------------------------------------------------------


async def actions(
    client: RecordingClient,
    doc: Doc,
    where: types.Range,
    diagnostics: list[types.Diagnostic],
    only: list[str] | None = None,
) -> list[types.CodeAction]:
    answer = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(doc.uri),
            range=where,
            context=types.CodeActionContext(diagnostics=diagnostics, only=only),
        )
    )
    return [a for a in answer or [] if isinstance(a, types.CodeAction)]


def default_of(offered: list[types.CodeAction]) -> str | None:
    """What eglot 1.9 selects when the user presses Enter: the first preferred, else the first."""
    preferred = [a for a in offered if a.is_preferred]
    return (preferred or offered)[0].title if offered else None


async def test_off_a_finding_there_is_no_fix_all_to_enter_into(tmp_path: Path):
    async with eglot(tmp_path) as client:
        since = len(client.publishes)
        doc = open_doc(client, tmp_path / "train.py", MIXED)
        assert await diagnostics_of(client, doc, since)
        # The point on `import torch.nn as nn` (eglot sends the sexp at point, no diagnostic).
        where = range_of(MIXED, "nn", client.encoding)

        assert await actions(client, doc, where, []) == []
        # Asked for source actions by kind, fix-all is still there.
        source = await actions(client, doc, where, [], only=["source"])
        assert [a.kind for a in source] == ["source.fixAll.torchls"]


async def test_only_the_findings_own_fix_is_preferred(tmp_path: Path):
    async with eglot(tmp_path) as client:
        since = len(client.publishes)
        doc = open_doc(client, tmp_path / "train.py", MIXED)
        diagnostics = await diagnostics_of(client, doc, since)
        [tl101] = [d for d in diagnostics if d.code == "TL101"]

        # What eglot sends with the point on `probs`: the sexp, and the diagnostic there.
        on_it = await actions(client, doc, range_of(MIXED, "probs, y", client.encoding), [tl101])
        assert [a.title for a in on_it if a.is_preferred] == [
            a.title for a in on_it if a.title.startswith("Fix TL101: ")
        ]
        own = next(a.title for a in on_it if a.title.startswith("Fix TL101: "))
        assert default_of(on_it) == own
        titles = [a.title for a in on_it]
        assert titles.index(own) < titles.index("Fix all safely fixable torchls problems")
        # A range over several findings, none sent: fixes are offered, none preferred.
        lines = MIXED.split("\n")
        everything = types.Range(types.Position(0, 0), types.Position(len(lines) - 1, 0))
        several = await actions(client, doc, everything, [])
        assert sum(a.title.startswith("Fix TL") for a in several) == 3
        assert [a.title for a in several if a.is_preferred] == []
        assert default_of(several) != "Fix all safely fixable torchls problems"


# -- the plain-text rendering itself ---------------------------------------------------------------


def test_tables_become_aligned_columns_even_with_wide_characters():
    markdown = "| name | value |\n|---|:-:|\n| `界界` | 1 |\n| x \\| y | **22** |"

    assert render(markdown).splitlines() == [
        "name   value",
        "-----  -----",
        "界界   1",
        "x | y  22",
    ]


def test_markers_and_escapes_go_and_words_stay():
    assert inline("Set `torchls.probe.python` to **the** *one*") == (
        "Set torchls.probe.python to the one"
    )
    assert inline(r"\*\*not bold\*\* [docs](https://x.invalid) a_b_c **`code`**") == (
        "**not bold** docs (https://x.invalid) a_b_c code"
    )
    assert render("# Title\n\n```python\nx = 1\n```\n\n---\n- item") == (
        "Title\n=====\n\n    x = 1\n\n" + "-" * 40 + "\n- item"
    )
