"""The repro on loops as real scripts write them (issue #15, probe side), with real torch on CPU.

A hand-written update with no optimizer (`p.data.add_(-lr * p.grad)`, as in pytorch/examples'
regression) is bounded at `backward()`; which parameters got gradients is judged right after a
complete backward, not where the run stopped (just after a `zero_grad`). Infinities written as
masks (`masked_fill(mask, -inf)` before a softmax, a causal `triu` of `-inf`) are not TL901; a
NaN made from a row masked everywhere is. A learning-rate typo is a TL907 warning within the
default two steps, at the optimizer's line. Warnings Python hides by default stay hidden, and
information alone leaves the CLI's exit status at 0.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from torchls.lsp import repro_messages
from torchls.probe.text import render

pytest.importorskip("torch")

HAND_WRITTEN = """\
import torch
import torch.nn as nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 8)
        self.head = nn.Linear(8, 1)
        self.unused = nn.Linear(8, 1)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))

model = Net()
x, y = torch.randn(16, 4), torch.randn(16, 1)
for batch in range(500):
    model.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    for p in model.parameters():
        if p.grad is not None:
            p.data.add_(-0.01 * p.grad)
print("FINISHED ALL BATCHES")
"""


def test_a_hand_written_update_stops_at_the_step_bound(repro) -> None:
    report, path = repro(HAND_WRITTEN)
    data = report.data
    assert data["stopped_by"] == "backwards", data["stopped_by"]
    assert data["progress"]["backward_calls"] == 2
    assert "FINISHED" not in (data["output"]["head"] + data["output"]["tail"])
    no_grad = data["parameters"]["without_grad"]
    assert sorted(no_grad) == ["Net.unused.bias", "Net.unused.weight"], no_grad
    tl902 = [f for f in data["findings"] if f["code"] == "TL902"]
    assert len(tl902) == 1 and "unused" in tl902[0]["message"]
    line = path.read_text().splitlines()[tl902[0]["line"] - 1]
    assert "self.unused" in line
    assert not [f for f in data["findings"] if f["severity"] == "error"], data["findings"]


CAUSAL = """\
import torch
import torch.nn as nn
import torch.nn.functional as F

class Attention(nn.Module):
    def __init__(self, dim, length):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.register_buffer("causal", torch.tril(torch.ones(length, length)).bool())

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        att = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        att = att.masked_fill(~self.causal, float("-inf"))
        return F.softmax(att, dim=-1) @ v

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attention(8, 6)
        self.out = nn.Linear(8, 5)

    def forward(self, x):
        return self.out(self.attn(x)).mean(dim=1)

model = Model()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
additive = torch.full((6, 6), float("-inf")).triu(1)
for step in range(10):
    x = torch.randn(4, 6, 8) + additive.sum(dim=0, keepdim=True).clamp(min=0)[..., :1]
    loss = F.cross_entropy(model(x), torch.randint(0, 5, (4,)))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_infinities_written_as_masks_are_not_findings(repro) -> None:
    report, _ = repro(CAUSAL)
    data = report.data
    assert data["stopped_by"] == "steps"
    assert not [f for f in data["findings"] if f["code"] == "TL901"], data["findings"]
    origins = {e["origin"] for e in data["nonfinite"]["events"]}
    assert origins <= {"mask"}, data["nonfinite"]["events"]


FULLY_MASKED = CAUSAL.replace(
    'att = att.masked_fill(~self.causal, float("-inf"))',
    'att = att.masked_fill(torch.ones_like(self.causal), float("-inf"))  # every position',
)


def test_a_nan_made_from_a_mask_is_reported_where_it_is_made(repro) -> None:
    report, path = repro(FULLY_MASKED)
    first = [f for f in report.data["findings"] if f["code"] == "TL901"]
    assert first, report.data["findings"]
    line = path.read_text().splitlines()[first[0]["line"] - 1]
    assert "softmax" in line, (line, first[0]["message"])
    assert "masked with an infinity" in first[0]["message"]


TYPO = """\
import torch
import torch.nn as nn

model = nn.Sequential(nn.Linear(13, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr={lr})
x, y = torch.randn(64, 13) * 3, torch.randn(64, 1) * 20
for epoch in range(100):
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
"""


def test_a_learning_rate_typo_is_diverging_within_two_steps(repro) -> None:
    report, path = repro(TYPO.format(lr="1e3"))
    found = [f for f in report.data["findings"] if f["code"] == "TL907"]
    assert len(found) == 1, report.data["findings"]
    assert found[0]["severity"] == "warning"
    assert "optim.SGD" in path.read_text().splitlines()[found[0]["line"] - 1]
    assert "lr=1000" in found[0]["message"] and "step 1" in found[0]["message"]


def test_a_sound_learning_rate_is_not_diverging(repro) -> None:
    report, _ = repro(TYPO.format(lr="1e-2"))
    assert not [f for f in report.data["findings"] if f["code"] == "TL907"]
    assert report.data["stopped_by"] == "steps"


HIDDEN_WARNINGS = """\
import warnings

import torch

import legacy

handle = open(__file__)  # never closed: a ResourceWarning, hidden by default
del handle
legacy.old_api()  # a deprecation raised inside another module: hidden by default
warnings.warn("shown by Python too")
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(5):
    optimizer.zero_grad()
    model(torch.ones(3, 2)).sum().backward()
    optimizer.step()
"""


def test_warnings_python_hides_stay_hidden_and_information_keeps_exit_zero(
    repro, project: Path
) -> None:
    (project / "legacy.py").write_text(
        "import warnings\n\n\ndef old_api():\n"
        "    warnings.warn('old api', DeprecationWarning, stacklevel=1)\n"
    )
    report, path = repro(HIDDEN_WARNINGS)
    warnings_found = [f for f in report.data["findings"] if f["code"] == "TL904"]
    messages = [f["message"] for f in warnings_found]
    assert any("shown by Python too" in m for m in messages), messages
    assert not any("ResourceWarning" in m or "old api" in m for m in messages), messages
    assert all(f["severity"] == "information" for f in report.data["findings"])
    done = subprocess.run(
        [sys.executable, "-m", "torchls", "repro", str(path), "--python", sys.executable],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "TL904" in done.stdout


SLOW_BETWEEN_STEPS = """\
import time

import torch

model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(3):
    optimizer.zero_grad()
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    with torch.no_grad():  # an evaluation that never ends
        while True:
            model(torch.ones(2, 4))
            time.sleep(0.001)
"""


def test_a_timeout_between_steps_names_that_phase(repro) -> None:
    report, _ = repro(SLOW_BETWEEN_STEPS, timeout_s=6.0)
    limit = [f for f in report.data["findings"] if f["code"] == "TL906"]
    assert limit, report.data["findings"]
    assert "after optimizer step 1" in limit[0]["message"]
    assert "ran no backward" in limit[0]["message"]


DATA_PASS_FIRST = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

loader = DataLoader(TensorDataset(torch.randn(40, 3)), batch_size=4)
mean = torch.cat([batch for (batch,) in loader]).mean(0)  # <- data pass
model = torch.nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    for (batch,) in loader:
        loss = model(batch - mean).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""

EVAL_ONLY = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

loader = DataLoader(TensorDataset(torch.randn(40, 3)), batch_size=4)
model = torch.nn.Linear(3, 1).eval()
with torch.no_grad():
    for (batch,) in loader:
        model(batch)
"""


def _bound_note(data: dict) -> list[str]:
    return [n for n in data["notes"] if n.startswith("the batch bound")]


def test_a_batch_bound_reached_in_a_data_pass_says_the_training_never_started(
    repro, project: Path
) -> None:
    """Statistics over the loader before the model exists meet the batch bound first: the run
    is complete as asked, but the report says that it cut a data pass, where, and how to let
    the pass finish; with a larger batch bound the training steps are reached."""
    report, path = repro(DATA_PASS_FIRST, steps=2)
    data = report.data
    assert data["stopped_by"] == "batches" and data["progress"]["optimizer_steps"] == 0
    [note] = _bound_note(data)
    lines = path.read_text().splitlines()
    line = next(number for number, text in enumerate(lines, 1) if "<- data pass" in text)
    assert f"train.py:{line} " in note and "--batches" in note, note
    text = render(report, cwd=str(project))
    assert "notes:" in text and "a pass over the data was cut short" in text
    message = repro_messages.limit_problem(data, str(path))
    assert message is not None and "torchls.probe.steps" in message

    longer, _ = repro(DATA_PASS_FIRST, steps=2, batches=30)
    assert longer.data["stopped_by"] == "steps", longer.data["stopped_by"]
    assert longer.data["progress"]["optimizer_steps"] == 2
    assert not _bound_note(longer.data)
    assert repro_messages.limit_problem(longer.data, str(path)) is None


def test_a_batch_bound_in_an_evaluation_loop_is_no_cut_data_pass(repro) -> None:
    report, path = repro(EVAL_ONLY, steps=2)
    assert report.data["stopped_by"] == "batches"
    assert not _bound_note(report.data)
    assert repro_messages.limit_problem(report.data, str(path)) is None
