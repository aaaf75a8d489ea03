"""The distributed repro (`--nproc 2`): real torch on the CPU, two ranks under torchrun, gloo.

Each script is small (a linear layer, a few steps) and runs cold through `run_repro`, which is
what `torchls repro --nproc 2` and the editor call. What is checked: a barrier only rank 0
reaches is a TL908 hang with both ranks' stacks, within the bound; an unwrapped model seeded
per rank is a TL909 divergence (and `# noqa: TL909` on its line says it is meant); a
DistributedSampler without `set_epoch` and a loader without one are TL910; every rank writing
one checkpoint is TL803; a clean DDP script has no warning or error; a rank that raises, one
that is killed, a port in use and a rendezvous that never completes each give a report that
says so, and nothing is left running after any of them, after a timeout or after a cancel
(with and without bubblewrap). The merging of rank reports is unit-tested without torch.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.probe.support import bwrap_usable, codes, layer, leftovers
from torchls.probe import ReproCancelled, ReproOptions, ReproUsageError, run_repro
from torchls.records import replace

if not sys.platform.startswith("linux"):
    pytest.skip("the distributed repro is tested on Linux", allow_module_level=True)

SETTLE_S = 10.0
TIMEOUT_S = 40.0

CLEAN_DDP = """\
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

dist.init_process_group("gloo")
torch.manual_seed(0)
samples = TensorDataset(torch.randn(24, 3), torch.randint(0, 2, (24,)))
sampler = DistributedSampler(samples, shuffle=True)
loader = DataLoader(samples, batch_size=4, sampler=sampler)
net = DDP(nn.Linear(3, 2))
sgd = torch.optim.SGD(net.parameters(), lr=0.05)
for epoch in range(2):
    sampler.set_epoch(epoch)
    for inputs, labels in loader:
        loss = nn.functional.cross_entropy(net(inputs), labels)
        sgd.zero_grad()
        loss.backward()
        sgd.step()
"""

BARRIER_ON_RANK_0 = """\
import torch
import torch.distributed as dist
import torch.nn as nn

dist.init_process_group("gloo")
me = dist.get_rank()
layer = nn.Linear(3, 1)
sgd = torch.optim.SGD(layer.parameters(), lr=0.05)
for step in range(3):
    if me == 0:
        dist.barrier()  # <- barrier
    loss = layer(torch.randn(4, 3)).square().mean()
    sgd.zero_grad()
    loss.backward()
    sgd.step()  # <- step
"""

SEEDED_PER_RANK = """\
import torch
import torch.distributed as dist
import torch.nn as nn

dist.init_process_group("gloo")
torch.manual_seed(dist.get_rank())  # <- seed
layer = nn.Linear(3, 2)  # <- built
sgd = torch.optim.SGD(layer.parameters(), lr=0.05)
for step in range(3):
    loss = layer(torch.randn(4, 3)).square().mean(){noqa}  # <- call
    sgd.zero_grad()
    loss.backward()
    sgd.step()
"""

# Replicas seeded per rank, built without DDP and never broadcast, gradients all-reduced by
# hand: the steps agree, the starting points never did.
HAND_ALL_REDUCE = """\
import torch
import torch.distributed as dist
import torch.nn as nn

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(1234 + rank)  # <- seed
net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))  # <- built
opt = torch.optim.SGD(net.parameters(), lr=0.05)
torch.manual_seed(0)
for step in range(3):
    loss = net(torch.randn(4, 3)).square().mean()  # <- call
    opt.zero_grad()
    loss.backward()
    for p in net.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    opt.step()
"""

NO_SET_EPOCH = """\
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

dist.init_process_group("gloo")
torch.manual_seed(0)
samples = TensorDataset(torch.randn(8, 3), torch.randn(8, 1))
loader = DataLoader(samples, batch_size=2, sampler=DistributedSampler(samples, shuffle=True))
net = DDP(nn.Linear(3, 1))
sgd = torch.optim.SGD(net.parameters(), lr=0.05)
for epoch in range(3):
    for inputs, targets in loader:  # <- loop
        loss = nn.functional.mse_loss(net(inputs), targets)
        sgd.zero_grad()
        loss.backward()
        sgd.step()
"""

WHOLE_DATASET_EVERYWHERE = """\
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

dist.init_process_group("gloo")
torch.manual_seed(0)
samples = TensorDataset(torch.randn(12, 3), torch.randn(12, 1))
loader = DataLoader(samples, batch_size=3, shuffle=True)  # <- loader
net = DDP(nn.Linear(3, 1))
sgd = torch.optim.SGD(net.parameters(), lr=0.05)
for inputs, targets in loader:  # <- loop
    loss = nn.functional.mse_loss(net(inputs), targets)
    sgd.zero_grad()
    loss.backward()
    sgd.step()
    torch.save(net.state_dict(), "last.pt")  # <- save
"""

RAISES_ON_RANK_1 = """\
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
net = DDP(nn.Linear(3, 1))
sgd = torch.optim.SGD(net.parameters(), lr=0.05)
for step in range(4):
    batch = torch.randn(6, 3)
    if dist.get_rank() == 1 and step == 1:
        batch = batch.reshape(4, 5)  # <- raise
    loss = net(batch).square().mean()
    sgd.zero_grad()
    loss.backward()
    sgd.step()
"""

KILLED_ON_RANK_1 = """\
import os
import signal

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
net = DDP(nn.Linear(3, 1))
sgd = torch.optim.SGD(net.parameters(), lr=0.05)
for step in range(4):
    if dist.get_rank() == 1 and step == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # what the out-of-memory killer does
    loss = net(torch.randn(6, 3)).square().mean()
    sgd.zero_grad()
    loss.backward()
    sgd.step()
"""

MEMORY_ON_RANK_1 = """\
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
net = DDP(nn.Linear(3, 1))
sgd = torch.optim.SGD(net.parameters(), lr=0.05)
hoard = []
for step in range(4):
    if dist.get_rank() == 1:
        hoard.append(torch.ones(1 << 31))  # <- hog
    loss = net(torch.randn(6, 3)).square().mean()
    sgd.zero_grad()
    loss.backward()
    sgd.step()
"""

# Leaves a process of its own behind on every rank and never finishes a step: only a kill of
# the whole tree ends it.
STUCK_WITH_CHILDREN = """\
import subprocess
import sys
import time

import torch.distributed as dist

dist.init_process_group("gloo")
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "{marker}"])
print("READY", dist.get_rank(), flush=True)
while True:
    time.sleep(0.05)
"""


def line_of(source: str, marker: str) -> int:
    return next(n for n, text in enumerate(source.splitlines(), 1) if f"# <- {marker}" in text)


def serious(report) -> list[str]:
    return [f.code for f in report.findings if f.severity in ("error", "warning")]


def finding(report, code: str):
    found = [f for f in report.findings if f.code == code]
    assert found, (code, [(f.code, f.message) for f in report.findings])
    return found[0]


def wait_until_gone(marker: str) -> list[int]:
    end = time.monotonic() + SETTLE_S
    while (found := leftovers(marker)) and time.monotonic() < end:
        time.sleep(0.05)
    return found


@pytest.fixture
def ranks(project: Path):
    """Run `source` as train.py in the project on two ranks, cold."""

    def run(source: str, **options: object):
        path = project / "train.py"
        path.write_text(source, encoding="utf-8")
        options.setdefault("python", sys.executable)
        options.setdefault("timeout_s", TIMEOUT_S)
        options.setdefault("device", "cpu")
        options.setdefault("nproc", 2)
        return run_repro(path, ReproOptions(**options)), path  # type: ignore[arg-type]

    return run


def test_a_clean_ddp_script_gives_no_warning_or_error(ranks):
    started = time.monotonic()
    report, _ = ranks(CLEAN_DDP)
    print(f"time to first report, 2 ranks, cold: {time.monotonic() - started:.2f} s")

    assert report.status == "ok", (report.data.get("exception"), report.data["distributed"])
    assert serious(report) == [], [(f.code, f.message) for f in report.findings]
    block = report.data["distributed"]
    assert block["nproc"] == 2 and block["world_size"] == 2
    assert block["backend"]["used"] == "gloo"
    assert [r["stopped_by"] for r in block["ranks"]] == ["steps", "steps"]
    assert all(r["report"] and not r["provisional"] for r in block["ranks"])
    assert layer(report, "ranks")["held"]
    # Each rank reads its own shard: the batch lines are marked as differing between ranks.
    assert any((line.get("ranks") or {}).get("differ") for line in report.lines)
    assert wait_until_gone("torchls_probe --request") == []


def test_a_barrier_only_rank_0_reaches_is_a_hang_with_both_stacks(ranks):
    report, path = ranks(BARRIER_ON_RANK_0, collective_timeout_s=3.0)

    assert report.status == "error"
    hang = finding(report, "TL908")
    assert hang.severity == "error"
    assert hang.line == line_of(BARRIER_ON_RANK_0, "barrier")
    assert "`dist.barrier()`" in hang.message
    assert "reached by rank 0 but not by rank 1" in hang.message
    assert "`if me == 0:`" in hang.message
    assert "rank 1 had finished its bounded run" in hang.message
    assert hang.related and hang.related[0].line == line_of(BARRIER_ON_RANK_0, "step")
    stacks = {s["rank"]: s for s in report.data["distributed"]["stacks"]}
    assert set(stacks) == {0, 1}
    assert stacks[0]["state"] == "waiting in barrier()"
    assert stacks[0]["frames"][0]["filename"] == str(path)
    assert any(f["function"] == "barrier" for f in stacks[0]["frames"])
    assert stacks[1]["state"] == "finished"
    # Within the bound: the collective timeout and a little more, far below the time limit.
    assert report.data["timing"]["server_wall_s"] < TIMEOUT_S / 2
    assert wait_until_gone("torchls_probe --request") == []


def test_an_unwrapped_model_seeded_per_rank_diverges(ranks):
    report, _ = ranks(SEEDED_PER_RANK.format(noqa=""))

    divergence = finding(report, "TL909")
    assert divergence.severity == "error"
    # At the cause: the per-rank seed made the replicas different before any step.
    assert divergence.line == line_of(SEEDED_PER_RANK, "seed")
    assert "Linear.weight differs between ranks 0 and 1" in divergence.message
    assert "before the first optimizer step" in divergence.message
    assert "largest difference" in divergence.message
    assert "DistributedDataParallel" in divergence.message
    assert "seeded differently" in divergence.message
    # The construction and the first use, as related information.
    built, used = divergence.related
    assert built.line == line_of(SEEDED_PER_RANK, "built") and "built here" in built.message
    assert used.line == line_of(SEEDED_PER_RANK, "call") and "first used here" in used.message


def test_hand_all_reduced_replicas_seeded_per_rank_point_at_the_seed(ranks):
    report, _ = ranks(HAND_ALL_REDUCE)

    divergence = finding(report, "TL909")
    assert divergence.line == line_of(HAND_ALL_REDUCE, "seed")
    assert "differs between ranks 0 and 1 already before the first optimizer step" in (
        divergence.message
    )
    assert "Sequential.0.weight" in divergence.message
    lines = [related.line for related in divergence.related]
    # The hand-written all-reduce (a collective on its tensors), the construction, the use.
    assert lines[-2:] == [line_of(HAND_ALL_REDUCE, "built"), line_of(HAND_ALL_REDUCE, "call")]


def test_noqa_on_the_line_says_a_model_per_rank_is_intended(ranks):
    report, _ = ranks(SEEDED_PER_RANK.format(noqa="  # noqa: TL909"))

    assert "TL909" not in codes(report)
    assert report.status == "ok"


def test_a_distributed_sampler_without_set_epoch_repeats_the_order(ranks):
    report, _ = ranks(NO_SET_EPOCH, steps=3)

    repeat = finding(report, "TL910")
    assert repeat.severity == "warning"
    assert repeat.line == line_of(NO_SET_EPOCH, "loop")
    assert "set_epoch" in repeat.message and "repeats the order" in repeat.message
    assert "TL909" not in codes(report)  # DDP keeps the replicas equal


def test_every_rank_reading_the_whole_dataset_and_saving_one_file(ranks):
    report, _ = ranks(WHOLE_DATASET_EVERYWHERE)

    overlap = finding(report, "TL910")
    # At the cause: the loader built without a DistributedSampler; the loop is related.
    assert overlap.line == line_of(WHOLE_DATASET_EVERYWHERE, "loader")
    assert "ranks 0 and 1 received the same samples" in overlap.message
    assert "DistributedSampler" in overlap.message
    assert overlap.related[0].line == line_of(WHOLE_DATASET_EVERYWHERE, "loop")
    same_file = finding(report, "TL803")
    assert same_file.line == line_of(WHOLE_DATASET_EVERYWHERE, "save")
    assert "every rank (0, 1) wrote last.pt" in same_file.message


def test_a_rank_that_raises_has_its_traceback_on_its_line_and_the_others_stop(ranks):
    report, _ = ranks(RAISES_ON_RANK_1)

    assert report.status == "error"
    error = finding(report, "TL905")
    assert error.line == line_of(RAISES_ON_RANK_1, "raise")
    assert error.message.startswith("rank 1: RuntimeError")
    assert codes(report).count("TL905") == 1  # rank 0 was stopped, not failed
    by_rank = {r["rank"]: r for r in report.data["distributed"]["ranks"]}
    assert by_rank[1]["stopped_by"] == "exception"
    assert by_rank[0]["stopped_by"] == "peer" and by_rank[0]["report"]
    assert report.data["exception"]["traceback"]
    assert wait_until_gone("torchls_probe --request") == []


def test_a_rank_killed_without_a_report_is_named(ranks):
    report, _ = ranks(KILLED_ON_RANK_1)

    assert report.status == "crashed"
    missing = [f for f in report.findings if f.message.startswith("rank 1 ended without a report")]
    assert missing and "SIGKILL" in missing[0].message, [f.message for f in report.findings]
    by_rank = {r["rank"]: r for r in report.data["distributed"]["ranks"]}
    assert by_rank[0]["report"] and not by_rank[1]["report"]
    assert wait_until_gone("torchls_probe --request") == []


def test_a_rank_stopped_by_the_memory_limit(ranks):
    report, _ = ranks(MEMORY_ON_RANK_1, memory_mb=3072)

    assert report.status == "memory"
    limit = finding(report, "TL906")
    assert limit.line == line_of(MEMORY_ON_RANK_1, "hog")
    assert limit.message.startswith("rank 1: stopped by the memory limit")
    assert layer(report, "memory")["held"]


def test_a_port_in_use_is_refused_before_any_rank_starts(ranks):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        started = time.monotonic()
        report, _ = ranks(
            CLEAN_DDP, rdzv_endpoint=f"127.0.0.1:{port}", network=True, sandbox="none"
        )

    assert time.monotonic() - started < 10
    assert report.status == "error" and report.data["stopped_by"] == "rendezvous"
    [refused] = report.findings
    assert refused.code == "TL905" and "already in use" in refused.message


def test_a_rendezvous_that_never_completes_stops_at_the_deadline(ranks):
    report, _ = ranks(CLEAN_DDP, nnodes="2", rdzv_endpoint="127.0.0.1:29511", timeout_s=6.0)

    assert report.status == "timeout" and report.data["stopped_by"] == "rendezvous"
    [limit] = report.findings
    assert limit.code == "TL906"
    assert "before any rank started" in limit.message and "--nnodes 2" in limit.message
    assert wait_until_gone("torch.distributed.run") == []


@pytest.mark.parametrize("sandbox", ["auto", "none"])
def test_cancel_and_timeout_kill_torchrun_every_rank_and_their_children(project, sandbox):
    if sandbox == "auto" and not bwrap_usable():
        pytest.skip("bubblewrap is not usable here")
    marker = f"torchls-ranks-{uuid.uuid4().hex}"
    path = project / "train.py"
    path.write_text(STUCK_WITH_CHILDREN.format(marker=marker), encoding="utf-8")
    options = ReproOptions(
        python=sys.executable, device="cpu", nproc=2, timeout_s=TIMEOUT_S, sandbox=sandbox
    )
    cancel = threading.Event()
    outcome: list[object] = []
    seen: list[str] = []

    def work() -> None:
        try:
            outcome.append(
                run_repro(
                    path, options, on_progress=lambda e: seen.append(e.message), cancel_event=cancel
                )
            )
        except ReproCancelled as error:
            outcome.append(error)

    thread = threading.Thread(target=work)
    thread.start()
    end = time.monotonic() + TIMEOUT_S
    while len(leftovers(marker)) < 2 and time.monotonic() < end:
        time.sleep(0.1)
    assert len(leftovers(marker)) == 2, seen  # one child per rank
    cancel.set()
    thread.join(SETTLE_S)
    assert not thread.is_alive()
    assert isinstance(outcome[0], ReproCancelled)
    assert wait_until_gone(marker) == []
    assert wait_until_gone(str(path.parent)) == []  # no rank, no torchrun

    # The same script stopped by the wall clock instead: a report, and nothing left either.
    report = run_repro(path, replace(options, timeout_s=8.0))
    assert report.status == "timeout"
    assert "TL906" in codes(report)
    assert wait_until_gone(marker) == []


def test_distributed_options_that_cannot_work_are_refused(project):
    path = project / "train.py"
    path.write_text(CLEAN_DDP, encoding="utf-8")
    for options, needle in (
        (ReproOptions(nproc=2, device="cuda:1"), "--device cuda"),
        (ReproOptions(nproc=0), "--nproc must be"),
        (ReproOptions(nnodes="2"), "go with --nproc"),
        (ReproOptions(nproc=2, rdzv_endpoint="10.1.2.3:29400"), "needs --network"),
    ):
        with pytest.raises(ReproUsageError, match=needle):
            run_repro(path, replace(options, python=sys.executable))


def test_an_interpreter_without_torch_is_a_setup_error_as_for_one_process(ranks, tmp_path):
    # Starts Python without its site-packages; laid out as an environment so that the sandbox
    # binds the installation behind it.
    env = tmp_path / "no-torch"
    python = env / "bin" / "python"
    python.parent.mkdir(parents=True)
    real = Path(sys.executable).resolve()
    python.write_text(f'#!/bin/sh\nexec {real} -S "$@"\n', encoding="utf-8")
    python.chmod(0o755)
    (env / "pyvenv.cfg").write_text(f"home = {real.parent}\n", encoding="utf-8")

    report, _ = ranks(CLEAN_DDP, python=str(python))

    assert report.setup_error is not None
    assert "torch cannot be imported" in report.setup_error and "--python" in report.setup_error
