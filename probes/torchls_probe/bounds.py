"""The limits the probe enforces on itself: step/batch stops, the wall-clock alarm, output cap.

In: the numbers from the request. Out: exceptions that unwind the user's code. They derive from
`BaseException` so that a user's `except Exception:` cannot swallow them. The server enforces the
same limits from outside (kill, rlimits); these in-process ones exist so that a partial report
with the right line can still be written when a limit is hit.
"""

from __future__ import annotations

import io
import signal
import sys
import time
from typing import TextIO


class ProbeStop(BaseException):
    """A bound was reached normally (N optimizer steps or N batches): the run is complete."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ProbeLimit(BaseException):
    """A resource limit stopped the run early: `kind` is timeout, cpu or output."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


_ALARM = {"active": False}


def arm_alarm(deadline: float) -> None:
    """Raise ProbeLimit("timeout") in the main thread when `deadline` (time.monotonic) passes.

    A Python-level loop or a sleep is interrupted this way and still gets a report; code stuck
    in C is killed by the server a little later instead. The timer keeps firing every 0.25 s
    after the deadline: an exception raised inside an at-fork callback or a `__del__` is
    swallowed by Python ("Exception ignored in ..."), and one such loss must not cost the report.
    """
    if not hasattr(signal, "setitimer"):
        return
    remaining = max(0.05, deadline - time.monotonic())

    def on_alarm(signum: int, frame: object) -> None:
        if _ALARM["active"]:
            raise ProbeLimit("timeout", "stopped by the wall-clock limit")

    def on_cpu(signum: int, frame: object) -> None:
        if _ALARM["active"]:
            raise ProbeLimit("cpu", "stopped by the CPU-time limit")

    _ALARM["active"] = True
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, remaining, 0.25)
    if hasattr(signal, "SIGXCPU"):
        signal.signal(signal.SIGXCPU, on_cpu)
    if hasattr(signal, "SIGXFSZ"):
        # Past the file-size limit a write should fail with EFBIG, not kill the process.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def disarm_alarm() -> None:
    _ALARM["active"] = False
    if hasattr(signal, "setitimer"):
        signal.setitimer(signal.ITIMER_REAL, 0)


class CappedText(io.TextIOBase):
    """A text stream that forwards at most `cap` bytes in total, then stops the run.

    Shared by stdout and stderr (one budget) so that a flood on either one is caught at the
    `print` that caused it, which is then the line the limit finding points at.
    """

    def __init__(self, target: TextIO, budget: OutputBudget) -> None:
        self._target = target
        self._budget = budget

    def write(self, text: str) -> int:
        size = len(text.encode("utf-8", "replace"))
        if not self._budget.take(size):
            raise ProbeLimit("output", f"output exceeded the cap of {self._budget.cap} bytes")
        self._target.write(text)
        return len(text)

    def flush(self) -> None:
        self._target.flush()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._target.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"


class OutputBudget:
    """Bytes of user output still allowed; `exceeded` is remembered for the report."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.used = 0
        self.exceeded = False

    def take(self, size: int) -> bool:
        if self.used + size > self.cap:
            self.exceeded = True
            return False
        self.used += size
        return True


def capture_output(path: str, cap: int) -> OutputBudget:
    """Point fd 1 and 2 (and sys.stdout/err) at `path`, capped at `cap` bytes of Python output.

    The file lives in the run's scratch directory; writes that bypass Python (C code, os.write)
    are bounded by the file-size rlimit the server sets instead.
    """
    import os

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    budget = OutputBudget(cap)
    raw = open(1, "w", encoding="utf-8", errors="replace", buffering=1, closefd=False)  # noqa: SIM115
    sys.stdout = CappedText(raw, budget)
    sys.stderr = CappedText(raw, budget)
    return budget
