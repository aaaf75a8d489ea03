"""Patterns from a second round of real public training scripts (issue #15, probe side).

Each case is a tiny script written for this file that does what one of those scripts did, and
checks that the bounded repro neither breaks it nor reports something false about it:

- evaluation under `@torch.inference_mode()` between training steps (a segmentation trainer
  validates that way every few steps): inference tensors keep no version counter, and asking
  for one raised inside the user's forward.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

INFERENCE_EVAL = """\
import torch
from torch import nn

net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.Adam(net.parameters(), lr=1e-3)


@torch.inference_mode()
def validate():
    scores = net(torch.randn(4, 6))
    ratio = torch.log(scores.abs() * 0)  # -inf on purpose, never trained on
    return scores.softmax(dim=1).max().item(), bool(torch.isinf(ratio).any())


for step in range(4):
    loss = nn.functional.cross_entropy(net(torch.randn(8, 6)), torch.randint(0, 2, (8,)))
    opt.zero_grad()
    loss.backward()
    opt.step()
    print("validated", step, validate())
"""


def test_evaluation_under_inference_mode_runs_to_the_bound(warm_repro) -> None:
    report, _ = warm_repro(INFERENCE_EVAL, steps=3)
    data = report.data
    assert data["status"] == "ok", (data["status"], data["exception"], data["notes"])
    assert data["stopped_by"] == "steps"
    output = data["output"]["head"] + data["output"]["tail"]
    assert "validated 0" in output and "validated 1" in output, output
    assert not any("probe error" in note for note in data["notes"]), data["notes"]
    # The values made under inference mode are still judged: the -inf is seen.
    lines = [f["line"] for f in data["findings"] if f["code"] == "TL901"]
    assert lines == [11], data["findings"]
