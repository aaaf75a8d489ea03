"""scripts/test's choices, run for real: where torch comes from, and the Python-only mode.

`scripts/torch-index` picks PyTorch's CPU-only wheel index when it answers and falls back to the
default index at once when it does not, saying which; here a local HTTP server stands in for
the CPU index, and a closed port for one that cannot be reached.
"""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "torch-index"


def _choose(index: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), sys.executable],
        env={"PATH": "/usr/bin:/bin", "TORCHLS_TORCH_CPU_INDEX": index},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )


@pytest.fixture
def cpu_index(tmp_path: Path) -> Iterator[str]:
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "index.html").write_text("<a>torch-2.13.0+cpu</a>\n")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(tmp_path), **kwargs)

        def log_message(self, *args) -> None:  # keep the test output clean
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_the_cpu_index_is_used_when_it_answers(cpu_index: str) -> None:
    done = _choose(cpu_index)
    assert done.stdout.split() == ["--index-url", cpu_index]
    assert "CPU-only index" in done.stderr


def test_an_unreachable_cpu_index_falls_back_to_the_default_and_says_so() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = _choose(f"http://127.0.0.1:{port}/whl/cpu")
    assert done.stdout.strip() == ""
    assert "default package index" in done.stderr


def _stubbed_run(
    tmp_path: Path, *args: str, **env: str
) -> tuple[subprocess.CompletedProcess[str], str]:
    """scripts/test with every program it starts replaced by a stub that logs its arguments:
    dpkg says every package is missing, the venv's python already has torch."""
    log = tmp_path / "calls.log"
    bin_dir, venv_bin = tmp_path / "bin", tmp_path / "venv" / "bin"
    bin_dir.mkdir()
    venv_bin.mkdir(parents=True)
    stub = f'#!/bin/sh\necho "$(basename "$0") $*" >> {log}\n'
    for name, tail in (("dpkg", "exit 1\n"), ("apt-get", ""), ("sudo", "")):
        (bin_dir / name).write_text(stub + tail)
    for name in ("python", "ruff", "pytest"):
        (venv_bin / name).write_text(stub)
    for path in (*bin_dir.iterdir(), *venv_bin.iterdir()):
        path.chmod(0o755)
    done = subprocess.run(
        [str(ROOT / "scripts" / "test"), *args],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "TORCHLS_VENV": str(venv_bin.parent), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done, log.read_text() if log.exists() else ""


def test_python_only_mode_needs_no_system_packages_and_skips_the_editor_suites(tmp_path: Path):
    done, calls = _stubbed_run(tmp_path, TORCHLS_PYTHON_ONLY="1")
    assert done.returncode == 0, done.stderr
    assert "apt-get" not in calls and "sudo" not in calls
    assert "pytest -q --ignore=tests/editors" in calls
    assert "Python suite only" in done.stdout
    assert "== scripts/test.d" not in done.stdout


def test_the_whole_suite_says_what_it_installs(tmp_path: Path):
    # With pytest arguments the editor suites do not run, so nothing outside the stubs starts.
    done, calls = _stubbed_run(tmp_path, "tests/docs", TORCHLS_PYTHON_ONLY="0")
    assert "apt-get install" in calls and "pytest -q tests/docs" in calls
    assert "Debian packages" in done.stdout and "code-server" in done.stdout
    assert "node 20" in done.stdout
    assert "installing system packages:" in done.stdout
