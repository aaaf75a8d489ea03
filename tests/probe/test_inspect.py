"""`torchls inspect CHECKPOINT` (issue #16, part 1) on checkpoints made here with real torch.

Each test saves a checkpoint the way training code does (plain state, an argparse Namespace, a
dataclass, a custom class, the legacy format, safetensors written by hand, a corrupted and a
truncated file, a pickle that tries to run a command) and runs the real command: the verdict on
`weights_only=True` and its exit status, the globals that block it and where they sit, the
structure and training state, and one-line errors with exit 2 for what is not a checkpoint.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")


def inspect(path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "torchls", "inspect", str(path), "--python", sys.executable]
    return subprocess.run(
        [*command, *extra], capture_output=True, text=True, timeout=180, check=False
    )


def as_json(path: Path) -> tuple[int, dict]:
    done = inspect(path, "--output-format", "json")
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def training_state() -> dict:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 7}


@dataclasses.dataclass
class TrainConfig:
    lr: float = 0.1
    layers: int = 3


class Tracker:
    def __init__(self) -> None:
        self.best = 0.5


def test_a_plain_checkpoint_loads_and_its_state_is_described(tmp_path: Path) -> None:
    path = tmp_path / "plain.pt"
    torch.save(training_state(), path)
    code, record = as_json(path)
    assert code == 0 and record["weights_only"]["loads"] is True
    assert record["format"] == "zip" and record["findings"] == []
    state = record["training_state"]
    assert state["model"] is True and state["optimizer"]["lr"] == [3e-4]
    assert state["counters"] == {"epoch": 7} and record["missing"] == []
    weight = next(n for n in record["tree"] if n["path"] == "ckpt['model']['0.weight']")
    assert weight["shape"] == [3, 4] and weight["dtype"] == "float32" and weight["bytes"] == 48
    assert record["saved_on"] == ["cpu"] and record["map_location_needed"] is False
    text = inspect(path)
    assert text.returncode == 0 and "weights_only=True: loads" in text.stdout


def test_a_namespace_in_the_checkpoint_is_tl911_with_where_it_sits(tmp_path: Path) -> None:
    path = tmp_path / "with_args.pt"
    state = training_state()
    state["args"] = argparse.Namespace(lr=0.1, batch_size=32)
    torch.save(state, path)
    code, record = as_json(path)
    assert code == 1 and record["weights_only"]["loads"] is False
    blocking = record["weights_only"]["blocking"]
    assert [(b["path"], b["global"]) for b in blocking] == [("ckpt['args']", "argparse.Namespace")]
    assert "vars(args)" in blocking[0]["fix"] and "add_safe_globals" in blocking[0]["allow"]
    assert [f["code"] for f in record["findings"]] == ["TL911"]
    node = next(n for n in record["tree"] if n["path"] == "ckpt['args']")
    assert node["fields"] == {"lr": 0.1, "batch_size": 32}  # the config as the plain data it was
    text = inspect(path)
    assert text.returncode == 1 and "REFUSED (TL911)" in text.stdout


@pytest.mark.parametrize("kind", ["dataclass", "custom"])
def test_dataclass_and_custom_objects_block_with_their_fix(tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"{kind}.pt"
    value = TrainConfig() if kind == "dataclass" else Tracker()
    torch.save({"model": training_state()["model"], "extra": value}, path)
    code, record = as_json(path)
    assert code == 1
    (blocking,) = record["weights_only"]["blocking"]
    assert blocking["path"] == "ckpt['extra']"
    assert blocking["global"].endswith(type(value).__name__)
    assert "dataclasses.asdict" in blocking["fix"]
    assert record["missing"] and "optimizer" in record["missing"][0]


def test_a_hostile_pickle_is_listed_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Hostile:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "hostile.pt"
    torch.save({"payload": Hostile()}, path)
    code, record = as_json(path)
    assert code == 1 and not marker.exists()
    (blocking,) = record["weights_only"]["blocking"]
    assert blocking["global"].endswith(".system") and "run code" in blocking["fix"]


def test_the_legacy_format_is_read_and_explained(tmp_path: Path) -> None:
    path = tmp_path / "legacy.pt"
    torch.save(training_state(), path, _use_new_zipfile_serialization=False)
    code, record = as_json(path)
    assert code == 0 and record["format"] == "legacy"
    assert record["totals"]["tensors"] >= 4 and "legacy" in record["weights_only"]["note"]


def test_safetensors_are_read_from_their_header(tmp_path: Path) -> None:
    header = {
        "__metadata__": {"format": "pt"},
        "embed.weight": {"dtype": "F16", "shape": [10, 4], "data_offsets": [0, 80]},
    }
    raw = json.dumps(header).encode()
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 80)
    code, record = as_json(path)
    assert code == 0 and record["format"] == "safetensors"
    assert record["tree"][0]["shape"] == [10, 4] and record["totals"]["bytes"] == 80


@pytest.mark.parametrize("damage", ["truncated", "corrupted"])
def test_a_damaged_file_is_one_line_and_exit_2(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "broken.pt"
    torch.save(training_state(), path)
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    else:
        path.write_bytes(data[:40] + b"\xff" * 200 + data[240:])
    done = inspect(path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("torchls: error:") and len(done.stderr.splitlines()) == 1
    assert "Traceback" not in done.stdout + done.stderr


def test_what_is_not_a_checkpoint_is_refused_without_reading_it(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hello')\n")
    fifo = tmp_path / "pipe.pt"
    os.mkfifo(fifo)
    for target, words in (
        (script, "not a checkpoint"),
        (fifo, "not a regular file"),
        (tmp_path, "is a folder"),
        (tmp_path / "missing.pt", "no such file"),
    ):
        done = inspect(target)
        assert done.returncode == 2, (target, done.stdout, done.stderr)
        assert words in done.stderr and "Traceback" not in done.stderr


def test_rewrite_plain_writes_a_copy_that_loads_weights_only(tmp_path: Path) -> None:
    path = tmp_path / "with_config.pt"
    state = training_state()
    state["args"] = argparse.Namespace(lr=0.1, warmup=10)
    state["cfg"] = {"nested": argparse.Namespace(depth=2)}
    torch.save(state, path)
    out = tmp_path / "plain.pt"
    done = inspect(path, "--rewrite-plain", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rewritten:" in done.stdout and "all equal" in done.stdout
    again = torch.load(out, weights_only=True)
    assert again["args"] == {"lr": 0.1, "warmup": 10} and again["cfg"] == {"nested": {"depth": 2}}
    for key, tensor in state["model"].items():
        assert torch.equal(again["model"][key], tensor)
    refused = inspect(path, "--rewrite-plain", str(out))  # never over an existing file
    assert refused.returncode == 2 and "exists" in refused.stderr
