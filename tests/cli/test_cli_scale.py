"""`torchls check` on large trees: the progress line (terminals only), `.gitignore`, and
`--force-exclude` for tools that name every file (pre-commit).

The progress test gives the real command a pseudo-terminal as stderr and a pipe as stdout, as
a person running it in a shell with `> report.txt` would have.
"""

from __future__ import annotations

import errno
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import Project

BUGGY = "import torch\n\n\ndef load(path):\n    return torch.load(path)\n"  # TL302
MIN_FILES_FOR_PROGRESS = 20


def git(root: Path, *args: str) -> None:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, env=env)


def run_with_tty_stderr(project: Project, *args: str) -> tuple[int, str, str]:
    """Run torchls with stderr on a pseudo-terminal; returns (exit code, stdout, stderr)."""
    primary, secondary = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    with subprocess.Popen(
        [sys.executable, "-m", "torchls", *args],
        cwd=project.root,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=secondary,
        env=env,
    ) as process:
        os.close(secondary)
        chunks = []
        while True:
            try:
                chunk = os.read(primary, 4096)
            except OSError as error:  # EIO: the child closed its end
                if error.errno != errno.EIO:
                    raise
                break
            if not chunk:
                break
            chunks.append(chunk)
        os.close(primary)
        stdout = process.stdout.read().decode() if process.stdout else ""
        code = process.wait()
    return code, stdout, b"".join(chunks).decode()


def many_files(project: Project, count: int) -> None:
    for index in range(count):
        project.write(f"pkg/module_{index:03d}.py", BUGGY)


def test_progress_on_a_terminal_counts_files_and_leaves_stdout_alone(project: Project):
    many_files(project, 25)
    code, stdout, stderr = run_with_tty_stderr(project, "check", "--select", "TL302", ".")
    assert code == 1
    assert "checked 25/25 files" in stderr
    assert "checked 1/25 files" in stderr
    assert "checked" not in stdout
    assert stdout.count("TL302") == 25
    # The progress line is blanked before the command ends, so nothing is left on it.
    last_line = stderr.replace("\r\n", "\n").split("\n")[-1]
    assert last_line.split("\r")[-1].strip() == ""


def test_no_progress_when_stderr_is_not_a_terminal(project: Project):
    many_files(project, 25)
    result = project.run("check", "--select", "TL302", ".")
    assert result.returncode == 1
    assert "checked" not in result.stderr
    assert result.stdout.count("TL302") == 25


def test_no_progress_for_a_small_tree(project: Project):
    many_files(project, MIN_FILES_FOR_PROGRESS - 1)
    code, stdout, stderr = run_with_tty_stderr(project, "check", "--select", "TL302", ".")
    assert code == 1
    assert "checked" not in stderr
    assert stdout.count("TL302") == MIN_FILES_FOR_PROGRESS - 1


@pytest.fixture
def repo(project: Project) -> Project:
    """A git work tree with ignored files and folders next to checked ones."""
    git(project.root, "init", "-q")
    project.write(".gitignore", "outputs/\n*_scratch.py\n")
    project.write("train.py", BUGGY)
    project.write("outputs/run_1/copy_of_train.py", BUGGY)
    project.write("notes_scratch.py", BUGGY)
    project.write("pkg/.gitignore", "local.py\n")
    project.write("pkg/model.py", BUGGY)
    project.write("pkg/local.py", BUGGY)
    return project


def checked_files(project: Project, *args: str) -> list[str]:
    result = project.run("check", "--output-format", "json", *args)
    assert result.returncode in (0, 1), result.stderr
    return sorted(
        Path(row["filename"]).relative_to(project.root.resolve()).as_posix()
        for row in result.json()
    )


def test_gitignored_files_and_folders_are_skipped_in_a_work_tree(repo: Project):
    assert checked_files(repo) == ["pkg/model.py", "train.py"]
    assert checked_files(repo, "pkg") == ["pkg/model.py"]


def test_tracked_files_are_checked_even_when_a_pattern_matches(repo: Project):
    git(repo.root, "add", "-f", "notes_scratch.py")
    assert checked_files(repo) == ["notes_scratch.py", "pkg/model.py", "train.py"]


def test_named_files_and_ignored_folders_are_still_checked(repo: Project):
    assert checked_files(repo, "notes_scratch.py") == ["notes_scratch.py"]
    assert checked_files(repo, "outputs") == ["outputs/run_1/copy_of_train.py"]


def test_outside_a_work_tree_nothing_is_filtered(project: Project):
    project.write(".gitignore", "outputs/\n*_scratch.py\n")
    project.write("train.py", BUGGY)
    project.write("outputs/copy.py", BUGGY)
    project.write("notes_scratch.py", BUGGY)
    assert checked_files(project) == ["notes_scratch.py", "outputs/copy.py", "train.py"]


def test_force_exclude_skips_excluded_and_ignored_files_named_explicitly(repo: Project):
    repo.write("pyproject.toml", '[tool.torchls]\nexclude = ["legacy"]\n')
    repo.write("legacy/old.py", BUGGY)
    named = ["legacy/old.py", "notes_scratch.py", "train.py"]
    assert checked_files(repo, *named) == named
    assert checked_files(repo, "--force-exclude", *named) == ["train.py"]
    # Everything named was excluded: a clean pass, and no "no Python files" warning.
    result = repo.run("check", "--force-exclude", "legacy/old.py")
    assert result.returncode == 0
    assert "warning" not in result.stderr
