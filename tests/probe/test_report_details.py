"""Smaller repro report bugs of issue #15, each checked on a real run (CPU torch).

- The path from a non-finite value to the loss follows the branch that reaches the loss, not
  the first op that consumed the value (here an `exp` that turns -inf back into 0: a dead end).
- The text report's shapes table holds what the training step computed, not the model's
  construction, `.to(device)`, BatchNorm set-up or the `state_dict()` of a `torch.save` line.
"""

from __future__ import annotations

from tests.probe import cases

DEAD_BRANCH = """\
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
model = nn.Linear(4, 3)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(8, 4)
y = torch.randint(0, 3, (8,))
for _ in range(3):
    h = torch.log(torch.relu(x))  # <- born
    weight = (h * 2).exp()  # <- dead
    logits = model(h)  # <- carried
    loss = F.cross_entropy(logits, y)  # <- loss
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_the_path_to_the_loss_skips_a_branch_that_goes_nowhere(warm_repro) -> None:
    report, _ = warm_repro(DEAD_BRANCH)
    [first] = [f for f in report.findings if f.code == "TL901"]
    assert first.line == cases.marker_line(DEAD_BRANCH, "born")
    events = report.data["nonfinite"]["events"]
    path = [events[i]["line"] for i in report.data["nonfinite"]["chain"]]
    marks = [cases.marker_line(DEAD_BRANCH, name) for name in ("born", "carried", "loss")]
    assert path == marks
    assert cases.marker_line(DEAD_BRANCH, "dead") not in path
    related = [r.line for r in first.related]
    assert marks[1] in related and cases.marker_line(DEAD_BRANCH, "dead") not in related


SET_UP_AND_SAVED = """\
import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)  # <- conv
        self.norm = nn.BatchNorm2d(8)  # <- norm
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        x = F.relu(self.norm(self.conv(x)))  # <- forward
        return self.head(x.mean(dim=(2, 3)))


model = Net().to(torch.device("cpu"))  # <- to
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))
for step in range(3):
    loss = F.cross_entropy(model(x), y)  # <- loss
    opt.zero_grad()
    loss.backward()
    opt.step()
    torch.save(model.state_dict(), "last.pt")  # <- save
"""


def test_the_shapes_table_leaves_out_building_moving_and_saving_the_model(
    warm_repro, tmp_path
) -> None:
    from torchls.probe.text import render

    report, path = warm_repro(SET_UP_AND_SAVED)
    assert report.data["stopped_by"] == "steps"
    lines = {record["line"]: record for record in report.data["lines"]}
    for name in ("norm", "to", "save"):
        # Still in the JSON, marked: the hover on those lines keeps its answer.
        entries = lines[cases.marker_line(SET_UP_AND_SAVED, name)]["entries"]
        assert entries and all(entry["setup"] for entry in entries)
    computed = lines[cases.marker_line(SET_UP_AND_SAVED, "forward")]["entries"]
    assert {"torch.conv2d", "F.batch_norm", "F.relu"} <= {e["op"] for e in computed}
    assert not any(e["setup"] for e in computed)
    table = render(report, cwd=str(path.parent)).split("shapes:", 1)[1].split("\n\n", 1)[0]
    rows = [row.split()[0] for row in table.strip().splitlines()[1:]]
    shown = {int(row.rsplit(":", 1)[1]) for row in rows}
    for name in ("conv", "norm", "to", "save"):
        assert cases.marker_line(SET_UP_AND_SAVED, name) not in shown, name
    for name in ("forward", "loss"):
        assert cases.marker_line(SET_UP_AND_SAVED, name) in shown, name


def test_activation_figures_count_zeros_and_non_finite_values_exactly() -> None:
    """The per-module figures take two fused reductions on clean tensors and count one by one
    only when a value is not finite; both paths give the same kind of answer."""
    import math

    import torch
    from torchls_probe.hooks import Activations

    figures = Activations()
    clean = torch.tensor([[0.0, 2.0], [0.0, 6.0]])
    broken = torch.tensor([0.0, float("nan"), 3.0, float("inf"), 5.0, 0.0, 0.0, 1.0])
    figures.add("Net.a", "Linear", clean, 0)
    figures.add("Net.b", "ReLU", broken, 0)
    figures.add("Net.c", "ReLU", torch.zeros(5), 0)
    a, b, c = figures.items
    assert (a["zeros"], a["nonfinite"], a["mean"]) == (0.5, 0.0, 2.0)
    assert math.isclose(a["std"], float(clean.std()), rel_tol=1e-6)
    assert (b["zeros"], b["nonfinite"]) == (3 / 8, 2 / 8)
    assert math.isclose(b["mean"], 9.0 / 6)  # over the finite values only
    assert (c["zeros"], c["nonfinite"], c["std"]) == (1.0, 0.0, 0.0)
