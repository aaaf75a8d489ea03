"""What the repro's trace shows for one value (issue #15's smaller bugs), on report data.

`recon, mu, logvar = model(x)`: the hover on `mu` shows output 1 of the call, not output 0. A
tensor holding -inf or NaN shows them as its extremes, not the range of its finite values. The
text report lists a contract violation once.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from torchls.lsp import repro_hover
from torchls.lsp.repro_lookup import ValueSpan
from torchls.lsp.repro_state import build_result
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
    data, _ = parse_probe_report(json.dumps({"lines": [record]}))
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
    data, _ = parse_probe_report(json.dumps({"status": "ok", "findings": [finding]}))
    assert data is not None
    text = render(ReproReport(data, root=str(tmp_path)), cwd=str(tmp_path))
    assert text.count(message) == 1
    assert "contract violations:" in text and "1 finding." in text
