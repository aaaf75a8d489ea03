"""Fixtures for the CLI tests: a scratch project folder and a runner for the real command.

The CLI is run as a subprocess (`python -m torchls`) so the tests see exactly what a user or CI
job sees: stdout, stderr, exit code and files on disk. Sample inputs live in `data/`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

DATA = Path(__file__).parent / "data"


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str

    @property
    def lines(self) -> list[str]:
        return self.stdout.splitlines()

    def json(self) -> Any:
        return json.loads(self.stdout)


class Project:
    """A temporary folder to put files in and run `torchls` from."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def write(self, name: str, text: str | bytes) -> Path:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text, encoding="utf-8")
        return path

    def copy(self, sample: str, name: str | None = None) -> Path:
        """Copy `data/<sample>` into the project (as `name` if given)."""
        target = self.root / (name or sample)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(DATA / sample, target)
        return target

    def run(self, *args: str, stdin: bytes | None = None, cwd: Path | None = None) -> Result:
        env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
        completed = subprocess.run(
            [sys.executable, "-m", "torchls", *args],
            cwd=cwd or self.root,
            input=stdin if stdin is not None else b"",
            capture_output=True,
            env=env,
            check=False,
        )
        return Result(
            completed.returncode,
            completed.stdout.decode("utf-8"),
            completed.stderr.decode("utf-8"),
        )

    def codes(self, *args: str) -> list[str]:
        """The finding codes `check --output-format json` reports, in output order."""
        result = self.run("check", "--output-format", "json", *args)
        assert result.returncode in (0, 1), result.stderr
        return [row["code"] for row in result.json()]

    def locate(self, name: str, needle: str) -> tuple[int, int]:
        """1-based (row, column counted in code points) of the first `needle` in the file."""
        text = (self.root / name).read_text(encoding="utf-8")
        for row, line in enumerate(text.splitlines(), start=1):
            column = line.find(needle)
            if column >= 0:
                return row, column + 1
        raise AssertionError(f"{needle!r} not found in {name}")


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project(tmp_path)
