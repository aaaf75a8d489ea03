"""`torchls check` on fuzzed files: exit status 0, 1 or 2 and never a traceback.

Hypothesis writes a folder of mutated sources and bytes (the same mutations as
test_fuzz_analysis.py); one real `torchls check` process then checks the whole folder, as a user
or pre-commit would, in every output format and with `--fix --unsafe-fixes`. Odd files a
repository can contain (empty, binary, Latin-1, 1 MB, a folder named like a module, a dangling
symlink) are checked the same way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given

from tests.robustness.corpus import fuzz_settings, mutated_bytes, mutated_source, parses

CHECK = [sys.executable, "-m", "torchls", "check"]
WAIT_S = 300.0  # a safety net against hangs, not a timing assertion


def run_check(*args: str, stdin: bytes | None = None, cwd: Path | None = None):
    done = subprocess.run(
        [*CHECK, *args],
        input=stdin,
        capture_output=True,
        timeout=WAIT_S,
        cwd=cwd,
        check=False,
    )
    stderr = done.stderr.decode("utf-8", "replace")
    assert done.returncode in (0, 1, 2), (done.returncode, stderr[-3000:])
    assert "Traceback" not in stderr, stderr[-3000:]
    return done


def write_fuzzed_folder(folder: Path, count: int) -> list[Path]:
    """`count` mutated text files and `count // 2` mutated byte files under `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    @fuzz_settings(count)
    @given(mutated_source())
    def text_files(source: str) -> None:
        path = folder / f"text_{len(written):04d}.py"
        path.write_bytes(source.encode("utf-8", "surrogatepass"))
        written.append(path)

    @fuzz_settings(count // 2)
    @given(mutated_bytes())
    def byte_files(data: bytes) -> None:
        path = folder / f"bytes_{len(written):04d}.py"
        path.write_bytes(data)
        written.append(path)

    text_files()
    byte_files()
    return written


@pytest.fixture(scope="module")
def fuzzed_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("fuzzed") / "project"
    write_fuzzed_folder(folder, 120)
    return folder


@pytest.mark.parametrize("output_format", ["text", "json", "sarif", "github"])
def test_check_of_a_fuzzed_folder_exits_cleanly(fuzzed_folder: Path, output_format: str) -> None:
    done = run_check("--output-format", output_format, "--color", "never", str(fuzzed_folder))
    if output_format in ("json", "sarif"):
        json.loads(done.stdout)


def test_fix_of_a_fuzzed_folder_keeps_parseable_files_parseable(
    fuzzed_folder: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "copy"
    copy.mkdir()
    parseable = set()
    for path in fuzzed_folder.iterdir():
        data = path.read_bytes()
        (copy / path.name).write_bytes(data)
        try:
            if parses(data.decode("utf-8")):
                parseable.add(path.name)
        except UnicodeDecodeError:
            pass
    run_check("--fix", "--unsafe-fixes", "--color", "never", str(copy))
    broken = [name for name in parseable if not parses((copy / name).read_text("utf-8"))]
    assert broken == []


def test_check_reads_fuzzed_bytes_from_stdin(fuzzed_folder: Path) -> None:
    for path in sorted(fuzzed_folder.iterdir())[::20]:
        run_check("--stdin-filename", "from_stdin.py", "-", stdin=path.read_bytes())


def test_odd_files_in_a_repository(tmp_path: Path) -> None:
    project = tmp_path / "repo"
    project.mkdir()
    (project / "empty.py").write_bytes(b"")
    (project / "blank.py").write_bytes(b"\n\n   \n")
    (project / "binary.py").write_bytes(bytes(range(256)) * 16)
    (project / "latin1.py").write_bytes("name = 'caf\u00e9'\n".encode("latin-1"))
    (project / "bom.py").write_bytes(b"\xef\xbb\xbfimport torch\n")
    (project / "utf16.py").write_bytes("import torch\n".encode("utf-16"))
    (project / "cookie.py").write_bytes(b"# coding: no-such-codec\nimport torch\n")
    (project / "module_folder.py").mkdir()
    (project / "dangling.py").symlink_to(project / "nowhere.py")
    step = (
        "import torch.nn.functional as F\n"
        "def step_{i}(logits, y):\n"
        "    probs = F.softmax(logits, dim=1)\n"
        "    return F.cross_entropy(probs, y)\n"
    )
    (project / "megabyte.py").write_text("".join(step.format(i=i) for i in range(8000)))
    (project / "deep.py").write_text("x = " + "(" * 5000 + ")" * 5000 + "\n")
    done = run_check("--output-format", "json", str(project))
    assert done.returncode == 2  # unreadable and undecodable files are usage errors
    reported = json.loads(done.stdout)
    assert sum(1 for item in reported if item.get("code") == "TL101") == 8000
    for name in sorted(os.listdir(project)):
        if (project / name).is_file() and name != "megabyte.py":
            run_check(str(project / name))
