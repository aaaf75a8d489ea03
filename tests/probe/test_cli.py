"""`torchls repro`: text a person can read, strict JSON, documented exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.probe import cases


def torchls(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "torchls", "repro", *args, "--python", sys.executable],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        check=False,
    )


def test_text_output_shows_the_line_caret_chain_and_shapes(project):
    (project / "train.py").write_text(cases.NAN_LOG)
    done = torchls("train.py", "--device", "cpu", cwd=project)
    assert done.returncode == 1, done.stderr
    out = done.stdout
    log_line = cases.marker_line(cases.NAN_LOG, "log")
    assert "torchls repro train.py: ok, stopped after 2 optimizer steps" in out
    assert "device: cpu (requested cpu; tensors seen on cpu)" in out
    assert f"first non-finite value: forward, train.py:{log_line}:12" in out
    assert f"  {log_line} |     logp = torch.log(probs)" in out
    assert "|            ^^^^^^^^^^^^^^^^ torch.log produced" in out
    assert "chain: train.py:12 torch.log (op) -> train.py:13 Tensor.mul (propagated)" in out
    assert f"train.py:{log_line}:12: TL901 [error]" in out
    assert "shapes:" in out and "F.softmax" in out
    assert out.rstrip().endswith("finding.") or out.rstrip().endswith("findings.")


def test_json_output_is_strict_and_complete(project):
    (project / "train.py").write_text(cases.UNUSED)
    done = torchls("train.py", "--output-format", "json", "--steps", "1", cwd=project)
    assert done.returncode == 1, done.stderr

    def refuse(name):
        raise AssertionError(f"non-strict JSON constant {name}")

    data = json.loads(done.stdout, parse_constant=refuse)
    assert data["schema_version"] == 2
    assert data["status"] == "ok" and data["bounds"]["steps"] == 1
    assert data["environment"]["command"].startswith("torchls repro train.py")
    assert {f["code"] for f in data["findings"]} == {"TL902"}
    for finding in data["findings"]:
        for key in ("filename", "line", "column", "end_line", "end_column", "message"):
            assert key in finding


def test_clean_run_exits_zero(project):
    (project / "train.py").write_text(cases.CLEAN)
    done = torchls("train.py", cwd=project)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No findings." in done.stdout


def test_missing_file_is_a_usage_error(project):
    done = torchls("nope.py", cwd=project)
    assert done.returncode == 2
    assert "file not found" in done.stderr


def test_bad_spec_is_a_usage_error(project):
    (project / "train.py").write_text("x = 1\n")
    (project / "repro.yaml").write_text("step: f\nstesp: 2\n")
    done = torchls("train.py", "--spec", "repro.yaml", cwd=project)
    assert done.returncode == 2
    assert "unknown key 'stesp'; did you mean" in done.stderr and "known keys:" in done.stderr


def test_unknown_device_is_a_usage_error(project):
    (project / "train.py").write_text("x = 1\n")
    done = torchls("train.py", "--device", "tpu", cwd=project)
    assert done.returncode == 2
    assert "unknown device 'tpu'" in done.stderr


def test_unavailable_device_is_an_error_unless_fallback_is_allowed(project):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    (project / "train.py").write_text(cases.CLEAN)
    refused = torchls("train.py", "--device", "cuda", cwd=project)
    assert refused.returncode == 2
    assert "device 'cuda' is not available" in refused.stderr
    allowed = torchls(
        "train.py", "--device", "cuda", "--allow-fallback", "--output-format", "json", cwd=project
    )
    assert allowed.returncode == 0, allowed.stderr
    device = json.loads(allowed.stdout)["device"]
    assert device["requested"] == "cuda" and device["resolved"] == "cpu"
    assert device["fallback"] is True
    assert any("fell back to cpu" in warning for warning in device["warnings"])


def test_interpreter_without_torch_is_an_error(project, tmp_path):
    import venv

    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False)
    (project / "train.py").write_text(cases.CLEAN)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchls",
            "repro",
            "train.py",
            "--python",
            str(bare / "bin/python"),
        ],
        capture_output=True,
        text=True,
        cwd=project,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert "torch cannot be imported by" in done.stderr and "--python" in done.stderr
