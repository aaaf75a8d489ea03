"""The sandbox around a repro: which isolation layers exist here, and how to start a child in them.

In: the interpreter, the probe folder, the run's scratch folder, the paths the run must read and
the limits. Out: a `Launch` (argv prefix, environment, a preexec function applying rlimits and the
pids cgroup) plus the list of `Layer`s with whether each one holds, for the report. Layers:

- bubblewrap (when installed and working): no network, read-only view of `/` with `/tmp`,
  `/var/tmp` and `/run` replaced by empty tmpfs (host sockets and temp files are out of sight),
  the scratch folder as the only writable place, a PID namespace (killing bwrap kills every
  descendant), all capabilities dropped (as root, bwrap alone would let the child remount `/`
  read-write: measured here).
- everywhere: own session/process group, wall-clock kill (process.py), RLIMIT_AS (RLIMIT_DATA
  on CUDA, whose address-space reservations RLIMIT_AS breaks), RLIMIT_CPU, RLIMIT_FSIZE,
  RLIMIT_NPROC (not binding on root, so a pids cgroup where allowed), no core files, a minimal
  environment without secret-looking variables, capped output.
- without bubblewrap: a private network namespace via unshare(2) where permitted, and death of
  the child with its parent; the filesystem and PID layers are then reported as not held.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from torchls.probe.cgroup import PidsCgroup
from torchls.probe.options import ReproUsageError

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
PR_SET_PDEATHSIG = 1

# Folders hidden behind an empty tmpfs inside bubblewrap; paths the run needs are bound back.
HIDDEN_DIRS = ("/tmp", "/var/tmp", "/run")

SECRET_NAME = re.compile(
    r"TOKEN|SECRET|PASSW|CREDENTIAL|API_?KEY|ACCESS_?KEY|PRIVATE|AUTH|SESSION|COOKIE|SSH_|GPG_",
    re.IGNORECASE,
)
# Passed through when set: locale, toolkit locations and device selection, nothing personal.
PASS_THROUGH = (
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "CUDA_HOME",
    "CUDA_PATH",
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "LD_LIBRARY_PATH",
    "CONDA_PREFIX",
    "VIRTUAL_ENV",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "PYTORCH_ENABLE_MPS_FALLBACK",
    "TORCH_HOME",
)


@dataclass(frozen=True)
class Layer:
    name: str
    held: bool
    detail: str

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "held": self.held, "detail": self.detail}


@dataclass(frozen=True)
class Limits:
    memory_mb: int
    cpu_s: int
    file_size_mb: int
    max_processes: int
    use_data_limit: bool = False  # RLIMIT_DATA instead of RLIMIT_AS (CUDA)


@dataclass
class Launch:
    argv_prefix: list[str]
    env: dict[str, str]
    preexec: Callable[[], None]
    layers: list[Layer]
    cgroup: PidsCgroup | None = None
    warnings: list[str] = field(default_factory=list)

    def close(self) -> None:
        if self.cgroup is not None:
            self.cgroup.close()
            self.cgroup = None


@functools.lru_cache(maxsize=1)
def bwrap_works() -> tuple[bool, str]:
    """Whether bubblewrap is installed and can create the namespaces we ask for, here."""
    path = shutil.which("bwrap")
    if path is None:
        return False, "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    probe = [path, *_BWRAP_BASE, "--ro-bind", "/", "/", "--", "true"]
    try:
        done = subprocess.run(probe, capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return False, f"bubblewrap failed to start: {error}"
    if done.returncode != 0:
        reason = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return False, f"bubblewrap cannot create namespaces here: {reason[-1] if reason else '?'}"
    return True, path


_BWRAP_BASE = ("--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL")


def secret_looking(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


def child_environment(
    python: Path, probe_dir: Path, scratch: Path, extra_names: tuple[str, ...]
) -> tuple[dict[str, str], list[str]]:
    """A minimal environment; returns it and the names that were refused as secret-looking."""
    env = {
        "PATH": os.pathsep.join([str(python.parent), "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": str(scratch),
        "TMPDIR": str(scratch),
        "PYTHONPATH": str(probe_dir),
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",  # never write __pycache__ into the user's project
        "PYTHONUNBUFFERED": "1",
        "TORCH_COMPILE_DISABLE": "1",  # tracing is eager-only
        "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
        "MPLBACKEND": "Agg",
        "LANG": "C.UTF-8",
    }
    refused = []
    for name in (*PASS_THROUGH, *extra_names):
        if name not in os.environ:
            continue
        if secret_looking(name):
            refused.append(name)
            continue
        env[name] = os.environ[name]
    return env, refused


def _cuda_possible(device: str) -> bool:
    if device.startswith("cuda"):
        return True
    return device == "auto" and Path("/dev/nvidiactl").exists()


def limits_for(
    memory_mb: int, timeout_s: float, file_size_mb: int, max_processes: int, device: str
) -> Limits:
    # CPU time sums all threads and includes the torch import: the wall clock is the real
    # bound, this one only stops a child that outlived it (cores x timeout + slack).
    cpu = int(timeout_s * max(1, os.cpu_count() or 1)) + 30
    return Limits(memory_mb, cpu, file_size_mb, max_processes, _cuda_possible(device))


def plan(
    *,
    python: Path,
    probe_dir: Path,
    scratch: Path,
    cwd: Path,
    read_paths: list[Path],
    limits: Limits,
    mode: str,
    extra_env: tuple[str, ...] = (),
) -> Launch:
    """How to start the child under every layer available here (`mode`: auto|bwrap|none)."""
    env, refused = child_environment(python, probe_dir, scratch, extra_env)
    layers: list[Layer] = []
    warnings = [
        f"environment variable {name} not passed: it looks like a secret" for name in refused
    ]
    usable, detail = bwrap_works() if mode != "none" else (False, "disabled by request")
    if mode == "bwrap" and not usable:
        raise ReproUsageError(f"--sandbox bwrap: bubblewrap is not usable here: {detail}")
    cgroup = PidsCgroup.create(limits.max_processes)
    root = os.geteuid() == 0
    if usable:
        prefix = bwrap_prefix(detail, python, probe_dir, scratch, cwd, read_paths)
        layers += [
            Layer("bubblewrap", True, detail),
            Layer("network", True, "no network: private network namespace (bwrap --unshare-net)"),
            Layer(
                "filesystem",
                True,
                "read-only view of /; /tmp, /var/tmp and /run empty; writable: scratch only",
            ),
            Layer("pid_namespace", True, "own PID namespace: a kill ends every descendant"),
            Layer("capabilities", True, "all capabilities dropped"),
        ]
        unshare_net = False
    else:
        prefix = []
        net_ok = _can_unshare_net()
        unshare_net = net_ok
        layers += [
            Layer("bubblewrap", False, detail),
            Layer(
                "network",
                net_ok,
                "private network namespace via unshare(2)"
                if net_ok
                else "NOT isolated: unshare(CLONE_NEWNET) is not permitted here",
            ),
            Layer(
                "filesystem",
                False,
                "NOT isolated: the code can write wherever this user can (cwd is the project)",
            ),
            Layer(
                "pid_namespace",
                False,
                "NOT isolated: a descendant that calls setsid() can outlive a kill",
            ),
        ]
        warnings.append(f"sandbox degraded: {detail}")
    layers.append(Layer("process_group", True, "own session and process group, killed as a whole"))
    memory_kind = "RLIMIT_DATA" if limits.use_data_limit else "RLIMIT_AS"
    if not sys.platform.startswith("linux"):
        memory_kind += " (best effort: this OS may ignore it)"
    layers += [
        Layer("memory", True, f"{memory_kind} {limits.memory_mb} MB"),
        Layer("cpu_time", True, f"RLIMIT_CPU {limits.cpu_s} s"),
        Layer("file_size", True, f"RLIMIT_FSIZE {limits.file_size_mb} MB, no core files"),
    ]
    if cgroup is not None:
        layers.append(Layer("processes", True, f"pids cgroup, pids.max {limits.max_processes}"))
    elif not root:
        layers.append(
            Layer(
                "processes", True, f"RLIMIT_NPROC (this user's processes + {limits.max_processes})"
            )
        )
    else:
        layers.append(
            Layer(
                "processes",
                False,
                "NOT limited: root is exempt from RLIMIT_NPROC and no pids cgroup is available",
            )
        )
    secrets = f"; refused: {', '.join(refused)}" if refused else ""
    layers.append(Layer("environment", True, f"minimal environment, no secrets{secrets}"))
    preexec = _preexec(limits, cgroup, unshare_net, pdeathsig=not usable)
    return Launch(prefix, env, preexec, layers, cgroup, warnings)


def bwrap_prefix(
    bwrap: str,
    python: Path,
    probe_dir: Path,
    scratch: Path,
    cwd: Path,
    read_paths: list[Path],
) -> list[str]:
    args = [bwrap, *_BWRAP_BASE, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for device in [*sorted(Path("/dev").glob("nvidia*")), Path("/dev/dri")]:
        if device.exists():
            args += ["--dev-bind", str(device), str(device)]
    for hidden in HIDDEN_DIRS:
        if os.path.isdir(hidden) and not os.path.islink(hidden):
            args += ["--tmpfs", hidden]
    for path in keep_paths([*interpreter_paths(python), probe_dir, cwd, *read_paths]):
        args += ["--ro-bind", str(path), str(path)]
    args += ["--bind", str(scratch), str(scratch), "--chdir", str(cwd), "--"]
    return args


def interpreter_paths(python: Path) -> list[Path]:
    """Folders the interpreter needs: its venv (as invoked) and the base installation."""
    paths = [python.parent.parent, Path(os.path.realpath(python)).parent.parent]
    config = python.parent.parent / "pyvenv.cfg"
    try:
        for line in config.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip():
                paths.append(Path(value.strip()).parent)
    except OSError:
        pass
    return paths


def keep_paths(paths: list[Path]) -> list[Path]:
    """The paths under a hidden folder that must be bound back, outermost only, sorted."""
    wanted = set()
    for path in paths:
        real = Path(os.path.realpath(path))
        for candidate in {Path(os.path.abspath(path)), real}:
            if any(_under(candidate, Path(h)) for h in HIDDEN_DIRS) and candidate.exists():
                wanted.add(candidate)
    kept: list[Path] = []
    for path in sorted(wanted, key=lambda p: (len(p.parts), str(p))):
        if not any(_under(path, k) for k in kept):
            kept.append(path)
    return sorted(kept)


def _under(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


@functools.lru_cache(maxsize=1)
def _can_unshare_net() -> bool:
    """Try it in a throw-away child: unshare needs privilege (or a user namespace)."""
    if _libc() is None:
        return False
    code = (
        "import ctypes,os,sys;l=ctypes.CDLL(None,use_errno=True);"
        f"f={CLONE_NEWNET} if os.geteuid()==0 else {CLONE_NEWNET | CLONE_NEWUSER};"
        "sys.exit(0 if l.unshare(f)==0 else 1)"
    )
    try:
        done = subprocess.run([sys.executable, "-S", "-c", code], timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _user_process_count() -> int:
    uid = os.getuid()
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry}/task"))
            except OSError:
                continue
    return count


def _preexec(
    limits: Limits, cgroup: PidsCgroup | None, unshare_net: bool, pdeathsig: bool
) -> Callable[[], None]:
    """Runs in the child between fork and exec: only async-signal-tolerant, prepared work."""
    libc = _libc() if (unshare_net or pdeathsig) else None
    memory = limits.memory_mb << 20
    size = limits.file_size_mb << 20
    nproc = None
    if os.geteuid() != 0 and sys.platform.startswith("linux"):
        nproc = _user_process_count() + limits.max_processes
    memory_limit = resource.RLIMIT_DATA if limits.use_data_limit else resource.RLIMIT_AS
    flags = CLONE_NEWNET if os.geteuid() == 0 else CLONE_NEWNET | CLONE_NEWUSER
    procs_fd = cgroup.procs_fd if cgroup is not None else None

    def limit(kind: int, soft: int, hard: int) -> None:
        # Some systems (macOS for RLIMIT_AS) refuse a limit: the run goes on without it.
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(kind, (soft, hard))

    def apply() -> None:
        if procs_fd is not None:
            os.write(procs_fd, str(os.getpid()).encode())
        # Zero means "no limit here" (the warm worker: its children set their own).
        if memory > 0:
            limit(memory_limit, memory, memory)
        if limits.cpu_s > 0:
            limit(resource.RLIMIT_CPU, limits.cpu_s, limits.cpu_s + 5)
        if size > 0:
            limit(resource.RLIMIT_FSIZE, size, size)
        limit(resource.RLIMIT_CORE, 0, 0)
        if nproc is not None:
            limit(resource.RLIMIT_NPROC, nproc, nproc)
        if libc is not None and pdeathsig:
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if libc is not None and unshare_net:
            libc.unshare(flags)

    return apply
