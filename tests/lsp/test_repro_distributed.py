"""The distributed repro in the editor: `probe.nproc` from the settings, over stdio.

A real server runs `torchls.runRepro` with `{"probe": {"nproc": 2}}` in its configuration:
the script runs under torchrun on two ranks (real torch, gloo on the CPU), the work-done
progress follows rank 0's steps and names the other rank's stages, the hover says which rank it
shows and marks a line whose values differ between ranks, a rank that hangs in a collective
gives TL908 as a diagnostic on that line (it and the static TL801 there confirm each other),
and cancelling the progress kills torchrun, both ranks and the processes they started.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path

import pytest
from lsprotocol import types

from tests.probe.support import leftovers

from .support import diagnostics_of, open_doc, position_of, session

pytest.importorskip("torch")
if not sys.platform.startswith("linux"):
    pytest.skip("the sandboxed repro runs on Linux", allow_module_level=True)

SETTINGS = {"probe": {"device": "cpu", "timeout": 40, "nproc": 2}}

# Each rank trains on its own shard, so the loss line differs between them.
SHARDED = """\
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
torch.manual_seed(0)
data = torch.randn(8, 3)
net = DDP(nn.Linear(3, 1))
sgd = torch.optim.SGD(net.parameters(), lr=0.05)
for step in range(4):
    shard = data[dist.get_rank()::2]
    loss = net(shard).square().mean()
    sgd.zero_grad()
    loss.backward()
    sgd.step()
"""

# Rank 1 waits in an all_reduce that rank 0 never makes.
ONE_SIDED = """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.ones(2)
if dist.get_rank() == 1:
    dist.all_reduce(total)
"""

# Every rank starts a process of its own and finishes one step, then never returns.
STUCK = """\
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

dist.init_process_group("gloo")
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "{marker}"])
net = nn.Linear(2, 1)
sgd = torch.optim.SGD(net.parameters(), lr=0.1)
for step in range(100):
    loss = net(torch.ones(4, 2)).sum()
    sgd.zero_grad()
    loss.backward()
    sgd.step()
    while True:
        time.sleep(0.05)
"""


async def run_repro(client, doc, **extra):
    return await client.workspace_execute_command_async(
        types.ExecuteCommandParams(
            command="torchls.runRepro", arguments=[{"uri": doc.uri, **extra}]
        )
    )


async def hover_text(client, doc, where: types.Position) -> str:
    hover = await client.text_document_hover_async(
        types.HoverParams(text_document=types.TextDocumentIdentifier(doc.uri), position=where)
    )
    return hover.contents.value if hover is not None else ""


async def opened(client, path: Path, text: str):
    since = len(client.publishes)
    doc = open_doc(client, path, text)
    await diagnostics_of(client, doc, since)
    return doc


async def test_nproc_setting_runs_two_ranks_with_progress_and_a_rank_aware_hover(tmp_path: Path):
    async with session("visual_studio_code", configuration=SETTINGS, root=tmp_path) as client:
        doc = await opened(client, tmp_path / "train.py", SHARDED)
        before = set(client.progress_reports)

        result = await run_repro(client, doc)

        assert result["status"] == "ok", result
        assert not [f for f in result["findings"] if f["severity"] in ("error", "warning")]
        [token] = set(client.progress_reports) - before
        values = client.progress_reports[token]
        assert isinstance(values[0], types.WorkDoneProgressBegin)
        assert isinstance(values[-1], types.WorkDoneProgressEnd)
        messages = [v.message for v in values if isinstance(v, types.WorkDoneProgressReport)]
        assert "starting torchrun with 2 ranks" in messages
        assert "step 1 of 2" in messages and "step 2 of 2" in messages
        assert any(m and m.startswith("rank 1: ") for m in messages), messages
        text = await hover_text(client, doc, position_of(SHARDED, "loss = net", client.encoding))
        assert "rank 0 of 2" in text
        assert "differ between ranks" in text and "rank 1:" in text


async def test_a_one_sided_collective_is_a_tl908_diagnostic_on_its_line(tmp_path: Path):
    settings = {"probe": {**SETTINGS["probe"], "timeout": 30}}
    async with session("visual_studio_code", configuration=settings, root=tmp_path) as client:
        doc = await opened(client, tmp_path / "train.py", ONE_SIDED)
        since = len(client.publishes)

        result = await run_repro(client, doc)

        assert [f["code"] for f in result["findings"]] == ["TL908"], result

        def published(params: types.PublishDiagnosticsParams) -> bool:
            return params.uri == doc.uri and any(d.code == "TL908" for d in params.diagnostics)

        diagnostics = (await client.wait_for_publish(published, since)).diagnostics
        [hang] = [d for d in diagnostics if d.code == "TL908"]
        assert hang.source == "torchls-probe"
        assert hang.range.start.line == ONE_SIDED.splitlines().index("    dist.all_reduce(total)")
        assert "reached by rank 1 but not by rank 0" in hang.message
        # The static TL801 on the same line and the run's TL908 confirm each other.
        assert "torchls also finds this statically: TL801" in hang.message
        [static] = [d for d in diagnostics if d.code == "TL801"]
        assert "confirmed at run time by the repro: TL908" in static.message


async def test_cancel_kills_torchrun_every_rank_and_their_children(tmp_path: Path):
    marker = f"torchls-ranks-cancel-{uuid.uuid4().hex}"
    async with session("visual_studio_code", configuration=SETTINGS, root=tmp_path) as client:
        doc = await opened(client, tmp_path / "train.py", STUCK.format(marker=marker))
        before = set(client.progress_reports)
        running = asyncio.ensure_future(run_repro(client, doc, steps=5))

        token, _ = await client.wait_for_progress(
            lambda token, value: (
                token not in before
                and isinstance(value, types.WorkDoneProgressReport)
                and value.message == "step 1 of 5"
            )
        )
        for _ in range(100):
            if len(leftovers(marker)) == 2:
                break
            await asyncio.sleep(0.1)
        assert len(leftovers(marker)) == 2, "each rank's own child should be running"
        client.window_work_done_progress_cancel(types.WorkDoneProgressCancelParams(token=token))
        result = await running

        assert result["status"] == "cancelled"
        assert isinstance(client.progress_reports[token][-1], types.WorkDoneProgressEnd)
        # torchrun and the ranks name the run's folder, which names this server's pid.
        run_folder = f"torchls-repro-{client._server.pid}-"
        for _ in range(100):
            if not leftovers(marker) and not leftovers(run_folder):
                break
            await asyncio.sleep(0.1)
        assert leftovers(marker) == []
        assert leftovers(run_folder) == []
