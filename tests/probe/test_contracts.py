"""Unit tests of the probe's in-process pieces: loss contracts, device notes, report capping."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torchls_probe.contracts import check_loss
from torchls_probe.device import observe
from torchls_probe.environment import git_revision
from torchls_probe.report import dumps, skeleton


def messages(func, *args, **kwargs):
    return [(v.severity, v.message) for v in check_loss(func, args, kwargs)]


def test_softmax_probabilities_given_to_cross_entropy():
    probs = F.softmax(torch.randn(4, 3), dim=1)
    [(severity, message)] = messages(F.cross_entropy, probs, torch.tensor([0, 1, 2, 0]))
    assert severity == "warning" and "looks like probabilities" in message


def test_float_class_targets_and_out_of_range_classes():
    logits = torch.randn(4, 3)
    [(severity, message)] = messages(F.cross_entropy, logits, torch.tensor([0.0, 1.0, 2.0, 0.0]))
    assert severity == "error" and "must be torch.long of shape [4]" in message
    found = messages(F.cross_entropy, logits, torch.tensor([0, 1, 3, 0]))
    assert any("class 3, outside [0, 3)" in m for _, m in found)
    assert messages(F.cross_entropy, logits, torch.tensor([0, 1, -100, 2])) == []


def test_column_targets_for_class_losses_get_a_squeeze_hint():
    [(_, message)] = messages(
        F.nll_loss, torch.randn(4, 3).log_softmax(1), torch.zeros(4, 1).long()
    )
    assert "shape [4, 1]" in message and "squeeze(1)" in message


def test_regression_broadcast_and_integer_targets():
    [(severity, message)] = messages(F.mse_loss, torch.randn(8, 1), torch.randn(8))
    assert severity == "error" and "broadcast to [8, 8]" in message
    assert "64 pairs instead of 8" in message
    [(_, message)] = messages(F.l1_loss, torch.randn(8), torch.ones(8, dtype=torch.long))
    assert "floating target" in message
    assert messages(F.mse_loss, torch.randn(8, 1), torch.randn(8, 1)) == []


def test_binary_losses():
    [(_, message)] = messages(F.binary_cross_entropy, torch.randn(4) * 5, torch.ones(4))
    assert "got logits" in message
    [(_, message)] = messages(F.binary_cross_entropy_with_logits, torch.rand(4), torch.ones(4))
    assert "looks like probabilities" in message


def test_device_mismatch_is_a_warning():
    info = {"resolved": "cuda", "warnings": []}
    observe(info, ["cpu"])
    assert info["observed"] == ["cpu"]
    assert "only seen on cpu" in info["warnings"][0]


def test_git_revision_of_this_checkout():
    found = git_revision(str(Path(__file__).parent))
    assert found is not None and len(found["revision"] or "") == 40


def test_oversized_report_sheds_tensor_detail_but_keeps_findings():
    output = {"shape": [4], "dtype": "float32", "finite": True, "min": 0.0, "max": 1.0}
    lines = [
        {
            "filename": "f.py",
            "line": i,
            "entries": [
                {
                    "op": "torch.relu",
                    "column": 1,
                    "end_column": 5,
                    "nonfinite_count": 0,
                    "outputs": [output] * 4,
                }
            ],
        }
        for i in range(200)
    ]
    lines[0]["entries"][0]["outputs"] = [{**output, "mean": float("nan")}]
    kept = {"code": "TL901", "severity": "error", "filename": "f.py", "message": "kept"}
    kept.update(line=1, column=1, end_line=1, end_column=2)
    report = skeleton("ok", "end", "f.py", [kept])
    report["lines"] = lines
    text = dumps(report, 4000)
    data = json.loads(text)
    assert len(text.encode()) <= 4000
    assert data["truncated"] is True and data["findings"][0]["message"] == "kept"
    assert data["dropped_lines"] == 200 - len(data["lines"])
    assert data["lines"][0]["entries"][0]["outputs"][0]["mean"] is None  # strict: no NaN
