"""What the repro's trace shows for one value (issue #15's smaller bugs), on report data.

`recon, mu, logvar = model(x)`: the hover on `mu` shows output 1 of the call, not output 0. A
tensor holding -inf or NaN shows them as its extremes, not the range of its finite values. The
text report lists a contract violation once. A name assigned from a call of a function or method
of the same file (`loss = loss_fn(...)`, `z = self.reparameterize(...)`, whose ops ran on the
function's own lines) shows the value that function returned, from a real run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.reports import schema_report
from torchls.lsp import repro_hover
from torchls.lsp.repro_lookup import ValueSpan, value_at
from torchls.lsp.repro_state import build_result
from torchls.probe import ReproOptions, run_repro
from torchls.probe.report import ReproReport, parse_probe_report
from torchls.probe.text import render


def _summary(mean: float, **nonfinite: int) -> dict:
    info = {"shape": [2, 3], "dtype": "float32", "device": "cpu", "finite": not nonfinite}
    info.update(min=mean - 1, max=mean + 1, mean=mean)
    if nonfinite:
        info["nonfinite"] = {"nan": 0, "posinf": 0, "neginf": 0, "numel": 6, **nonfinite}
    return info


def test_an_unpacked_name_shows_its_own_output(tmp_path: Path) -> None:
    target = tmp_path / "vae.py"
    source = "recon, mu, logvar = model(x)\n"
    target.write_text(source)
    entry = {
        "op": "VAE.forward",
        "column": 21,
        "end_column": 29,
        "count": 1,
        "outputs": [_summary(10.0), _summary(-3.5), _summary(0.25)],
    }
    record = {"filename": str(target), "line": 1, "entries": [entry]}
    data, _ = parse_probe_report(json.dumps(schema_report(lines=[record])))
    assert data is not None
    result = build_result(target.as_uri(), 1, data, {}, root=tmp_path)
    trace = result.files[os.path.realpath(target)]
    mapping = trace.line_map(None, source)
    mu = ValueSpan("mu", 1, 20, 1, 28, 1)  # 0-based, end exclusive; the report is 1-based
    text = repro_hover.value_markdown(result, trace, mapping, mu)
    assert text is not None
    assert "-3.5" in text and "[output 1]" in text
    assert "| 10 |" not in text and " 10 /" not in text


def test_infinities_and_nan_are_the_extremes_shown() -> None:
    assert repro_hover._stats(_summary(0.0, neginf=2)).startswith("-inf / 1 /")
    assert repro_hover._stats(_summary(0.0, posinf=1)).split(" / ")[1] == "+inf"
    assert repro_hover._stats(_summary(0.0, nan=1)).endswith("/ nan")
    assert repro_hover._stats(_summary(0.0)) == "-1 / 1 / 0"


def test_the_text_report_lists_a_contract_violation_once(tmp_path: Path) -> None:
    target = tmp_path / "train.py"
    target.write_text("loss = criterion(probs, y)\n")
    message = "probabilities passed as logits to cross_entropy (rows sum to 1)"
    finding = {
        "code": "TL903",
        "severity": "error",
        "filename": str(target),
        "line": 1,
        "column": 8,
        "end_line": 1,
        "end_column": 27,
        "message": message,
    }
    data, _ = parse_probe_report(json.dumps(schema_report(findings=[finding])))
    assert data is not None
    text = render(ReproReport(data, root=str(tmp_path)), cwd=str(tmp_path))
    assert text.count(message) == 1
    assert "contract violations:" in text and "1 finding." in text


CALLS = """\
import torch
import torch.nn as nn
import torch.nn.functional as F


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(8, 4)
        self.dec = nn.Linear(2, 8)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        return mu + torch.randn_like(std) * std

    def forward(self, x):
        h = self.enc(x)
        mu, logvar = h[:, :2], h[:, 2:]
        z = self.reparameterize(mu, logvar)
        return torch.sigmoid(self.dec(z)), mu, logvar


def loss_fn(recon, x, mu, logvar):
    bce = F.binary_cross_entropy(recon, x, reduction="sum")
    total = bce - 0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return total


model = Tiny()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.rand(16, 8)
for _ in range(5):
    recon, mu, logvar = model(x)
    loss = loss_fn(recon.clamp(0, 1), x, mu, logvar)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def _hover(result, trace, source: str, target: Path, needle: str, offset: int = 0) -> str | None:
    row = next(i for i, line in enumerate(source.splitlines(), 1) if needle in line)
    column = source.splitlines()[row - 1].index(needle) + offset
    value = value_at({}, target.as_uri(), source, str(target), row, column)
    assert value is not None, needle
    return repro_hover.value_markdown(result, trace, trace.line_map(None, source), value)


def test_names_assigned_from_a_call_of_this_files_function_show_what_it_returned(
    tmp_path: Path,
) -> None:
    import sys

    target = tmp_path / "vae.py"
    target.write_text(CALLS)
    options = ReproOptions(device="cpu", python=sys.executable, timeout_s=60.0)
    report = run_repro(target, options)
    assert report.data["stopped_by"] == "steps"
    result = build_result(target.as_uri(), 1, report.data, {}, root=tmp_path)
    trace = result.files[os.path.realpath(target)]

    loss = _hover(result, trace, CALLS, target, "loss = loss_fn")
    assert loss is not None
    total = next(i for i, line in enumerate(CALLS.splitlines(), 1) if "total = bce" in line)
    assert "returned by `loss_fn`" in loss and f"repro trace of line {total}" in loss
    assert "Tensor\\.sub" in loss and "| scalar | float32 |" in loss
    assert "clamp" not in loss and "[16, 8]" not in loss  # an argument, not the result
    # Where it is used, too: the reaching assignment is the same call.
    used = _hover(result, trace, CALLS, target, "loss.backward", offset=1)
    assert used is not None and "returned by `loss_fn`" in used

    z = _hover(result, trace, CALLS, target, "z = self.reparameterize")
    assert z is not None
    assert "returned by `reparameterize`" in z and "Tensor\\.add" in z and "[16, 2]" in z
