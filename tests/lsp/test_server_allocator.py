"""The language server starts over on the C library's allocator (Linux), so memory freed when
documents close can go back to the system; a user's own PYTHONMALLOC wins, and nothing the
server starts inherits the setting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchls import cli

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


MODULE = [sys.executable, "-m", "torchls", "server"]
SCRIPT = [str(Path(sys.executable).parent / "torchls"), "server"]  # the console script


def start_and_initialize(
    env: dict[str, str], command: list[str] = MODULE
) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    """Start the server, get its answer to `initialize`, and read the environment the
    process (same pid after an exec) runs with."""
    server = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    assert server.stdin is not None and server.stdout is not None
    body = json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"capabilities": {}}}
    ).encode()
    server.stdin.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    server.stdin.flush()
    header = server.stdout.readline()
    assert header.startswith(b"Content-Length:"), header
    with open(f"/proc/{server.pid}/environ", "rb") as handle:
        entries = handle.read().split(b"\0")
    environ = dict(e.decode().partition("=")[::2] for e in entries if b"=" in e)
    return server, environ


def stop(server: subprocess.Popen[bytes]) -> None:
    server.kill()
    server.wait(timeout=30)


@pytest.mark.parametrize("command", [MODULE, SCRIPT], ids=["python -m torchls", "torchls"])
def test_the_server_runs_on_the_system_allocator(command: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONMALLOC", "MALLOC_ARENA_MAX")}
    server, environ = start_and_initialize(env, command)
    try:
        assert environ.get("PYTHONMALLOC") == "malloc"
        assert environ.get("MALLOC_ARENA_MAX") == "2"
    finally:
        stop(server)


def test_a_users_own_allocator_setting_is_kept() -> None:
    env = {**os.environ, "PYTHONMALLOC": "pymalloc"}
    server, environ = start_and_initialize(env)
    try:
        assert environ.get("PYTHONMALLOC") == "pymalloc"
        assert "TORCHLS_SERVER_ALLOCATOR" not in environ
    finally:
        stop(server)


def test_once_in_force_the_settings_leave_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("TORCHLS_SERVER_ALLOCATOR", "1")
    for name, value in cli.SERVER_ALLOCATOR.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(os, "execve", lambda *a: pytest.fail("started over twice"))
    cli.use_system_allocator()
    for name in (*cli.SERVER_ALLOCATOR, "TORCHLS_SERVER_ALLOCATOR"):
        assert name not in os.environ
