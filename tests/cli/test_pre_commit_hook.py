"""The pre-commit hook in `.pre-commit-hooks.yaml`, run the way pre-commit runs it.

pre-commit installs the repository into the hook's environment (where the `torchls` console
script is then on PATH), picks the staged files whose type the hook takes, and runs `entry`
+ `args` + those file names in the repository root; a non-zero exit fails the commit. The
test does exactly that in a temporary git repository, with this checkout's `torchls`.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
HOOKS = ROOT / ".pre-commit-hooks.yaml"
# Every key pre-commit's manifest schema allows for a hook.
MANIFEST_KEYS = {
    "id", "name", "entry", "language", "alias", "files", "exclude", "types", "types_or",
    "exclude_types", "additional_dependencies", "args", "always_run", "fail_fast",
    "pass_filenames", "description", "language_version", "log_file",
    "minimum_pre_commit_version", "require_serial", "stages", "verbose",
}  # fmt: skip
BUGGY = """\
import torch.nn.functional as F


def loss_of(logits, y):
    probs = F.softmax(logits, dim=1)
    return F.cross_entropy(probs, y)
"""
CLEAN = BUGGY.replace("cross_entropy(probs, y)", "cross_entropy(logits, y)")


def load_hook() -> dict[str, Any]:
    hooks = yaml.safe_load(HOOKS.read_text(encoding="utf-8"))
    assert isinstance(hooks, list)
    [hook] = [h for h in hooks if h.get("id") == "torchls"]
    return hook


def git(root: Path, *args: str) -> str:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    done = subprocess.run(
        ["git", "-C", str(root), *args], check=True, capture_output=True, env=env, text=True
    )
    return done.stdout


def hook_environment() -> dict[str, str]:
    """PATH as in pre-commit's hook environment: the installed torchls first."""
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "torchls").is_file():
        pytest.fail(f"no torchls console script next to {sys.executable}: pip install -e .")
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_hook(repo: Path) -> subprocess.CompletedProcess[str]:
    """Run the hook on the staged files, as `pre-commit run torchls` would."""
    hook = load_hook()
    staged = [
        name for name in git(repo, "diff", "--cached", "--name-only", "-z").split("\0") if name
    ]
    wanted = {"python": (".py",)}  # identify's tags for the file types used here
    suffixes = tuple(s for kind in hook.get("types", []) for s in wanted.get(kind, ()))
    files = [name for name in staged if name.endswith(suffixes)]
    command = [*shlex.split(hook["entry"]), *hook.get("args", []), *files]
    return subprocess.run(
        command, cwd=repo, capture_output=True, text=True, env=hook_environment(), check=False
    )


def test_hook_definition_is_a_valid_pre_commit_manifest_entry():
    hook = load_hook()
    assert set(hook) <= MANIFEST_KEYS
    assert {"id", "name", "entry", "language"} <= set(hook)
    assert hook["language"] == "python"
    assert shlex.split(hook["entry"])[:2] == ["torchls", "check"]
    assert hook["types"] == ["python"]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    git(tmp_path, "init", "-q")
    (tmp_path / "README.md").write_text("notes\n", encoding="utf-8")
    (tmp_path / "train.py").write_text(BUGGY, encoding="utf-8")
    git(tmp_path, "add", "README.md", "train.py")
    return tmp_path


def test_hook_fails_on_a_staged_buggy_file_and_passes_once_fixed(repo: Path):
    result = run_hook(repo)
    assert result.returncode == 1, result.stderr
    assert "train.py:6:28: TL101" in result.stdout

    (repo / "train.py").write_text(CLEAN, encoding="utf-8")
    git(repo, "add", "train.py")
    result = run_hook(repo)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "All checks passed!" in result.stdout


def test_hook_honours_the_project_exclude_for_staged_files(repo: Path):
    (repo / "pyproject.toml").write_text('[tool.torchls]\nexclude = ["train.py"]\n')
    git(repo, "add", "pyproject.toml")
    result = run_hook(repo)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "TL101" not in result.stdout
