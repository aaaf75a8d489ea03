"""The repro in the editor, end to end: a real server over stdio runs real torch in the sandbox.

"Run bounded repro" is offered inside training loops and train steps only; `torchls.runRepro`
publishes TL901 on the line that made the NaN (push and pull clients, UTF-16 and UTF-8), with
work-done progress; the hover shows the traced tensors and where the NaN came from; an edit
makes a traced line stale; a re-run replaces, `torchls.clearRepro` clears; cancelling stops the
sandbox and everything it started; untrusted workspaces are refused; and a missing torch or a
hit limit reaches the user with the setting that fixes it.

Most tests share one server per editor flavour whose workspace folder holds every test's
script, so after the first (cold) run they are served by the warm worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from lsprotocol import types

from tests.probe.support import leftovers

from .support import (
    Doc,
    RecordingClient,
    change_doc,
    diagnostics_of,
    open_doc,
    position_of,
    range_of,
    session,
)

pytest.importorskip("torch")
if not sys.platform.startswith("linux"):
    pytest.skip("the sandboxed repro runs on Linux", allow_module_level=True)

PROBE = {"device": "cpu", "timeout": 30}

# The NaN is born on the `torch.log` line (log of the zeros the mask made) and reaches the
# loss on the next one. The emoji before it makes UTF-16 and UTF-8 columns differ from code
# points, so a conversion in the wrong units lands outside the call.
NAN = """\
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
model = nn.Linear(4, 3)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(8, 4)
y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
for step in range(10):
    probs = F.softmax(model(x), dim=1) * (y[:, None] != 0)
    tag = "🔥"; logp = torch.log(probs)
    loss = -(logp * F.one_hot(y, 3)).sum() / len(y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""
LOG_CALL = "torch.log(probs)"
LOG_LINE = NAN.splitlines().index('    tag = "🔥"; logp = torch.log(probs)')

# Softmax output passed as logits: TL101 statically, TL903 at run time, on the same line.
PROBS_AS_LOGITS = """\
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
model = nn.Linear(4, 3)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(8, 4)
y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
for step in range(10):
    probs = F.softmax(model(x), dim=1)
    loss = F.cross_entropy(probs, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""

TRAIN_STEP = """\
import torch


def train_step(model, batch, optimizer):
    inputs, targets = batch
    loss = torch.nn.functional.mse_loss(model(inputs), targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def evaluate(model, batch):
    return model(batch[0]).sum()
"""

# Spawns a process of its own (to prove the whole sandbox dies), finishes one optimizer step
# (so "step 1" progress tells the test it got there), then never returns.
HANG = """\
import subprocess
import sys
import time

import torch
import torch.nn as nn

sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "{marker}"])
model = nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(100):
    loss = model(torch.ones(4, 2)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    while True:
        time.sleep(0.05)
"""


# -- fixtures and helpers -------------------------------------------------------------------------


class Servers:
    """One server per flavour for the whole module, started on first use."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.stack = contextlib.AsyncExitStack()
        self.clients: dict[str, RecordingClient] = {}

    async def get(self, flavour: str) -> RecordingClient:
        if flavour not in self.clients:
            self.clients[flavour] = await self.stack.enter_async_context(
                session(flavour, configuration={"probe": PROBE}, root=self.root)
            )
        return self.clients[flavour]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def servers(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Servers]:
    servers = Servers(tmp_path_factory.mktemp("repro-workspace"))
    yield servers
    await servers.stack.aclose()


@pytest.fixture
def folder(servers: Servers, request: pytest.FixtureRequest) -> Path:
    """This test's own folder inside the shared workspace."""
    name = request.node.name.replace("[", "_").replace("]", "")
    path = servers.root / name
    path.mkdir()
    return path


async def opened(client: RecordingClient, path: Path, text: str) -> Doc:
    """Open `text` (also written to disk, which is what the repro runs) and wait for its
    first diagnostics."""
    since = len(client.publishes)
    doc = open_doc(client, path, text)
    await diagnostics_of(client, doc, since)
    return doc


async def run_repro(client: RecordingClient, doc: Doc, **extra: Any) -> dict[str, Any]:
    result = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(
            command="torchls.runRepro", arguments=[{"uri": doc.uri, **extra}]
        )
    )
    assert isinstance(result, dict), result
    return result


async def probe_diagnostics(
    client: RecordingClient, doc: Doc, since: int, present: bool = True
) -> list[types.Diagnostic]:
    """The diagnostics of `doc`'s current version once the repro's are in (or, with
    `present=False`, gone)."""
    if client.pull:
        return await diagnostics_of(client, doc, since)

    def done(params: types.PublishDiagnosticsParams) -> bool:
        has_probe = any(d.source == "torchls-probe" for d in params.diagnostics)
        return params.uri == doc.uri and params.version == doc.version and has_probe == present

    return list((await client.wait_for_publish(done, since)).diagnostics)


async def hover_text(client: RecordingClient, doc: Doc, where: types.Position) -> str:
    hover = await client.text_document_hover_async(
        types.HoverParams(text_document=types.TextDocumentIdentifier(doc.uri), position=where)
    )
    if hover is None:
        return ""
    assert isinstance(hover.contents, types.MarkupContent)
    return hover.contents.value


async def actions_at(client: RecordingClient, doc: Doc, needle: str) -> list[types.CodeAction]:
    where = range_of(doc.text, needle, client.encoding)
    actions = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(doc.uri),
            range=where,
            context=types.CodeActionContext(diagnostics=[]),
        )
    )
    return [a for a in actions or [] if isinstance(a, types.CodeAction)]


def repro_actions(actions: list[types.CodeAction]) -> list[types.CodeAction]:
    return [a for a in actions if a.title == "Run bounded repro"]


def by_code(diagnostics: list[types.Diagnostic], code: str) -> list[types.Diagnostic]:
    return [d for d in diagnostics if d.code == code]


# -- the action -----------------------------------------------------------------------------------


async def test_action_is_offered_in_training_loops_and_steps_only(servers: Servers, folder: Path):
    client = await servers.get("visual_studio_code")
    loop_doc = await opened(client, folder / "loop.py", NAN)
    step_doc = await opened(client, folder / "step.py", TRAIN_STEP)

    for doc, needle in ((loop_doc, "opt.zero_grad()"), (step_doc, "inputs, targets = batch")):
        offered = repro_actions(await actions_at(client, doc, needle))
        assert len(offered) == 1, needle
        assert offered[0].kind == "torchls.repro"
        assert offered[0].command is not None
        assert offered[0].command.command == "torchls.runRepro"
        assert list(offered[0].command.arguments or []) == [{"uri": doc.uri}]
    for doc, needle in ((loop_doc, "x = torch.randn(8, 4)"), (step_doc, "model(batch[0])")):
        assert repro_actions(await actions_at(client, doc, needle)) == [], needle


# -- running: diagnostics, progress, hover ---------------------------------------------------------


@pytest.mark.parametrize("flavour", ["visual_studio_code", "neovim"])
async def test_run_publishes_tl901_on_the_line_that_made_the_nan(
    servers: Servers, folder: Path, flavour: str
):
    client = await servers.get(flavour)
    doc = await opened(client, folder / "train.py", NAN)
    since = len(client.publishes)

    result = await run_repro(client, doc)

    assert result["status"] == "ok", result
    diagnostics = await probe_diagnostics(client, doc, since)
    [tl901] = by_code(diagnostics, "TL901")
    assert tl901.source == "torchls-probe"
    assert tl901.range == range_of(NAN, LOG_CALL, client.encoding)
    assert "torch.log" in tl901.message
    if not client.pull:  # this client announces related information: the path to the loss
        assert tl901.related_information
        assert tl901.related_information[0].location.uri == doc.uri
        assert tl901.related_information[0].location.range.start.line == LOG_LINE + 1

    # The trace of the NaN's line: its tensor's shape, and that it is where the NaN was born.
    line_hover = await hover_text(client, doc, position_of(NAN, "tag", client.encoding))
    assert "[8, 3]" in line_hover and "float32" in line_hover
    assert "✗" in line_hover and "-inf" in line_hover
    assert "First non-finite value" in line_hover and "Origin" in line_hover
    assert "Path to the loss" in line_hover
    # A later use of the name shows that value's trace.
    name_hover = await hover_text(client, doc, position_of(NAN, "logp *", client.encoding))
    assert "**`logp`**" in name_hover and "[8, 3]" in name_hover


async def test_progress_reports_the_probe_stages(servers: Servers, folder: Path):
    client = await servers.get("visual_studio_code")
    doc = await opened(client, folder / "train.py", NAN)
    before = set(client.progress_reports)

    await run_repro(client, doc, steps=2)

    [token] = set(client.progress_reports) - before
    values = client.progress_reports[token]
    assert isinstance(values[0], types.WorkDoneProgressBegin)
    assert values[0].cancellable is True and "train.py" in values[0].title
    assert isinstance(values[-1], types.WorkDoneProgressEnd)
    reports = [v for v in values[1:-1] if isinstance(v, types.WorkDoneProgressReport)]
    assert len(reports) == len(values) - 2
    messages = [r.message for r in reports]
    assert "step 1 of 2" in messages and "step 2 of 2" in messages
    percentages = [r.percentage for r in reports]
    assert percentages == sorted(percentages)
    assert "TL901" in (values[-1].message or "")


async def test_static_tl101_and_runtime_tl903_confirm_each_other(servers: Servers, folder: Path):
    client = await servers.get("visual_studio_code")
    doc = await opened(client, folder / "train.py", PROBS_AS_LOGITS)
    since = len(client.publishes)

    await run_repro(client, doc)

    diagnostics = await probe_diagnostics(client, doc, since)
    [static] = by_code(diagnostics, "TL101")
    [runtime] = by_code(diagnostics, "TL903")
    assert "confirmed at run time by the repro" in static.message
    assert "also finds this statically: TL101" in runtime.message


# -- results over time: edits, re-runs, clearing ---------------------------------------------------


async def test_editing_a_traced_line_makes_it_stale(servers: Servers, folder: Path):
    client = await servers.get("visual_studio_code")
    doc = await opened(client, folder / "train.py", NAN)
    since = len(client.publishes)
    await run_repro(client, doc)
    await probe_diagnostics(client, doc, since)

    # A line inserted above only moves the trace and the finding along.
    shifted = "# a comment\n" + NAN
    since = len(client.publishes)
    change_doc(client, doc, shifted)
    [tl901] = by_code(await probe_diagnostics(client, doc, since), "TL901")
    assert tl901.range == range_of(shifted, LOG_CALL, client.encoding)
    fresh = await hover_text(client, doc, position_of(shifted, "tag", client.encoding))
    assert "[8, 3]" in fresh and "Stale" not in fresh

    # Editing the line itself: its hover says the trace is stale, its finding is dropped.
    edited = shifted.replace(LOG_CALL, "torch.log(probs + 1e-8)")
    since = len(client.publishes)
    change_doc(client, doc, edited)
    diagnostics = await probe_diagnostics(client, doc, since, present=False)
    assert by_code(diagnostics, "TL901") == []
    stale = await hover_text(client, doc, position_of(edited, "tag", client.encoding))
    assert "Stale" in stale and "[8, 3]" in stale
    untouched = await hover_text(client, doc, position_of(edited, "probs = F", client.encoding))
    assert "Stale" not in untouched and "F.softmax" in untouched


async def test_a_rerun_replaces_and_clear_removes(servers: Servers, folder: Path):
    client = await servers.get("visual_studio_code")
    doc = await opened(client, folder / "train.py", NAN)
    since = len(client.publishes)
    await run_repro(client, doc)
    assert by_code(await probe_diagnostics(client, doc, since), "TL901")

    fixed = NAN.replace(LOG_CALL, "torch.log(probs + 1e-8)")
    (folder / "train.py").write_text(fixed, encoding="utf-8")
    since = len(client.publishes)
    change_doc(client, doc, fixed)
    result = await run_repro(client, doc)
    assert result["findings"] == []
    diagnostics = await probe_diagnostics(client, doc, since, present=False)
    assert by_code(diagnostics, "TL901") == []
    assert "✓" in await hover_text(client, doc, position_of(fixed, "tag", client.encoding))
    assert any("no runtime problems found" in m.message for m in client.messages)

    since = len(client.publishes)
    cleared = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="torchls.clearRepro", arguments=[{"uri": doc.uri}])
    )
    assert cleared["status"] == "cleared"
    await client.wait_for_publish(lambda p: p.uri == doc.uri and p.version == doc.version, since)
    assert await hover_text(client, doc, position_of(fixed, "tag", client.encoding)) == ""


# -- cancelling ------------------------------------------------------------------------------------


def step_reported(token: Any, value: Any) -> bool:
    return isinstance(value, types.WorkDoneProgressReport) and value.message == "step 1 of 5"


async def test_cancel_stops_the_sandbox_and_everything_in_it(servers: Servers, folder: Path):
    client = await servers.get("visual_studio_code")
    marker = f"torchls-cancel-{uuid.uuid4().hex}"
    doc = await opened(client, folder / "hang.py", HANG.format(marker=marker))
    before = set(client.progress_reports)
    running = asyncio.ensure_future(run_repro(client, doc, steps=5))

    token, _ = await client.wait_for_progress(
        lambda token, value: token not in before and step_reported(token, value)
    )
    assert leftovers(marker), "the script's own child process should be running"
    # While the run is in flight the server keeps answering: diagnostics and hover.
    since = len(client.publishes)
    change_doc(client, doc, doc.text + "\n# edited while the repro runs\n")
    await diagnostics_of(client, doc, since)
    await hover_text(client, doc, position_of(doc.text, "opt.step", client.encoding))
    assert not running.done()
    client.window_work_done_progress_cancel(types.WorkDoneProgressCancelParams(token=token))
    result = await running

    assert result["status"] == "cancelled"
    assert "cancelled" in result["message"]
    assert any("cancelled" in m.message for m in client.messages)
    assert isinstance(client.progress_reports[token][-1], types.WorkDoneProgressEnd)
    assert leftovers(marker) == []


async def test_a_new_run_on_the_same_file_cancels_the_old_one(servers: Servers, folder: Path):
    client = await servers.get("visual_studio_code")
    marker = f"torchls-supersede-{uuid.uuid4().hex}"
    doc = await opened(client, folder / "train.py", HANG.format(marker=marker))
    before = set(client.progress_reports)
    first = asyncio.ensure_future(run_repro(client, doc, steps=5))
    await client.wait_for_progress(
        lambda token, value: token not in before and step_reported(token, value)
    )

    (folder / "train.py").write_text(NAN, encoding="utf-8")
    second = await run_repro(client, doc)

    assert (await first)["status"] == "cancelled"
    assert (await first).get("superseded") is True
    assert [f["code"] for f in second["findings"]] == ["TL901"]
    assert leftovers(marker) == []


# -- trust and failures ----------------------------------------------------------------------------


async def test_untrusted_workspace_neither_offers_nor_runs(tmp_path: Path):
    async with session("visual_studio_code", initialization_options={"trusted": False}) as client:
        doc = await opened(client, tmp_path / "train.py", NAN)

        assert repro_actions(await actions_at(client, doc, "opt.zero_grad()")) == []
        result = await run_repro(client, doc)

        assert result["status"] == "refused"
        assert "not trusted" in result["message"]
        assert any("not trusted" in m.message for m in client.messages)
        assert client.progress_reports == {}


async def test_an_interpreter_without_torch_names_the_setting(tmp_path: Path):
    # The project's .venv is the default interpreter; this one starts Python without its
    # site-packages, so torch cannot be imported there.
    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n', encoding="utf-8")
    python.chmod(0o755)
    (venv / "pyvenv.cfg").write_text(f"home = {Path(sys.executable).parent}\n", encoding="utf-8")
    async with session("visual_studio_code", root=tmp_path) as client:
        doc = await opened(client, tmp_path / "train.py", NAN)

        result = await run_repro(client, doc)

        assert result["status"] == "failed"
        message = result["message"]
        assert "torch cannot be imported" in message and str(python) in message
        assert "torchls.probe.python" in message
        assert any(m.message == message for m in client.messages)


async def test_a_run_stopped_by_the_timeout_names_the_limit(tmp_path: Path):
    configuration = {"probe": {"device": "cpu", "timeout": 1}}
    async with session("visual_studio_code", configuration=configuration, root=tmp_path) as client:
        doc = await opened(
            client, tmp_path / "hang.py", "import time\nwhile True:\n    time.sleep(0.05)\n"
        )
        since = len(client.publishes)

        result = await run_repro(client, doc)

        assert result["status"] == "timeout"
        assert by_code(await probe_diagnostics(client, doc, since), "TL906")
        warning = [m.message for m in client.messages if m.type == types.MessageType.Warning]
        assert any("wall-clock limit of 1 s" in m and "torchls.probe.timeout" in m for m in warning)
