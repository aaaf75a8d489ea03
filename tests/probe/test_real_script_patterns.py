"""Patterns from a second round of real public training scripts (issue #15, probe side).

Each case is a tiny script written for this file that does what one of those scripts did, and
checks that the bounded repro neither breaks it nor reports something false about it:

- evaluation under `@torch.inference_mode()` between training steps (a segmentation trainer
  validates that way every few steps): inference tensors keep no version counter, and asking
  for one raised inside the user's forward;
- a target network (a DQN's, filled with `target.load_state_dict(online.state_dict())`, or
  deep-copied and run under `no_grad` as TD3 does) and a frozen teacher are outside every
  optimizer on purpose: TL902 "in no optimizer, so it is never updated" is false for them. A
  model left out of the optimizer by mistake (it still gets gradients) is still reported, and a
  generator whose optimizer has not stepped yet when the critic's steps reach the bound is not;
- a graph network's degree normalisation (`inv = 1 / degree`, then `inv[inv == inf] = 0` for
  isolated nodes, also through a `sqrt` or with `torch.where`/`nan_to_num`) makes an infinity
  the code replaces at once: that is not TL901. An infinity used before the clean-up, or a raw
  value used beside its cleaned copy, still is;
- orthogonal initialisation (`nn.init.orthogonal_`, as normalizing-flow and RL scripts do it)
  writes through a view made under `no_grad`, and asking that view for its autograd node
  raises: the report must not carry a "probe error" note for it;
- the batch bound (the step count unless `--batches` is given) can stop a run before its
  optimizer took the steps asked for: batches accumulated into one step, or a validation pass
  between steps. The run stays `ok` (a bound held), but a note says how many steps ran, why,
  and how to reach the step bound.
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


TARGET_NETWORKS = """\
import copy
import torch
from torch import nn


class Critic(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(3, 16)
        self.out = nn.Linear(16, 1)

    def forward(self, x):
        return self.out(torch.tanh(self.body(x)))


online = Critic()
copied = Critic()
copied.load_state_dict(online.state_dict())  # hard copy, refreshed every few episodes
frozen = copy.deepcopy(online)  # soft-updated later, only ever run without gradients
teacher = nn.Linear(3, 1)
opt = torch.optim.Adam(online.parameters(), lr=1e-3)
for step in range(5):
    state = torch.randn(8, 3)
    with torch.no_grad():
        hint = frozen(state) + teacher(state)
    target = 0.9 * copied(state) + hint  # not detached: gradients reach `copied`, unused
    loss = nn.functional.mse_loss(online(state), target)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""

FORGOTTEN = """\
import torch
from torch import nn

encoder = nn.Linear(3, 8)
head = nn.Linear(8, 1)
opt = torch.optim.SGD(encoder.parameters(), lr=0.01)  # the head was forgotten
for step in range(5):
    loss = head(torch.relu(encoder(torch.randn(4, 3)))).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_target_networks_and_a_frozen_teacher_are_not_tl902(warm_repro) -> None:
    report, _ = warm_repro(TARGET_NETWORKS)
    data = report.data
    assert data["stopped_by"] == "steps", data["stopped_by"]
    assert data["parameters"]["not_in_optimizer"] == [], data["parameters"]
    assert [f for f in data["findings"] if f["code"] == "TL902"] == []


def test_a_model_left_out_of_the_optimizer_is_still_tl902(warm_repro) -> None:
    report, _ = warm_repro(FORGOTTEN)
    data = report.data
    assert data["parameters"]["not_in_optimizer"] == ["Linear.weight", "Linear.bias"]
    found = [f for f in data["findings"] if f["code"] == "TL902"]
    assert len(found) == 1, found
    assert found[0]["message"].endswith("are in no optimizer, so they are never updated")


CLEANED_TEMPLATE = """\
import torch
from torch import nn

degree = torch.tensor([2.0, 0.0, 3.0, 1.0, 0.0, 4.0])
{cleanup}
features = torch.randn(6, 5) * scale.unsqueeze(1)
layer = nn.Linear(5, 2)
opt = torch.optim.SGD(layer.parameters(), lr=0.1)
for step in range(4):
    loss = layer(features).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""

CLEANUPS = {
    "masked_assignment": "scale = 1 / degree\nscale[scale == float('inf')] = 0",
    "through_sqrt": "scale = torch.sqrt(1 / degree)\nscale[torch.isinf(scale)] = 0.0",
    "where": "raw = degree.pow(-0.5)\nscale = torch.where(torch.isinf(raw), 0.0, raw)",
    "nan_to_num": "scale = torch.nan_to_num(1.0 / degree, posinf=0.0)",
    "masked_fill_": "scale = degree.reciprocal()\nscale.masked_fill_(scale.isinf(), 0.0)",
}


@pytest.mark.parametrize("cleanup", sorted(CLEANUPS))
def test_an_infinity_the_code_replaces_at_once_is_not_tl901(warm_repro, cleanup) -> None:
    report, _ = warm_repro(CLEANED_TEMPLATE.format(cleanup=CLEANUPS[cleanup]))
    data = report.data
    assert data["stopped_by"] == "steps", data["stopped_by"]
    assert [f for f in data["findings"] if f["code"] == "TL901"] == [], data["findings"]
    origins = {e["origin"] for e in data["nonfinite"]["events"]}
    assert origins == {"cleaned"}, data["nonfinite"]["events"]


USED_BEFORE = {
    # the infinity reaches the features before the clean-up
    "used_first": "scale = 1 / degree\nfeatures0 = scale.sum()\nscale[scale == float('inf')] = 0",
    # the raw value is used beside its cleaned copy
    "raw_kept": "raw = 1 / degree\nscale = torch.nan_to_num(raw, posinf=0.0) + raw",
}


@pytest.mark.parametrize("case", sorted(USED_BEFORE))
def test_an_infinity_used_before_or_beside_its_clean_up_is_still_tl901(warm_repro, case) -> None:
    report, _ = warm_repro(CLEANED_TEMPLATE.format(cleanup=USED_BEFORE[case]))
    found = [f for f in report.data["findings"] if f["code"] == "TL901"]
    assert [f["line"] for f in found][:1] == [5], report.data["findings"]


ORTHOGONAL_INIT = """\
import torch
from torch import nn

body = nn.Sequential(nn.Linear(5, 5), nn.Tanh(), nn.Linear(5, 1))
for layer in body.modules():
    if isinstance(layer, nn.Linear):
        nn.init.orthogonal_(layer.weight)
opt = torch.optim.Adam(body.parameters(), lr=1e-3)
for step in range(4):
    loss = body(torch.randn(3, 5)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_orthogonal_initialisation_leaves_no_probe_error(warm_repro) -> None:
    report, _ = warm_repro(ORTHOGONAL_INIT)
    data = report.data
    assert data["stopped_by"] == "steps"
    assert not any("probe error" in note for note in data["notes"]), data["notes"]
    assert [f for f in data["findings"] if f["severity"] != "information"] == []


SHORT_OF_STEPS = """\
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

train = DataLoader(TensorDataset(torch.randn(48, 3), torch.randn(48, 1)), batch_size=4)
val = DataLoader(TensorDataset(torch.randn(16, 3), torch.randn(16, 1)), batch_size=4)
model = nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
ACCUMULATE = {accumulate}
for i, (x, y) in enumerate(train):
    (nn.functional.mse_loss(model(x), y) / ACCUMULATE).backward()
    if (i + 1) % ACCUMULATE == 0:
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            score = sum(nn.functional.mse_loss(model(a), b).item() for a, b in val)
"""


def _short_note(data: dict) -> list[str]:
    return [n for n in data["notes"] if n.startswith("the batch bound") and "stopped" in n]


def test_accumulated_batches_that_reach_the_batch_bound_first_are_noted(warm_repro) -> None:
    report, _ = warm_repro(SHORT_OF_STEPS.format(accumulate=4), name="accumulate.py", steps=2)
    data = report.data
    assert (data["status"], data["stopped_by"]) == ("ok", "batches")
    assert data["progress"]["optimizer_steps"] == 0
    [note] = _short_note(data)
    assert "after 0 of 2 optimizer steps" in note and "gradient accumulation" in note, note
    assert "were not checked" in note and "--batches N" in note, note


def test_a_validation_pass_that_reaches_the_batch_bound_is_noted(warm_repro) -> None:
    report, _ = warm_repro(SHORT_OF_STEPS.format(accumulate=1), name="validate.py", steps=6)
    data = report.data
    assert (data["status"], data["stopped_by"]) == ("ok", "batches")
    assert data["progress"]["optimizer_steps"] == 2, data["progress"]
    [note] = _short_note(data)
    assert "after 2 of 6 optimizer steps" in note and "4 of them taken without gradients" in note


def test_no_note_when_the_batch_bound_was_asked_for(warm_repro) -> None:
    report, _ = warm_repro(SHORT_OF_STEPS.format(accumulate=4), name="asked.py", steps=2, batches=3)
    assert report.data["stopped_by"] == "batches"
    assert _short_note(report.data) == []


CRITIC_FIRST = """\
import torch
from torch import nn

gen = nn.Linear(2, 3)
critic = nn.Linear(3, 1)
opt_c = torch.optim.Adam(critic.parameters(), lr=1e-4)
opt_g = torch.optim.Adam(gen.parameters(), lr=1e-4)
for i in range(12):
    z = torch.randn(8, 2)
    loss_c = critic(gen(z)).mean() + critic(torch.randn(8, 3)).pow(2).mean()
    opt_c.zero_grad()
    loss_c.backward()  # reaches the generator too: it is not detached
    opt_c.step()
    if i % 5 == 4:
        loss_g = -critic(gen(z)).mean()
        opt_g.zero_grad()
        loss_g.backward()
        opt_g.step()
"""


def test_a_model_whose_optimizer_has_not_stepped_yet_is_not_tl902(warm_repro) -> None:
    report, _ = warm_repro(CRITIC_FIRST, steps=2)
    data = report.data
    assert data["progress"]["optimizer_steps"] == 2
    assert data["parameters"]["not_in_optimizer"] == [], data["parameters"]
    assert [f for f in data["findings"] if f["code"] == "TL902"] == [], data["findings"]
