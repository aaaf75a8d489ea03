"""`[tool.torchls.probe]` reaches the repro, from the CLI and from the editor alike.

The project file sets the steps, the device and the interpreter; `torchls repro` (no flags) and
the server's `torchls.runRepro` (no `probe` settings) must both run with them: one optimizer
step on the CPU, and the project's interpreter (here one without torch, so the run fails and
says so, which proves it was the one started).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from lsprotocol import types

from .support import diagnostics_of, open_doc, session

TRAIN = """\
import torch
import torch.nn as nn

model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    loss = model(torch.ones(2, 4)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def _project(root: Path, probe: str) -> Path:
    (root / "pyproject.toml").write_text(f"[tool.torchls.probe]\n{probe}", encoding="utf-8")
    train = root / "train.py"
    train.write_text(TRAIN, encoding="utf-8")
    return train


def _python_without_torch(root: Path) -> Path:
    """An interpreter that starts Python without its site-packages: torch cannot be imported.
    Laid out as an environment (`pyvenv.cfg` names its home) so the sandbox binds that home."""
    env = root / "tools"
    python = env / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n', encoding="utf-8")
    python.chmod(0o755)
    (env / "pyvenv.cfg").write_text(f"home = {Path(sys.executable).parent}\n", encoding="utf-8")
    return python


def _cli_repro(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torchls", "repro", "train.py", *args],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def _editor_repro(root: Path) -> tuple[dict, list[str]]:
    async with session("visual_studio_code", root=root) as client:
        since = len(client.publishes)
        doc = open_doc(client, root / "train.py", TRAIN)
        await diagnostics_of(client, doc, since)
        result = await client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="torchls.runRepro", arguments=[{"uri": doc.uri}])
        )
        return result, [m.message for m in client.messages]


def test_cli_repro_takes_steps_and_device_from_the_project(tmp_path: Path):
    _project(tmp_path, 'steps = 1\ndevice = "cpu"\ntimeout = 60\n')
    done = _cli_repro(tmp_path, "--output-format", "json")
    assert done.returncode in (0, 1), done.stderr
    data = json.loads(done.stdout)
    assert data["bounds"]["steps"] == 1
    assert data["device"]["requested"] == "cpu"
    assert data["progress"]["optimizer_steps"] == 1


def test_cli_flags_win_over_the_project(tmp_path: Path):
    _project(tmp_path, "steps = 1\n")
    done = _cli_repro(tmp_path, "--output-format", "json", "--steps", "2", "--device", "cpu")
    assert done.returncode in (0, 1), done.stderr
    assert json.loads(done.stdout)["bounds"]["steps"] == 2


def test_cli_repro_runs_the_projects_interpreter(tmp_path: Path):
    python = _python_without_torch(tmp_path)
    _project(tmp_path, 'python = "tools/bin/python"\ndevice = "cpu"\n')
    done = _cli_repro(tmp_path)
    # The probe names the interpreter it ended up in (the wrapper's exec target); that torch
    # is missing there proves the wrapper, not torchls's own interpreter, was started.
    assert python.is_file()
    assert done.returncode == 2
    assert "torch cannot be imported" in done.stderr


async def test_editor_repro_takes_steps_and_device_from_the_project(tmp_path: Path):
    _project(tmp_path, 'steps = 1\ndevice = "cpu"\ntimeout = 60\n')
    result, _ = await _editor_repro(tmp_path)
    assert result["status"] == "ok", result
    assert " 1 step " in result["message"] and "on cpu" in result["message"]


async def test_editor_repro_runs_the_projects_interpreter(tmp_path: Path):
    python = _python_without_torch(tmp_path)
    _project(tmp_path, 'python = "tools/bin/python"\ndevice = "cpu"\n')
    result, shown = await _editor_repro(tmp_path)
    assert result["status"] == "failed"
    assert str(python) in result["message"]
    assert "[tool.torchls.probe]" in result["message"]
    assert result["message"] in shown
