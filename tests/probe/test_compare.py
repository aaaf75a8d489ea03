"""`torchls repro FILE --compare BASELINE [--repeat K]` (issue #16, part 2), with real torch on
CPU in a temporary git repository: the committed version has a NaN-producing loss, the working
tree fixes it (exit 0, the finding fixed, the NaN gone, the losses side by side); a change that
introduces the bug exits 1; `--repeat` gives counts per side. The user's tree is never touched.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPT = """\
import torch
import torch.nn as nn

model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = torch.randn(32, 6), torch.randint(0, 3, (32,))
for step in range(50):
    logits = model(x)
    {loss}
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""
BUGGY = "loss = -(torch.log(torch.softmax(logits, 1) * 0)[range(32), y]).mean() * 0"
FIXED = "loss = nn.functional.cross_entropy(logits, y)"


def git(repo: Path, *args: str) -> None:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@e"
    subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, env={**env, "HOME": "/"}
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    if shutil.which("git") is None:
        pytest.fail("git is needed for --compare with a revision")
    folder = tmp_path / "project"
    folder.mkdir()
    git(folder, "init", "-q")
    (folder / "train.py").write_text(SCRIPT.format(loss=BUGGY))
    git(folder, "add", "train.py")
    git(folder, "commit", "-q", "-m", "buggy")
    return folder


def compare(script: Path, *extra: str) -> tuple[int, dict]:
    command = [sys.executable, "-m", "torchls", "repro", str(script), "--python", sys.executable]
    done = subprocess.run(
        [*command, "--compare", *extra, "--output-format", "json"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode in (0, 1), done.stdout + done.stderr
    return done.returncode, json.loads(done.stdout)


def test_a_fix_against_head_removes_the_finding_and_exits_0(repo: Path) -> None:
    script = repo / "train.py"
    script.write_text(SCRIPT.format(loss=FIXED))
    before = script.read_text()
    code, result = compare(script, "HEAD")
    assert code == 0 and result["exit_status"] == 0
    fixed = result["findings"]["fixed"]
    assert [item["code"] for item in fixed] == ["TL901"]
    assert "torch.log" in fixed[0]["line_text"]
    assert result["findings"]["introduced"] == []
    assert result["first_nonfinite"]["baseline"] is not None
    assert result["first_nonfinite"]["candidate"] is None
    cand = result["loss"]["candidate"]
    assert len(cand) == 2 and all(isinstance(v, float) for v in cand)
    assert result["same_start"][0]["matched"] == result["same_start"][0]["tensors"] == 4
    assert script.read_text() == before  # the user's tree is untouched
    status = subprocess.run(
        ["git", "-C", str(repo), "status", "--porcelain"], capture_output=True, text=True
    )
    assert status.stdout.splitlines() == [" M train.py"]  # no checkout, no file left behind


def test_a_change_that_introduces_the_bug_exits_1(tmp_path: Path) -> None:
    good = tmp_path / "good.py"
    good.write_text(SCRIPT.format(loss=FIXED))
    bad = tmp_path / "bad.py"
    bad.write_text(SCRIPT.format(loss=BUGGY))
    code, result = compare(bad, str(good))
    assert code == 1
    assert [item["code"] for item in result["findings"]["introduced"]] == ["TL901"]


def test_repeat_gives_counts_per_side(repo: Path) -> None:
    script = repo / "train.py"
    script.write_text(SCRIPT.format(loss=FIXED))
    code, result = compare(script, "HEAD", "--repeat", "5")
    assert code == 0
    runs = result["runs"]
    assert runs["baseline"]["runs"] == runs["candidate"]["runs"] == 5
    assert runs["baseline"]["nonfinite"] == 5 and runs["candidate"]["nonfinite"] == 0
    spread = runs["candidate"]["final_loss"]
    assert spread["min"] <= spread["max"]


def test_a_baseline_that_is_neither_a_file_nor_a_revision_is_a_usage_error(repo: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "torchls", "repro", str(repo / "train.py"), "--compare", "nope~9"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2 and "neither a file nor a git revision" in done.stderr
