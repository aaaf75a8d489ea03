"""Finiteness judged in batches (issue #15's overhead): still the first op, line and origin.

The tracer queues a repeated op's outputs and a backward node's gradients and judges them at
once before anything that could change them or needs the verdict (an in-place write, a
backward, an optimizer step, another event, the mode's exit). These tests run a small training
step in this process under the real tracer and hooks, with the step's file as the user's code,
and check what an op-by-op check would have said: a NaN born in a later step (so its line's
entry already exists and its check is deferred) on its own line with origin "op", a value
overwritten in place just after its op still judged as the op made it, an input repaired in
place after use still making its consumer "propagated", a gradient born non-finite in a later
backward, a -inf mask written on every step still no finding, outputs skipped after a finite
input judged again once it is not, and a NumPy write judged. `all_finite` answers as
`is_finite` does, tensor by tensor.
"""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path
from typing import Any

import pytest

from tests.probe import cases

torch = pytest.importorskip("torch")

from torchls_probe import findings  # noqa: E402
from torchls_probe.attribution import UserCode  # noqa: E402
from torchls_probe.hooks import Hooks  # noqa: E402
from torchls_probe.params import Roots  # noqa: E402
from torchls_probe.progress import Progress  # noqa: E402
from torchls_probe.stats import all_finite, is_finite  # noqa: E402
from torchls_probe.tracer import Trace, Tracer  # noqa: E402


def traced(tmp_path: Path, source: str, steps: int = 3) -> tuple[Any, Path]:
    """Run `main(steps)` of `source` under the tracer and hooks, as a repro installs them."""
    path = tmp_path / "user_step.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("user_step", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    user = UserCode([str(tmp_path)], [str(path)], [torch_dir])
    trace = Trace(user, max_lines=400, max_entries=8, max_events=50)
    hooks = Hooks(trace, Roots(user), steps=10**9, batches=10**9, progress=Progress(None))
    undo = hooks.install()
    try:
        with Tracer(trace, max_outputs=4):
            module.main(steps)
    finally:
        undo()
    return trace, path


def first_event(trace: Any) -> Any:
    assert trace.events.items, "no non-finite value was seen"
    return trace.events.items[0]


BORN_IN_STEP_TWO = """\
import torch
import torch.nn as nn

def main(steps):
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        x = torch.rand(8, 4) + 0.5
        scale = torch.full((8, 1), 1.0 - step)
        h = model(x)
        g = torch.log(scale)  # <- log
        loss = (h * g).mean()  # <- loss
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_a_nan_born_in_a_later_step_is_attributed_to_its_line(tmp_path: Path) -> None:
    """Step 1 is clean (the log line's entry is made then); step 2's log(0) is deferred."""
    trace, path = traced(tmp_path, BORN_IN_STEP_TWO)
    first = first_event(trace)
    assert (first.location.filename, first.location.line) == (
        os.path.realpath(path),
        cases.marker_line(BORN_IN_STEP_TWO, "log"),
    )
    assert (first.op, first.phase, first.origin, first.step) == ("torch.log", "forward", "op", 1)
    assert first.summary["nonfinite"]["neginf"] == 8
    later = trace.events.items[1:]
    loss_line = cases.marker_line(BORN_IN_STEP_TWO, "loss")
    assert any(e.location.line == loss_line and e.origin == "propagated" for e in later)
    assert all(e.origin != "op" for e in later if e.phase in ("forward", "loss"))
    [finding, *_] = findings._nonfinite(trace)
    assert finding["line"] == cases.marker_line(BORN_IN_STEP_TWO, "log")
    [entry] = trace.lines.lines[first.location.key()].entries.values()
    assert entry.count == 3 and entry.nonfinite_count == 2


OVERWRITTEN = """\
import torch

def main(steps):
    w = torch.ones(6, requires_grad=True)
    for step in range(steps):
        x = torch.linspace(0.0, 1.0, 6) + (step == 0)
        y = torch.log(x)  # <- log
        y[torch.isinf(y)] = 0.0  # <- repair
        (w * y).sum().backward()
"""


def test_a_value_repaired_in_place_after_its_op_is_judged_as_the_op_made_it(
    tmp_path: Path,
) -> None:
    """Step 1 is clean; in step 2 `y[...] = 0` writes into the queued output of `log`, so
    the queue is judged before the write."""
    trace, _ = traced(tmp_path, OVERWRITTEN)
    first = first_event(trace)
    assert first.location.line == cases.marker_line(OVERWRITTEN, "log")
    # Made from finite inputs ("op"); the repair before any use then makes it "cleaned".
    assert (first.op, first.phase, first.uncleaned) == ("torch.log", "forward", "op")
    assert first.origin == "cleaned"
    assert first.summary["nonfinite"]["neginf"] >= 1
    repaired = cases.marker_line(OVERWRITTEN, "repair")
    assert not [e for e in trace.events.items if e.location.line == repaired]


REPAIRED_INPUT = """\
import torch

def main(steps):
    torch.manual_seed(0)
    w = torch.randn(5, requires_grad=True)
    for step in range(steps):
        raw = torch.randn(5)
        if step == 1:
            raw.data[2] = float("nan")
        y = w + raw  # <- use
        raw.nan_to_num_(0.0)  # <- repair
        y.sum().backward()
"""


def test_an_input_repaired_in_place_after_use_leaves_its_consumer_propagated(
    tmp_path: Path,
) -> None:
    """`w + raw` is queued with `raw` (NaN) as an input; `raw` is then repaired in place.
    Judging `w + raw` later against the repaired `raw` would make it an origin; the write is
    seen to touch an input of a queued op, so the queue is judged first."""
    trace, _ = traced(tmp_path, REPAIRED_INPUT)
    use = cases.marker_line(REPAIRED_INPUT, "use")
    at_use = [e for e in trace.events.items if e.location.line == use and e.phase == "forward"]
    assert at_use, trace.events.items
    assert at_use[0].origin == "propagated"
    assert not [e for e in trace.events.items if e.origin == "op"], trace.events.items


GRADIENT_IN_STEP_TWO = """\
import torch

def main(steps):
    w = torch.ones(4, requires_grad=True)
    for step in range(steps):
        base = torch.tensor([1.0, 2.0, 3.0, 4.0]) * (step != 1)
        root = torch.sqrt(base * w)  # <- sqrt
        root.sum().backward()
        w.grad = None
"""


def test_a_gradient_born_non_finite_in_a_later_backward_is_attributed(tmp_path: Path) -> None:
    """sqrt(0) is finite, its gradient is not: a backward origin at the sqrt line, step 2."""
    trace, _ = traced(tmp_path, GRADIENT_IN_STEP_TWO)
    first = first_event(trace)
    assert (first.phase, first.origin) == ("backward", "op")
    assert first.location.line == cases.marker_line(GRADIENT_IN_STEP_TWO, "sqrt")
    assert first.op.startswith("SqrtBackward")
    assert first.summary["nonfinite"]["posinf"] == 4


MASKED_EVERY_STEP = """\
import torch
import torch.nn.functional as F

def main(steps):
    torch.manual_seed(0)
    proj = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(proj.parameters(), lr=0.01)
    causal = torch.tril(torch.ones(6, 6)).bool()
    for step in range(steps):
        q = proj(torch.randn(2, 6, 8))
        att = q @ q.transpose(-2, -1)
        att = att.masked_fill(~causal, float("-inf"))  # <- mask
        out = F.softmax(att, dim=-1) @ q
        loss = out.pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_a_mask_infinity_written_on_every_step_is_still_no_finding(tmp_path: Path) -> None:
    trace, _ = traced(tmp_path, MASKED_EVERY_STEP, steps=4)
    assert trace.events.items, "the mask itself is an event"
    assert {e.origin for e in trace.events.items} == {"mask"}
    assert trace.events.items[0].location.line == cases.marker_line(MASKED_EVERY_STEP, "mask")
    assert findings._nonfinite(trace) == []


SAFE_CHAIN = """\
import torch
import torch.nn.functional as F

def main(steps):
    torch.manual_seed(0)
    w = torch.randn(512, 512, requires_grad=True)
    for step in range(steps):
        x = torch.randn(1024, 512)
        if step == 2:
            x[3, 3] = float("nan")
        h = x @ w  # <- matmul
        r = F.relu(h)  # <- relu
        m = F.max_pool1d(r.unsqueeze(0), 2)  # <- pool
        m.view(-1).sum().backward()
        w.grad = None
"""


def test_outputs_skipped_after_a_finite_input_are_judged_once_it_is_not(tmp_path: Path) -> None:
    """Large outputs of ReLU, max-pool and views need no judging of their own while their
    input was judged finite; when the input is not (step 3), each of them is judged again
    and the chain from the matmul to the loss is whole."""
    trace, _ = traced(tmp_path, SAFE_CHAIN, steps=4)
    lines = [(e.location.line, e.op) for e in trace.events.items if e.phase == "forward"]
    matmul, relu, pool = (cases.marker_line(SAFE_CHAIN, n) for n in ("matmul", "relu", "pool"))
    assert lines[:4] == [
        (matmul, "Tensor.matmul"),
        (relu, "F.relu"),
        (pool, "Tensor.unsqueeze"),
        (pool, "F.max_pool1d"),
    ], lines
    assert [e.sources for e in trace.events.items[1:4]] == [[0], [1], [2]]


WRITTEN_THROUGH_NUMPY = """\
import torch
import torch.nn.functional as F

def main(steps):
    torch.manual_seed(0)
    w = torch.randn(512, 512)
    for step in range(steps):
        h = torch.randn(1024, 512) @ w
        h2 = h * 1.0
        if step == 2:
            h2.numpy()[0, 0] = float("nan")
        r = F.relu(h2)  # <- relu
        s = torch.sigmoid(r)
"""


def test_a_value_written_through_numpy_is_judged_again(tmp_path: Path) -> None:
    """`h2` was judged finite; a NumPy write moves no version counter, so handing out the
    array forgets that verdict and the ReLU of the NaN is judged (and found) after all."""
    trace, _ = traced(tmp_path, WRITTEN_THROUGH_NUMPY, steps=4)
    first = first_event(trace)
    assert (first.location.line, first.op) == (
        cases.marker_line(WRITTEN_THROUGH_NUMPY, "relu"),
        "F.relu",
    )
    assert first.summary["nonfinite"]["nan"] == 1


def test_all_finite_answers_as_is_finite_does_tensor_by_tensor() -> None:
    torch.manual_seed(0)
    nan, inf = float("nan"), float("inf")
    pool = [
        torch.randn(3),
        torch.randn(5000),  # large enough to be summed on its own
        torch.randn(2, 3, dtype=torch.float64),
        torch.arange(4),
        torch.tensor([True, False]),
        torch.empty(0),
        torch.randn(3, dtype=torch.float16),
        torch.randn(3, dtype=torch.bfloat16),
        torch.randn(4, 4).t(),  # not contiguous
        torch.full((8,), 3e38),  # finite, but its sum overflows
        torch.randn(3, dtype=torch.complex64),
        torch.tensor([1.0, nan]),
        torch.tensor([-inf, 2.0]),
        torch.full((6000,), inf),
        torch.tensor([complex(1.0, nan)]),
        torch.randn(4).to_sparse(),
        torch.randn(2, requires_grad=True) * 2,
    ]
    generator = torch.Generator().manual_seed(1)
    for _ in range(200):
        size = int(torch.randint(0, 6, (1,), generator=generator))
        picks = torch.randint(0, len(pool), (size,), generator=generator).tolist()
        chosen = [pool[i] for i in picks]
        assert all_finite(chosen) == all(is_finite(t) for t in chosen), picks
    assert not math.isfinite(float(pool[9].sum()))  # the overflowing sum is in the pool
