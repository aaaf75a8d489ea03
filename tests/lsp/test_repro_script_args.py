"""The editor runs argparse-driven scripts: arguments, cwd and writable folders from the
`torchls.probe` settings, from `torchls.runRepro`'s argument and from `[tool.torchls.probe]`,
over stdio with a real server and a real sandboxed run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from lsprotocol import types

from .support import diagnostics_of, open_doc, session

TRAIN = """\
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, required=True)
parser.add_argument("--fast", action="store_true")
args = parser.parse_args()
assert args.fast, "--fast did not arrive"
with open("data/input.txt") as handle:  # relative to where the script runs
    handle.read()
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(args.epochs):
    loss = model(torch.ones(2, 4)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def _project(root: Path, probe: str = "") -> Path:
    (root / "data").mkdir()
    (root / "data" / "input.txt").write_text("tokens", encoding="utf-8")
    if probe:
        (root / "pyproject.toml").write_text(f"[tool.torchls.probe]\n{probe}", encoding="utf-8")
    train = root / "train.py"
    train.write_text(TRAIN, encoding="utf-8")
    return train


async def _run(root: Path, configuration: object, argument: dict) -> dict:
    async with session("visual_studio_code", configuration=configuration, root=root) as client:
        since = len(client.publishes)
        doc = open_doc(client, root / "train.py", TRAIN)
        await diagnostics_of(client, doc, since)
        return await client.workspace_execute_command_async(
            types.ExecuteCommandParams(
                command="torchls.runRepro", arguments=[{"uri": doc.uri, **argument}]
            )
        )


async def test_editor_runs_an_argparse_script_with_arguments_from_a_setting(tmp_path: Path):
    train = _project(tmp_path)
    probe = {"args": "--epochs 5 --fast", "device": "cpu", "python": sys.executable}
    result = await _run(tmp_path, {"probe": probe}, {})
    assert result["status"] == "ok", result
    assert " 2 steps " in result["message"], result
    without = await _run(tmp_path, {"probe": {**probe, "args": ""}}, {})
    # Without them argparse exits on its own line: the setting is what made the run work.
    assert without["status"] == "error", without
    assert without["findings"] == [{"code": "TL905", "line": 8, "filename": str(train)}]


async def test_the_command_argument_wins_over_the_setting(tmp_path: Path):
    _project(tmp_path)
    probe = {"args": "--epochs 5", "device": "cpu", "python": sys.executable}
    result = await _run(tmp_path, {"probe": probe}, {"args": ["--epochs", "3", "--fast"]})
    assert result["status"] == "ok", result


async def test_the_editor_takes_the_arguments_from_the_project_file(tmp_path: Path):
    _project(tmp_path, 'args = "--epochs 4 --fast"\ndevice = "cpu"\n')
    result = await _run(tmp_path, {"probe": {"python": sys.executable}}, {})
    assert result["status"] == "ok", result


def test_the_cli_takes_the_arguments_and_cwd_from_the_project_file(tmp_path: Path):
    _project(tmp_path, 'args = ["--epochs", "4", "--fast"]\ndevice = "cpu"\ncwd = "."\n')
    done = subprocess.run(
        [
            *(sys.executable, "-m", "torchls", "repro", str(tmp_path / "train.py")),
            *("--python", sys.executable, "--output-format", "json"),
        ],
        cwd=tmp_path / "data",  # the project file's cwd wins over the launch folder
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["stopped_by"] == "steps"


def test_a_project_file_cannot_open_the_network_or_name_folders_outside(tmp_path: Path):
    from torchls.config import ConfigError, load_config

    (tmp_path / "pyproject.toml").write_text("[tool.torchls.probe]\nnetwork = true\n")
    try:
        load_config(tmp_path)
    except ConfigError as error:
        assert "--network" in str(error)
    else:
        raise AssertionError("network = true was accepted from a project file")
    (tmp_path / "pyproject.toml").write_text('[tool.torchls.probe]\nwritable = ["../.."]\n')
    try:
        load_config(tmp_path)
    except ConfigError as error:
        assert "outside the project" in str(error)
    else:
        raise AssertionError("a writable folder outside the project was accepted")
