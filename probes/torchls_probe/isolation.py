"""Isolation a forked child applies to itself: session, rlimits, PID/IPC/network namespaces.

In: the limits the server chose. Out: what held, as a dict for the report. Used by the warm
worker, whose children are forked rather than started by the server (a cold run gets the same
limits from the server before exec). After `fork()` the child is single-threaded, which is what
`unshare(2)` with CLONE_NEWUSER requires; Python 3.11 has no `os.unshare`, hence ctypes.

A new user namespace gives the child every capability inside it. Left to the run's code, they
would let it mount a tmpfs of its own (memory outside every limit) once it maps its user ID into
the namespace, which a non-root user may; so they are all dropped before any user code runs,
and the namespace stays unmapped (no nested namespace can be given a mapping either).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import sys
from typing import Any

CLONE_NEWIPC = 0x08000000
CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000
CLONE_NEWUSER = 0x10000000
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _limit(kind: int, soft: int, hard: int) -> None:
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(kind, (soft, hard))


def apply_limits(limits: dict[str, Any]) -> None:
    memory = int(limits.get("memory_mb", 0)) << 20
    if memory > 0:
        kind = resource.RLIMIT_DATA if limits.get("use_data_limit") else resource.RLIMIT_AS
        _limit(kind, memory, memory)
    cpu = int(limits.get("cpu_s", 0))
    if cpu > 0:
        _limit(resource.RLIMIT_CPU, cpu, cpu + 5)
    size = int(limits.get("file_size_mb", 0)) << 20
    if size > 0:
        _limit(resource.RLIMIT_FSIZE, size, size)
    _limit(resource.RLIMIT_CORE, 0, 0)
    nproc = int(limits.get("nproc", 0))
    if nproc > 0 and os.geteuid() != 0:
        _limit(resource.RLIMIT_NPROC, nproc, nproc)


def die_with_parent() -> None:
    libc = _libc()
    if libc is not None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def not_dumpable() -> bool:
    """Keep processes of the same user (the runs this worker forks) out of our /proc entries:
    without it a run could open /proc/<worker>/fd/1 and write on the server's channel."""
    libc = _libc()
    return libc is not None and libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0


def children_of(pid: int) -> list[int]:
    """Live processes whose parent is `pid` (Linux /proc; empty elsewhere)."""
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        # The name in parentheses may hold spaces: fields after the last ")" are fixed.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and fields[1] == str(pid).encode():
            found.append(int(entry))
    return found


def become_subreaper() -> bool:
    """Orphaned descendants are re-parented to us (not to init), so we can reap them."""
    libc = _libc()
    return libc is not None and libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def new_namespaces(network: bool) -> dict[str, bool]:
    """Enter a new PID (and optionally network) namespace for this process's children.

    Tries without a user namespace first (root, or capabilities), then with one. Returns which
    namespaces are now in effect.
    """
    libc = _libc()
    if libc is None:
        return {"pid_namespace": False, "network": False}
    # An IPC namespace per run: SysV shared memory one run leaves must not reach the next
    # (it would also stay allocated for the worker's whole life).
    wanted = CLONE_NEWPID | CLONE_NEWIPC | (CLONE_NEWNET if network else 0)
    for flags in (
        wanted,
        wanted | CLONE_NEWUSER,
        CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUSER,
        CLONE_NEWPID | CLONE_NEWUSER,
        CLONE_NEWPID,
    ):
        if libc.unshare(flags) == 0:
            held = {
                "pid_namespace": True,
                "network": bool(flags & CLONE_NEWNET),
                "ipc_namespace": bool(flags & CLONE_NEWIPC),
            }
            if flags & CLONE_NEWUSER:
                held["capabilities_dropped"] = drop_capabilities()
            return held
    return {"pid_namespace": False, "network": False}


def drop_capabilities() -> bool:
    """Give up every capability (bounding, ambient, effective, permitted, inheritable) for this
    process and all it starts. True when none is left."""
    libc = _libc()
    if libc is None:
        return False
    for capability in range(64):
        if libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            break  # past the last capability this kernel knows
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = _CapHeader(CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    return libc.capset(ctypes.byref(header), data) == 0
