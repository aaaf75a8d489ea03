"""Who this process is in a distributed repro, and the folder its ranks share (torch-free).

In: the environment torchrun gives each worker (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK) and the request's `distributed` block. Out: an `Identity`, the
rank's own report file chosen from the server's list (by local rank: each node's server made
its own), and an `Exchange`, the folder every rank of this node writes small JSON records into
(started, a hang or crash declared, a stack snapshot, what a finished rank saw). Ranks never
talk through the user's process group: a probe collective could itself hang, or pair with a
user's collective and corrupt it. Records are written atomically (a temporary name, then a
rename), so a reader sees a whole record or none.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from types import FrameType
from typing import Any

# Frames kept per stack snapshot: enough to see the user's call chain through a library.
STACK_FRAMES = 40


@dataclass(frozen=True)
class Identity:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    # Seconds between the server launching torchrun and this rank starting: its wall-clock
    # budget counts from the launch (the server's deadline does not wait for the ranks).
    late_s: float = 0.0

    @classmethod
    def from_environment(cls, nproc: int, late_s: float = 0.0) -> Identity:
        def number(name: str, default: int) -> int:
            try:
                return int(os.environ.get(name, default))
            except ValueError:
                return default

        local = number("LOCAL_RANK", 0)
        return cls(
            rank=number("RANK", local),
            local_rank=local,
            world_size=number("WORLD_SIZE", nproc),
            local_world_size=number("LOCAL_WORLD_SIZE", nproc),
            node_rank=number("GROUP_RANK", 0),
            late_s=late_s,
        )

    def to_json(self) -> dict[str, int]:
        return {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "local_world_size": self.local_world_size,
            "node_rank": self.node_rank,
        }


def adopt(request: Any, started: float) -> Identity | None:
    """Make a rank's request its own: its report file, and how late it started (`started`:
    this process's start, time.monotonic()). None outside a distributed repro."""
    block = getattr(request, "distributed", None)
    if not block:
        return None
    launched = block.get("launched_unix")
    late = 0.0
    if isinstance(launched, (int, float)):
        late = max(0.0, time.time() - float(launched) - (time.monotonic() - started))
    identity = Identity.from_environment(int(block.get("nproc") or 1), late)
    reports = block.get("reports") or []
    if 0 <= identity.local_rank < len(reports):
        request.out = reports[identity.local_rank]
    die_with_parent()
    return identity


def die_with_parent() -> None:
    """Without bubblewrap's PID namespace a killed torchrun would leave its workers running
    (it starts each in a session of its own): each rank dies with it."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        parent = os.getppid()
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the call took effect
            os._exit(1)


class Exchange:
    """The node's shared folder for rank records (created by whichever rank comes first)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        with contextlib.suppress(OSError):
            os.makedirs(folder, mode=0o700, exist_ok=True)

    def path(self, name: str) -> str:
        return os.path.join(self.folder, name)

    def write(self, name: str, data: Any) -> bool:
        temporary = self.path(f".{name}.{os.getpid()}.{threading.get_ident()}")
        try:
            with open(temporary, "w", encoding="utf-8") as handle:
                json.dump(data, handle, default=str, allow_nan=False)
            os.replace(temporary, self.path(name))
            return True
        except (OSError, ValueError, TypeError):
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            return False

    def claim(self, name: str, data: Any) -> bool:
        """Write `name` only if no rank did before: True for the one rank that declares."""
        try:
            fd = os.open(self.path(name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError:
            return False
        # The record is complete before anyone can rely on it: readers retry a partial one.
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, default=str, allow_nan=False)
        return True

    def read(self, name: str) -> Any:
        try:
            with open(self.path(name), encoding="utf-8") as handle:
                return json.load(handle)
        except (OSError, ValueError):
            return None

    def exists(self, name: str) -> bool:
        return os.path.exists(self.path(name))


def stack_of(thread_id: int | None, user: Any, probe_dir: str) -> dict[str, Any]:
    """The Python stack of thread `thread_id` right now (outermost first, the probe's own
    frames left out) and its innermost user frame as a `Location`, for a snapshot."""
    frames: list[dict[str, Any]] = []
    innermost = None
    frame: FrameType | None = sys._current_frames().get(thread_id) if thread_id else None
    chain: list[FrameType] = []
    while frame is not None and len(chain) < 200:
        chain.append(frame)
        frame = frame.f_back
    for item in reversed(chain):
        code = item.f_code
        if code.co_filename.startswith(probe_dir) or "runpy" in code.co_filename:
            continue
        frames.append(
            {"filename": code.co_filename, "line": item.f_lineno, "function": code.co_name}
        )
        if user is not None and user.filename(code) is not None:
            innermost = user.location(item)
    return {"frames": frames[-STACK_FRAMES:], "innermost": innermost}
