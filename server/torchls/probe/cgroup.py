"""A pids cgroup per run: the process-count limit that also binds root.

RLIMIT_NPROC does not apply to root (the kernel exempts it), so a fork bomb started by a root
user would only be stopped by the wall clock. Where this process may create a cgroup with the
pids controller (root on cgroup v1 `/sys/fs/cgroup/pids`, or a cgroup v2 tree with `pids`
enabled), the run is put in one with `pids.max` set. In: a limit. Out: an fd the child writes its
pid to before exec, and `close()` that kills what is left and removes the group.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import time
from pathlib import Path

_COUNTER = itertools.count()


class PidsCgroup:
    def __init__(self, path: Path, procs_fd: int) -> None:
        self.path = path
        self.procs_fd = procs_fd

    @classmethod
    def create(cls, limit: int) -> PidsCgroup | None:
        """A new group with `pids.max = limit`, or None where that is not possible here."""
        for base in _candidates():
            path = base / f"torchls-{os.getpid()}-{next(_COUNTER)}"
            try:
                path.mkdir()
            except OSError:
                continue
            try:
                (path / "pids.max").write_text(str(limit))
                fd = os.open(path / "cgroup.procs", os.O_WRONLY)
            except OSError:
                _remove(path)
                continue
            return cls(path, fd)
        return None

    def pids(self) -> list[int]:
        try:
            text = (self.path / "cgroup.procs").read_text()
        except OSError:
            return []
        return [int(line) for line in text.split()]

    def kill_all(self) -> None:
        """SIGKILL everything in the group until it is empty (forks race the first rounds)."""
        for _ in range(200):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.procs_fd)
        self.kill_all()
        for _ in range(100):
            if _remove(self.path):
                return
            time.sleep(0.02)


def _candidates() -> list[Path]:
    found = []
    v1 = Path("/sys/fs/cgroup/pids")
    if (v1 / "cgroup.procs").exists() and os.access(v1, os.W_OK):
        found.append(v1)
    v2 = Path("/sys/fs/cgroup")
    try:
        controllers = (v2 / "cgroup.subtree_control").read_text().split()
    except OSError:
        controllers = []
    if "pids" in controllers and os.access(v2, os.W_OK):
        found.append(v2)
    return found


def _remove(path: Path) -> bool:
    try:
        path.rmdir()
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False
