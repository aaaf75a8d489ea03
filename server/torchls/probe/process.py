"""Supervising one sandboxed child: progress lines in, a deadline and cancellation enforced.

In: the full argv, environment, preexec function, a deadline and a cancel event. Out: how the
child ended (`Ended`: exit code or signal, and whether we killed it for the deadline or a cancel)
and the JSON lines it wrote on stdout, delivered to a callback as they arrive. A kill is SIGKILL
to the child's whole process group (bubblewrap's PID namespace takes every descendant with it),
then the pids cgroup, if any, is emptied. The supervisor polls at least every 50 ms, so a cancel
takes effect well within a second.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchls.probe.cgroup import PidsCgroup
from torchls.probe.scratch import read_tail
from torchls.records import record

POLL_S = 0.05
WATCH_S = 1.0


@record(frozen=True)
class Ended:
    returncode: int | None
    killed_for: str | None  # None, "deadline", "cancel" or what a watch returned ("disk")
    wall_s: float
    stderr: str


def supervise(
    argv: list[str],
    *,
    env: dict[str, str],
    cwd: Path,
    preexec: Callable[[], None],
    deadline: float,
    cancel: threading.Event | None,
    on_message: Callable[[dict[str, Any]], None],
    stderr_path: Path,
    cgroup: PidsCgroup | None = None,
    watch: Callable[[], str | None] | None = None,
    tree: bool = False,
) -> Ended:
    """`watch`, called about every WATCH_S, returns a reason to kill the run (`killed_for`).
    `tree`: also kill every descendant found by parent id, whatever its session (torchrun
    starts each rank in a session of its own, which the group kill misses without bubblewrap's
    PID namespace)."""
    started = time.monotonic()
    next_watch = started + WATCH_S
    with open(stderr_path, "wb") as stderr:
        child = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
            cwd=str(cwd),
            start_new_session=True,
            preexec_fn=preexec,
        )
    killed_for: str | None = None
    assert child.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(child.stdout, selectors.EVENT_READ)
    pending = b""
    open_stream = True
    try:
        while True:
            if cancel is not None and cancel.is_set():
                killed_for = "cancel"
                break
            if time.monotonic() >= deadline:
                killed_for = "deadline"
                break
            if watch is not None and time.monotonic() >= next_watch:
                reason = watch()
                if reason is not None:
                    killed_for = reason
                    break
                next_watch = time.monotonic() + WATCH_S
            if open_stream:
                for _key, _mask in selector.select(POLL_S):
                    chunk = os.read(child.stdout.fileno(), 65536)
                    if not chunk:
                        open_stream = False
                        selector.unregister(child.stdout)
                        break
                    pending = _deliver(pending + chunk, on_message)
            elif child.poll() is None:
                time.sleep(POLL_S)
            if not open_stream and child.poll() is not None:
                break
    finally:
        selector.close()
        # Always, even after a normal exit: stragglers in the group (DataLoader workers, a
        # forgotten subprocess) must not outlive the run. The child is not reaped yet, so its
        # pid (= the group id) cannot have been reused.
        kill_group(child, cgroup, tree)
        child.wait()
        child.stdout.close()
    text = _tail(stderr_path, 8192)
    return Ended(child.returncode, killed_for, time.monotonic() - started, text)


def kill_group(child: subprocess.Popen, cgroup: PidsCgroup | None, tree: bool = False) -> None:
    # Found before the kill: once a parent dies, its children are re-parented and lost.
    descendants = _descendants(child.pid) if tree else []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    for pid in descendants:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    if cgroup is not None:
        cgroup.kill_all()


def _descendants(root: int) -> list[int]:
    """Every process below `root`, from /proc (Linux; elsewhere none are found)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 1 and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    seen = {root}
    pending = [root]
    while pending:
        for pid in children.get(pending.pop(), []):
            if pid not in seen:
                seen.add(pid)
                found.append(pid)
                pending.append(pid)
    return found


def _deliver(buffer: bytes, on_message: Callable[[dict[str, Any]], None]) -> bytes:
    *lines, rest = buffer.split(b"\n")
    for line in lines:
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):  # the child may write anything here
            continue
        if isinstance(message, dict):
            on_message(message)
    # A line longer than any real message is noise: drop it rather than grow without bound.
    return rest if len(rest) < 65536 else b""


def _tail(path: Path, limit: int) -> str:
    """The end of the child's stderr. The file lies in a folder the child may write (without
    bubblewrap): never follow a link, never block on a FIFO, never read more than `limit`."""
    try:
        return read_tail(path, limit).decode("utf-8", "replace")
    except OSError:
        return ""
