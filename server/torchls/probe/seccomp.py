"""A seccomp filter for repro runs: no shared kernel keyrings, no per-user kernel objects.

Namespaces and rlimits leave some kernel state shared with the user who started the run: the
session and user keyrings (a run could read a key the host put there, or plant one that outlives
it: bubblewrap's `--new-session` does not give a new keyring), and per-user counters such as
inotify instances (a run that takes them all makes the user's editor lose its file watching).
In: the machine's architecture. Out: `Filter`, a prepared classic-BPF program, and the two
calls a preexec function makes after fork: join a new, empty session keyring, then install the
filter (inherited by everything the run starts, the warm worker's children included).

Refused with EPERM: `add_key`, `request_key`, `keyctl`, `inotify_init`/`inotify_init1`,
`fanotify_init`, `bpf`, `perf_event_open`, `userfaultfd` (in the spirit of the default container
profiles: nothing a training step needs). On x86_64 the x32 and i386 entry points, which would
reach the same calls under other numbers, are refused as a whole. Other architectures get no
filter, and the sandbox report says so.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct
import sys

from torchls.records import record

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
KEYCTL_JOIN_SESSION_KEYRING = 1

_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_RET_K = 0x06
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_X32_BIT = 0x40000000

# (audit arch, syscall numbers to refuse, keyctl's number, whether x32 numbers exist)
_ARCHES = {
    "x86_64": (
        0xC000003E,
        {
            "add_key": 248,
            "request_key": 249,
            "keyctl": 250,
            "inotify_init": 253,
            "inotify_init1": 294,
            "perf_event_open": 298,
            "fanotify_init": 300,
            "bpf": 321,
            "userfaultfd": 323,
        },
        True,
    ),
    "aarch64": (
        0xC00000B7,
        {
            "inotify_init1": 26,
            "add_key": 217,
            "request_key": 218,
            "keyctl": 219,
            "perf_event_open": 241,
            "fanotify_init": 262,
            "bpf": 280,
            "userfaultfd": 282,
        },
        False,
    ),
}
REFUSED = ("keyrings", "inotify", "fanotify", "bpf", "perf_event_open", "userfaultfd")


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _program(arch: int, numbers: list[int], x32: bool) -> bytes:
    deny = _ERRNO | errno.EPERM
    body: list[tuple[int, int, int, int]] = []  # (code, jt, jf, k); jumps patched below
    blocked = [(_JGE_K, _X32_BIT)] if x32 else []
    blocked += [(_JEQ_K, number) for number in numbers]
    total = 3 + len(blocked) + 2  # ld arch, jeq arch, ld nr, checks, allow, deny
    deny_at = total - 1

    def jump_to(target: int, at: int) -> int:
        return target - (at + 1)

    body.append((_LD_W_ABS, 0, 0, 4))  # seccomp_data.arch
    body.append((_JEQ_K, 0, jump_to(deny_at, 1), arch))
    body.append((_LD_W_ABS, 0, 0, 0))  # seccomp_data.nr
    for offset, (code, k) in enumerate(blocked):
        at = 3 + offset
        body.append((code, jump_to(deny_at, at), 0, k))
    body.append((_RET_K, 0, 0, _ALLOW))
    body.append((_RET_K, 0, 0, deny))
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in body)


@record
class Filter:
    """A filter ready to install from a preexec function (nothing is allocated there)."""

    program: bytes
    keyctl: int
    _buffer: ctypes.Array[ctypes.c_char] | None = None
    _fprog: _SockFprog | None = None

    def __post_init__(self) -> None:
        self._buffer = ctypes.create_string_buffer(self.program, len(self.program))
        self._fprog = _SockFprog(len(self.program) // 8, ctypes.addressof(self._buffer))

    def new_session_keyring(self, libc: ctypes.CDLL) -> bool:
        """Join a new anonymous session keyring (before the filter refuses keyctl)."""
        return libc.syscall(self.keyctl, KEYCTL_JOIN_SESSION_KEYRING, None) >= 0

    def install(self, libc: ctypes.CDLL) -> bool:
        """Install the filter on this process (and so on everything it starts)."""
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return False
        return libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(self._fprog), 0, 0) == 0


def for_this_machine() -> Filter | None:
    """The filter for this machine's architecture, or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    found = _ARCHES.get(platform.machine())
    if found is None:
        return None
    arch, numbers, x32 = found
    return Filter(_program(arch, sorted(numbers.values()), x32), numbers["keyctl"])
