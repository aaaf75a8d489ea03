"""TL910 at its cause (issue #31): ranks that read the same samples are told where to fix it.

Real torch on the CPU, two ranks under torchrun with gloo, run cold through `run_repro` (what
`torchls repro --nproc 2` and the editor call). A DataLoader without a DistributedSampler is
reported on the line that built it (where `sampler=DistributedSampler(...)` goes), with the
loop that read the shared samples as related information, and `# noqa: TL910` on that loop
still silences it. A loader that has a DistributedSampler and still overlaps (one told it is
the only replica) is reported at the loop: the construction is not the cause then. The
placement rule for records without a known construction line is checked on `_overlap` itself,
over hand-written rank records.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.probe.support import codes
from torchls.probe import ReproOptions, run_repro

if not sys.platform.startswith("linux"):
    pytest.skip("the distributed repro is tested on Linux", allow_module_level=True)

TIMEOUT_S = 40.0

# Every rank shuffles the whole dataset: the loader line is the one to change.
UNSHARDED = """\
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

dist.init_process_group("gloo")
torch.manual_seed(0)
points = TensorDataset(torch.randn(16, 2), torch.randn(16, 1))
batches = DataLoader(points, batch_size=4, shuffle=True)  # <- built
model = DDP(nn.Linear(2, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for features, target in batches:{noqa}  # <- read
    loss = nn.functional.mse_loss(model(features), target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""

# A DistributedSampler that is told there is one replica: each rank gets every sample. The
# loader is built right; the sampler's arguments are the mistake, so the loop keeps it.
SAMPLER_FOR_ONE = """\
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

dist.init_process_group("gloo")
torch.manual_seed(0)
points = TensorDataset(torch.randn(16, 2), torch.randn(16, 1))
sampler = DistributedSampler(points, num_replicas=1, rank=0, shuffle=False)
batches = DataLoader(points, batch_size=4, sampler=sampler)  # <- built
model = DDP(nn.Linear(2, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for features, target in batches:  # <- read
    loss = nn.functional.mse_loss(model(features), target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def line_of(source: str, marker: str) -> int:
    return next(n for n, text in enumerate(source.splitlines(), 1) if f"# <- {marker}" in text)


def overlap_of(report: Any) -> Any:
    found = [f for f in report.findings if f.code == "TL910"]
    assert len(found) == 1, [(f.code, f.line, f.message) for f in report.findings]
    return found[0]


@pytest.fixture
def ranks(project: Path):
    """Run `source` as train.py in the project on two ranks, cold, on the CPU."""

    def run(source: str) -> tuple[Any, Path]:
        path = project / "train.py"
        path.write_text(source, encoding="utf-8")
        options = ReproOptions(python=sys.executable, timeout_s=TIMEOUT_S, device="cpu", nproc=2)
        return run_repro(path, options), path

    return run


def test_a_loader_without_a_distributed_sampler_is_reported_where_it_is_built(ranks):
    source = UNSHARDED.format(noqa="")
    report, path = ranks(source)

    overlap = overlap_of(report)
    assert overlap.severity == "warning"
    assert overlap.filename == str(path)
    assert overlap.line == line_of(source, "built")
    assert "ranks 0 and 1 received the same samples" in overlap.message
    assert "sampler=DistributedSampler(dataset)" in overlap.message
    # The loop that showed it, as the one related location.
    assert [(r.filename, r.line) for r in overlap.related] == [(str(path), line_of(source, "read"))]
    assert overlap.related[0].message == "the ranks read the same samples here"


def test_noqa_on_the_loop_still_silences_the_finding_now_on_the_loader(ranks):
    report, _ = ranks(UNSHARDED.format(noqa="  # noqa: TL910"))

    assert report.status == "ok", report.data.get("exception")
    assert "TL910" not in codes(report)


def test_a_loader_with_a_distributed_sampler_keeps_the_finding_on_the_loop(ranks):
    report, path = ranks(SAMPLER_FOR_ONE)

    overlap = overlap_of(report)
    assert overlap.line == line_of(SAMPLER_FOR_ONE, "read")
    assert overlap.filename == str(path)
    assert "although the loader uses a DistributedSampler" in overlap.message
    # The construction is not blamed: nothing points at it.
    assert line_of(SAMPLER_FOR_ONE, "built") not in [r.line for r in overlap.related]


def _records(built: dict[str, Any] | None, loop: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Two ranks' records (the shape distributed.py writes) whose one loader gave both ranks
    the same four samples in one pass."""

    def record(rank: int) -> dict[str, Any]:
        passes = [{"where": loop, "batches": [[11, 12], [13, 14]], "distributed_sampler": False}]
        return {
            "rank": rank,
            "initialized": True,
            "models": [{"index": 0, "kind": "ddp"}],
            "loaders": [{"index": 0, "built": built, "passes": passes}],
        }

    return [record(0), record(1)]


def test_without_a_known_construction_the_finding_stays_on_the_loop():
    from torchls_probe.crossrank import _overlap

    loop = {"filename": "/p/train.py", "line": 12}
    (item,) = _overlap(_records(None, loop))
    assert (item["filename"], item["line"]) == ("/p/train.py", 12)
    assert item["related"] == []


def test_a_loader_built_on_the_loop_line_is_not_related_to_itself():
    from torchls_probe.crossrank import _overlap

    line = {"filename": "/p/train.py", "line": 9}
    (item,) = _overlap(_records(line, dict(line)))
    assert (item["filename"], item["line"]) == ("/p/train.py", 9)
    assert item["related"] == []
