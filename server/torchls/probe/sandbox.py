"""The sandbox around a repro: which isolation layers exist here, and how to start a child in them.

In: the interpreter, the probe folder, the run's scratch folder, the paths the run must read, the
files it may write and the limits, grouped in `PlanInputs`. Out: a `SandboxPlan` (argv prefix,
environment, a preexec function applying rlimits and the pids cgroup) plus the list of `Layer`s
with whether each one holds, for the report. Layers:

- bubblewrap (when installed and working): no network; a read-only view of `/` in which the
  user's home folders (`$HOME`, and as root `/root` and `/home`) and `/run` are empty read-only
  folders and `/dev` is read-only; the only writable places are private, size-limited tmpfs
  (the scratch folder, `/tmp`, `/var/tmp`: `tmpfs_mb` each; `/dev/shm`: `shm_mb`, the memory
  limit, since DataLoader workers pass whole batches through it) and the report and output files
  bound one by one (RLIMIT_FSIZE each); what the run needs from a hidden folder (the project,
  the interpreter and its venv, `.pth` entries and the package folders of setuptools' editable
  finders, toolkit folders named in the environment, the probe) is bound back read-only; a PID
  namespace (killing bwrap kills every descendant); all capabilities dropped (as root, bwrap
  alone would let the child remount `/` read-write: measured here).
- everywhere: own session/process group, wall-clock kill (process.py), RLIMIT_AS (RLIMIT_DATA
  where CUDA may load: asked for, or any device on a machine with an NVIDIA driver, whose
  address-space reservations RLIMIT_AS breaks), RLIMIT_CPU, RLIMIT_FSIZE,
  RLIMIT_NPROC (not binding on root, so a pids cgroup where allowed), no core files, a minimal
  environment without secret-looking variables, capped output.
- without bubblewrap: a private network namespace via unshare(2) where permitted, and death of
  the child with its parent; the filesystem, home, disk and PID layers are then reported as not
  held.

Fail closed (`bwrap_decision`): bubblewrap is tried for every run (a failed trial retried after
a short pause, a pass remembered for a moment); installed but failing, the run is refused
(`SandboxRefused`) unless `--sandbox none` asked for no sandbox. Only where it is not installed
does `auto` run degraded, and `protections_line` says so first in every report.

The probe needs POSIX rlimits, process groups and fork: `ensure_supported` turns their absence
(Windows) into a `ReproUsageError` instead of an import error.
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from importlib.machinery import all_suffixes
from pathlib import Path

from torchls.probe import seccomp
from torchls.probe.cgroup import PidsCgroup
from torchls.probe.options import DEFAULT_MEMORY_MB, ReproUsageError
from torchls.probe.view import ProjectView
from torchls.records import field, record

try:
    import resource
except ImportError:  # Windows: ensure_supported() says so before anything needs it
    resource = None  # type: ignore[assignment]

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
PR_SET_PDEATHSIG = 1

# Inside bubblewrap: private size-limited tmpfs (writable), and empty read-only folders.
PRIVATE_DIRS = ("/tmp", "/var/tmp")
EMPTY_DIRS = ("/run",)
# Every folder hidden behind a tmpfs (the homes come on top); what a run needs is bound back.
HIDDEN_DIRS = (*PRIVATE_DIRS, *EMPTY_DIRS)
# A "home" that is one of these (or holds one) is never hidden: the system would go with it.
SYSTEM_DIRS = (
    "/usr",
    "/etc",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/opt",
    "/var",
    "/srv",
    "/dev",
    "/proc",
    "/sys",
    "/tmp",
    "/run",
    "/boot",
    "/mnt",
    "/media",
    "/nix",
    "/snap",
)
# Folders the environment passes through that a run may need to read (toolkits, caches).
PATH_VARIABLES = ("CUDA_HOME", "CUDA_PATH", "CONDA_PREFIX", "VIRTUAL_ENV", "TORCH_HOME")
PTH_LIMIT = 64 << 10  # bytes read from one .pth file
PTH_FILES = 200  # .pth files read per site-packages folder
FINDER_LIMIT = 256 << 10  # bytes of one setuptools editable finder; a larger one is ignored
FINDER_PATHS = 200  # paths taken from one finder
# `import __editable___NAME_finder; ...`: setuptools >= 64 editable installs without a src
# folder, whose package folders are in that module's MAPPING (and NAMESPACES) literals.
EDITABLE_FINDER = re.compile(r"import\s+(__editable___\w+_finder)\s*(?:;|$)")

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
# Model and dataset caches bound read-only when they exist: (environment variable naming the
# folder, its default under the home or XDG_CACHE_HOME). The child's HOME is its scratch, so
# the variable is set to the real folder for the libraries to find it.
CACHE_FOLDERS = (
    ("TORCH_HOME", "torch"),
    ("HF_HOME", "huggingface"),
)
CACHE_EXTRA = ("HF_DATASETS_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE", "HF_HUB_CACHE")
# Credentials that live inside a cache folder: hidden behind /dev/null even there.
CACHE_SECRETS = ("token", "stored_tokens", ".credentials")


@record(frozen=True)
class Layer:
    name: str
    held: bool
    detail: str

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "held": self.held, "detail": self.detail}


@record(frozen=True)
class Limits:
    memory_mb: int
    cpu_s: int
    file_size_mb: int
    max_processes: int
    use_data_limit: bool = False  # RLIMIT_DATA instead of RLIMIT_AS (CUDA)
    # Size of the private scratch, /tmp and /var/tmp inside bubblewrap (0: unbounded).
    tmpfs_mb: int = 0
    # Size of the private /dev/shm: shared memory (DataLoader batches), so the memory limit;
    # 0: memory_mb, or the default memory limit where that is 0 too (the warm worker).
    shm_mb: int = 0

    @property
    def dev_shm_mb(self) -> int:
        return self.shm_mb or self.memory_mb or DEFAULT_MEMORY_MB


@record
class SandboxPlan:
    """What `plan` decided for one launch: the command prefix (bubblewrap's, or none), the
    child's environment and the function run in it before exec (rlimits, session, seccomp,
    network), the pids cgroup, the report's layers and warnings. `close()` removes the cgroup."""

    argv_prefix: list[str]
    env: dict[str, str]
    preexec: Callable[[], None]
    layers: list[Layer]
    cgroup: PidsCgroup | None = None
    warnings: list[str] = field(default_factory=list)
    # Writable folders private to the sandbox besides the scratch (a warm worker empties them
    # between runs); empty without bubblewrap, where they are the host's own.
    private: list[str] = field(default_factory=list)

    def close(self) -> None:
        if self.cgroup is not None:
            self.cgroup.close()
            self.cgroup = None


@record(frozen=True)
class PlanInputs:
    """What one launch confines, grouped for `plan` and `bwrap_prefix`: the interpreter, the
    probe's read-only folder, the writable scratch (HOME, TMPDIR), the folder the child starts
    in and the other paths it reads, its limits and the sandbox mode (auto|bwrap|none).
    `outputs` are existing files the child writes (a cold run's report and output), bound one by
    one inside bubblewrap; `results` is a warm worker's folder for its runs' reports and outputs
    (a tmpfs of its own, twice the size of the others). `own_namespaces`: the child makes
    namespaces itself (the warm worker's per-run PID namespace), so user namespaces stay allowed
    inside; it drops their capabilities itself. `loopback`: the run talks to itself over the
    network (the ranks of a distributed repro), so a private network namespace made without
    bubblewrap gets its loopback brought up."""

    python: Path
    probe_dir: Path
    scratch: Path
    cwd: Path
    limits: Limits
    mode: str
    read_paths: tuple[Path, ...] = ()
    extra_env: tuple[str, ...] = ()
    outputs: tuple[Path, ...] = ()
    results: Path | None = None
    own_namespaces: bool = False
    project: ProjectView | None = None
    network: bool = False
    loopback: bool = False


@record(frozen=True)
class View:
    """What the bubblewrap mounts hide and expose, for the layer report."""

    homes: tuple[Path, ...]  # hidden behind an empty read-only folder
    exposed: tuple[Path, ...]  # homes a needed path brings back whole
    rebound: tuple[Path, ...]  # needed paths inside a home, bound back read-only
    private: tuple[str, ...]  # private writable tmpfs besides the scratch (/dev/shm last)
    sized: bool  # the scratch, /tmp and /var/tmp have a size limit
    no_userns: bool = False  # no user namespace can be created inside
    shm_mb: int = 0  # the size of /dev/shm (0: unbounded)
    caches: tuple[Path, ...] = ()  # model and dataset caches bound read-only
    network: bool = False  # the network namespace is shared (--network)


def platform_problem() -> str | None:
    """Why the probe cannot run on this platform, or None."""
    if resource is None or os.name != "posix" or not hasattr(os, "killpg"):
        return (
            "the runtime probe is not supported on this platform (it needs POSIX resource "
            "limits, process groups and fork: Linux or macOS); torchls check and the language "
            "server work here"
        )
    return None


def ensure_supported() -> None:
    problem = platform_problem()
    if problem is not None:
        raise ReproUsageError(problem)


_BWRAP_BASE = ("--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL")
NOT_INSTALLED = "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
BWRAP_TRIAL_TIMEOUT_S = 10
# Pauses before the second and third trial: a loaded machine can fail one (a timeout, a clone
# refused for a moment) and pass the next; a bubblewrap that cannot work fails all three.
BWRAP_RETRY_S = (0.2, 0.5)
BWRAP_PASS_TTL_S = 2.0


def _bwrap_try(path: str, extra: tuple[str, ...]) -> str | None:
    """None when bubblewrap runs `true` with these options, else why not."""
    probe = [path, *_BWRAP_BASE, "--ro-bind", "/", "/", *extra, "--", "true"]
    try:
        done = subprocess.run(
            probe, capture_output=True, timeout=BWRAP_TRIAL_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"bubblewrap failed to start: {error}"
    if done.returncode != 0:
        reason = done.stderr.decode("utf-8", "replace").strip().splitlines()
        said = reason[-1] if reason else "no message"
        return f"bubblewrap cannot create namespaces here (exit status {done.returncode}: {said})"
    return None


@record(frozen=True)
class Bwrap:
    """What the trial of bubblewrap found for one run: `state` is "works" (`detail` is its
    path), "fails" (installed at `path`, `detail` says why its last trial failed) or "absent"."""

    state: str
    detail: str
    path: str | None = None
    tries: int = 0


# Only a trial that passed is remembered, and briefly: the steps of one run (its project view,
# its plan, the tmpfs and user-namespace features) ask within milliseconds of each other. A
# failure is never remembered: it was cached for the life of the process once, and one trial
# that timed out on a loaded machine weakened every later run of the language server.
_passed: dict[str, float] = {}
_features: set[tuple[str, str]] = set()
_memory = threading.Lock()


def bwrap_state() -> Bwrap:
    """Whether bubblewrap is installed and can create the namespaces we ask for, now. A failed
    trial is retried after each pause of `BWRAP_RETRY_S` before the answer is "fails"."""
    path = shutil.which("bwrap")
    if path is None:
        return Bwrap("absent", NOT_INSTALLED)
    with _memory:
        passed = _passed.get(path)
    if passed is not None and time.monotonic() - passed < BWRAP_PASS_TTL_S:
        return Bwrap("works", path, path)
    problem = "?"
    for tries, pause in enumerate((0.0, *BWRAP_RETRY_S), 1):
        time.sleep(pause)
        found = _bwrap_try(path, ())
        if found is None:
            with _memory:
                _passed[path] = time.monotonic()
            return Bwrap("works", path, path, tries)
        problem = found
    return Bwrap("fails", problem, path, tries)


def bwrap_works() -> tuple[bool, str]:
    """(usable, bubblewrap's path or why not): `bwrap_state` for callers that only ask yes/no."""
    found = bwrap_state()
    return found.state == "works", found.detail


def _bwrap_feature(name: str, extra: tuple[str, ...]) -> bool:
    """Whether the working bubblewrap accepts `extra`; a yes is kept for that bubblewrap, a no
    is asked again next time (a transient failure must not weaken later runs)."""
    found = bwrap_state()
    if found.state != "works" or found.path is None:
        return False
    key = (found.path, name)
    with _memory:
        if key in _features:
            return True
    if _bwrap_try(found.path, extra) is not None:
        return False
    with _memory:
        _features.add(key)
    return True


def bwrap_sizes_tmpfs() -> bool:
    """Whether this bubblewrap can mount a size-limited tmpfs (`--size`, bubblewrap 0.7)."""
    extra = ("--dev", "/dev", "--perms", "1777", "--size", str(1 << 20), "--tmpfs", "/tmp")
    return _bwrap_feature("size", (*extra, "--remount-ro", "/dev"))


def bwrap_disables_userns() -> bool:
    """Whether this bubblewrap can forbid user namespaces inside (`--disable-userns`, 0.8):
    in one, a non-root user's code could map itself and mount a tmpfs of unbounded size."""
    return _bwrap_feature("disable-userns", ("--unshare-user", "--disable-userns"))


class SandboxRefused(ReproUsageError):
    """bubblewrap is installed but failed its trial: the run is refused, never run weaker."""


def refusal(found: Bwrap, mode: str) -> str:
    """Why a run was refused, and the one way to run it without bubblewrap anyway."""
    tries = f"{found.tries} trial{'s' if found.tries != 1 else ''}"
    return (
        f"sandbox refused (--sandbox {mode}): bubblewrap is installed ({found.path}) but failed "
        f"{tries} ({found.detail}); the run was not started rather than run with weaker "
        "isolation (the host's /tmp and home writable). Fix bubblewrap (it needs unprivileged "
        "user namespaces), or opt out of the sandbox explicitly with --sandbox none"
    )


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
    """The run may load the CUDA driver, whose address-space reservations RLIMIT_AS breaks:
    asked for CUDA, or on a machine with an NVIDIA driver whatever the device. With
    `--device cpu` the GPUs are hidden, yet a CUDA build of torch still initialises the driver
    when the script asks `torch.cuda.is_available()`, and under RLIMIT_AS that fails, then
    the next allocation raises MemoryError (seen on an H200 machine)."""
    return device.startswith("cuda") or _nvidia_driver_present()


def _nvidia_driver_present() -> bool:
    return Path("/proc/driver/nvidia").exists() or any(
        Path("/dev", name).exists() for name in ("nvidiactl", "nvidia0", "nvidia-uvm")
    )


def limits_for(
    memory_mb: int, timeout_s: float, file_size_mb: int, max_processes: int, device: str
) -> Limits:
    # CPU time sums all threads and includes the torch import: the wall clock is the real
    # bound, this one only stops a child that outlived it (cores x timeout + slack).
    cpu = int(timeout_s * max(1, os.cpu_count() or 1)) + 30
    return Limits(
        memory_mb, cpu, file_size_mb, max_processes, _cuda_possible(device), file_size_mb, memory_mb
    )


@record(frozen=True)
class Decisions:
    """What `plan` decided, without a word of report text: which layers hold here and why."""

    bwrap: bool  # the child runs inside bubblewrap
    bwrap_detail: str  # bubblewrap's path, or why it is not used
    view: View | None  # what the bubblewrap mounts hide and expose (None without bubblewrap)
    unshare_net: bool  # without bubblewrap: the child unshares its network itself
    refused: tuple[str, ...]  # environment variables not passed (secret-looking)
    root: bool
    pids_cgroup: bool
    process_count: int | None  # this user's processes (None: root, or unknown)
    nproc: int | None  # the RLIMIT_NPROC set (None: not set)
    seccomp: bool  # the kernel-object filter installs here
    outputs: bool  # report and output files bound one by one (a cold run)
    results: bool  # a warm worker's results tmpfs
    own_namespaces: bool
    copied: tuple[str, ...] = ()  # folders seen through a copy
    network: bool = False  # --network: the run may reach the network


def plan(inputs: PlanInputs) -> SandboxPlan:
    """How to start the child under every layer available here (see `PlanInputs`).

    Deciding (what holds here) and wording (the report's layers) are separate steps:
    `describe_layers` turns the `Decisions` into text, and the warm worker reuses its parts."""
    python, probe_dir, scratch = inputs.python, inputs.probe_dir, inputs.scratch
    limits, project, network = inputs.limits, inputs.project, inputs.network
    ensure_supported()
    env, refused = child_environment(python, probe_dir, scratch, inputs.extra_env)
    caches = cache_paths(os.environ)
    for name, folder in cache_environment(caches).items():
        env.setdefault(name, str(folder))
    if not network:
        # Hugging Face libraries would retry the network for every file: say it is off.
        env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    found = bwrap_decision(inputs.mode)
    usable, detail = found.state == "works", found.detail
    cgroup = PidsCgroup.create(limits.max_processes)
    root = os.geteuid() == 0
    prefix: list[str] = []
    view = None
    if usable:
        prefix, view = bwrap_prefix(detail, inputs, env, caches)
    # RLIMIT_NPROC counts every process of the user, so the limit is "those + max_processes";
    # root is exempt from it, and where the count is unknown no limit is claimed (nor set).
    count = None if root else _user_process_count()
    kernel_filter = seccomp_filter()
    decisions = Decisions(
        bwrap=usable,
        bwrap_detail=detail,
        view=view,
        unshare_net=not usable and not network and can_unshare_net(),
        refused=tuple(refused),
        root=root,
        pids_cgroup=cgroup is not None,
        process_count=count,
        nproc=count + limits.max_processes if count is not None else None,
        seccomp=kernel_filter is not None,
        outputs=bool(inputs.outputs),
        results=inputs.results is not None,
        own_namespaces=inputs.own_namespaces,
        copied=tuple(str(s.original) for s in project.sources) if project else (),
        network=network,
    )
    warnings = [
        f"environment variable {name} not passed: it looks like a secret" for name in refused
    ]
    if not usable:
        warnings.append(f"sandbox degraded: {detail}")
    preexec = _preexec(
        limits,
        cgroup,
        decisions.unshare_net,
        pdeathsig=not usable,
        nproc=decisions.nproc,
        kernel=kernel_filter,
        loopback=inputs.loopback,
    )
    private = list(view.private) if view is not None else []
    return SandboxPlan(
        prefix, env, preexec, describe_layers(decisions, limits), cgroup, warnings, private
    )


def bwrap_decision(mode: str) -> Bwrap:
    """bubblewrap for a run in `mode` (auto|bwrap|none), tried now; `SandboxRefused` when it is
    installed but fails (whatever the mode but none), `ReproUsageError` when `bwrap` asks for
    it and it is absent. "absent" under auto is the degraded mode the report then names."""
    if mode == "none":
        return Bwrap("disabled", "disabled by request (--sandbox none)")
    found = bwrap_state()
    if found.state == "fails":
        raise SandboxRefused(refusal(found, mode))
    if mode == "bwrap" and found.state == "absent":
        raise ReproUsageError(f"--sandbox bwrap: bubblewrap is not usable here: {found.detail}")
    return found


# -- wording: the report's layers -----------------------------------------------------------------


def describe_layers(decisions: Decisions, limits: Limits) -> list[Layer]:
    """The report's isolation layers for what `plan` decided, in the report's order."""
    if decisions.view is not None:
        layers = _bwrap_layers(decisions, decisions.view, limits)
    else:
        layers = _unconfined_layers(decisions, limits)
    layers.append(Layer("process_group", True, "own session and process group, killed as a whole"))
    layers += limit_layers(limits)
    layers.append(_processes_layer(decisions, limits))
    secrets = f"; refused: {', '.join(decisions.refused)}" if decisions.refused else ""
    layers.append(Layer("environment", True, f"minimal environment, no secrets{secrets}"))
    layers.append(_seccomp_layer(decisions.seccomp))
    layers.append(_project_layer(decisions, confined=decisions.view is not None))
    return layers


def protections_line(layers: Iterable[Mapping[str, object]]) -> str | None:
    """One line naming the active and the missing protections, for the first line of the
    report and of the editor's notice; None when every layer held (the full set)."""
    layers = list(layers)
    missing = [str(layer.get("name")) for layer in layers if not layer.get("held")]
    if not missing:
        return None
    active = ", ".join(str(layer.get("name")) for layer in layers if layer.get("held"))
    bwrap = next((layer for layer in layers if layer.get("name") == "bubblewrap"), None)
    if bwrap is not None and not bwrap.get("held"):
        head = f"sandbox DEGRADED ({bwrap.get('detail')})"
    else:
        head = "sandbox: fewer protections than the full set"
    return f"{head}: active: {active or 'nothing'}; NOT active: {', '.join(missing)}"


def limit_layers(limits: Limits) -> list[Layer]:
    """The rlimits the child runs under (the warm worker lists its runs' own with this)."""
    memory_kind = "RLIMIT_DATA" if limits.use_data_limit else "RLIMIT_AS"
    if not sys.platform.startswith("linux"):
        memory_kind += " (best effort: this OS may ignore it)"
    return [
        Layer("memory", True, f"{memory_kind} {limits.memory_mb} MB"),
        Layer("cpu_time", True, f"RLIMIT_CPU {limits.cpu_s} s"),
        Layer("file_size", True, f"RLIMIT_FSIZE {limits.file_size_mb} MB, no core files"),
    ]


def _bwrap_layers(decisions: Decisions, view: View, limits: Limits) -> list[Layer]:
    writable = ", ".join(["the scratch folder", *view.private])
    caches = (
        "; model and dataset caches read-only: " + ", ".join(map(str, view.caches))
        if view.caches
        else ""
    )
    return [
        Layer("bubblewrap", True, decisions.bwrap_detail),
        _network_layer(decisions),
        Layer(
            "filesystem",
            True,
            f"read-only view of /; /run and /dev read-only; writable: {writable} (private "
            "to the run)"
            + (", and the report and output files" if decisions.outputs else "")
            + caches,
        ),
        _home_layer(view),
        _disk_layer(view, limits, decisions.outputs, decisions.results, decisions.own_namespaces),
        Layer(
            "probe_code",
            True,
            "the probe package is mounted read-only: a run cannot change it for later runs",
        ),
        Layer("pid_namespace", True, "own PID namespace: a kill ends every descendant"),
        Layer("capabilities", True, _capabilities_detail(view, decisions.own_namespaces)),
    ]


def _unconfined_layers(decisions: Decisions, limits: Limits) -> list[Layer]:
    return [
        Layer("bubblewrap", False, decisions.bwrap_detail),
        _network_layer(decisions),
        Layer(
            "filesystem",
            False,
            "NOT isolated: the code can write wherever this user can (cwd is the project)",
        ),
        Layer(
            "home",
            False,
            "NOT hidden: the code can read every file this user can (SSH keys, credentials)",
        ),
        Layer(
            "disk",
            False,
            f"NOT bounded: RLIMIT_FSIZE caps each file at {limits.file_size_mb} MB, not how "
            "many files the code writes"
            if limits.file_size_mb
            else "NOT bounded: each run's files are capped by RLIMIT_FSIZE, not their number",
        ),
        Layer(
            "probe_code",
            False,
            "NOT read-only (the code runs as the same user): each cold run uses its own "
            "copy and the warm worker loads all of it before its first run, so a run can "
            "only alter its own report",
        ),
        Layer(
            "pid_namespace",
            False,
            "NOT isolated: a descendant that calls setsid() can outlive a kill",
        ),
    ]


def _network_layer(decisions: Decisions) -> Layer:
    if decisions.network:
        return Layer("network", False, "allowed by request (--network): the run can reach it")
    if decisions.bwrap:
        return Layer("network", True, "no network: private network namespace (bwrap --unshare-net)")
    if decisions.unshare_net:
        return Layer("network", True, "private network namespace via unshare(2)")
    return Layer("network", False, "NOT isolated: unshare(CLONE_NEWNET) is not permitted here")


def _project_layer(decisions: Decisions, confined: bool) -> Layer:
    folders = ", ".join(decisions.copied)
    if not folders:
        return Layer("project", True, "the project is read-only (no folder seen through a copy)")
    if confined:
        return Layer(
            "project",
            True,
            f"{folders} seen through a copy: the run writes there as usual, nothing reaches "
            "your files; what it wrote is listed (--keep-outputs DIR copies it out)",
        )
    return Layer(
        "project",
        False,
        f"{folders} copied and the run started in the copy: relative writes stay there, but a "
        "write by absolute path (or through a left-out folder, linked) reaches your files",
    )


def _processes_layer(decisions: Decisions, limits: Limits) -> Layer:
    if decisions.pids_cgroup:
        return Layer("processes", True, f"pids cgroup, pids.max {limits.max_processes}")
    if decisions.nproc is not None:
        return Layer(
            "processes",
            True,
            f"RLIMIT_NPROC {decisions.nproc} (this user's {decisions.process_count} processes "
            f"+ {limits.max_processes})",
        )
    if decisions.root:
        return Layer(
            "processes",
            False,
            "NOT limited: root is exempt from RLIMIT_NPROC and no pids cgroup is available",
        )
    return Layer("processes", False, "NOT limited: this user's processes could not be counted")


def _seccomp_layer(filtered: bool) -> Layer:
    if not filtered:
        return Layer(
            "kernel_objects",
            False,
            "NOT filtered: no seccomp filter for this system; keyrings and per-user kernel "
            "objects (inotify) are shared with you",
        )
    return Layer(
        "kernel_objects",
        True,
        "new session keyring; seccomp refuses " + ", ".join(seccomp.REFUSED),
    )


@functools.lru_cache(maxsize=1)
def seccomp_filter() -> seccomp.Filter | None:
    """This machine's filter, if a throw-away child shows that it installs and refuses keyctl."""
    kernel_filter = seccomp.for_this_machine()
    libc = _libc()
    if kernel_filter is None or libc is None:
        return None
    code = (
        "import ctypes,sys;l=ctypes.CDLL(None,use_errno=True);"
        f"r=l.syscall({kernel_filter.keyctl},0,-3,0);"
        "sys.exit(0 if r==-1 and ctypes.get_errno()==1 else 1)"
    )

    def install() -> None:
        kernel_filter.new_session_keyring(libc)
        if not kernel_filter.install(libc):
            os._exit(3)

    try:
        done = subprocess.run(
            [sys.executable, "-S", "-c", code], timeout=10, check=False, preexec_fn=install
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return kernel_filter if done.returncode == 0 else None


def _capabilities_detail(view: View, own_namespaces: bool) -> str:
    if own_namespaces:
        return (
            "all capabilities dropped, also those of each run's own user namespace (left "
            "unmapped, so no namespace made inside it can map a user either)"
        )
    if view.no_userns:
        return "all capabilities dropped; no user namespace can be made inside"
    return (
        "all capabilities dropped; user namespaces can still be made inside (this bubblewrap "
        "has no --disable-userns: 0.8 or later needed)"
    )


def _home_layer(view: View) -> Layer:
    if not view.homes:
        return Layer("home", False, "NOT hidden: no home folder of this user was found")
    homes = ", ".join(map(str, view.homes))
    if view.exposed:
        exposed = ", ".join(map(str, view.exposed))
        return Layer(
            "home",
            False,
            f"NOT hidden: {exposed} is itself a folder the run needs (the project or the "
            "interpreter): move the project out of the home folder's top level",
        )
    rebound = "; bound back read-only: " + ", ".join(map(str, view.rebound)) if view.rebound else ""
    return Layer("home", True, f"{homes} hidden (empty, read-only){rebound}")


def _disk_layer(
    view: View, limits: Limits, outputs: bool, results: bool, own_namespaces: bool
) -> Layer:
    file_places = ["the scratch folder", *(p for p in view.private if p != "/dev/shm")]
    places = ", ".join(file_places)
    shm = (
        f"/dev/shm: a private tmpfs of {view.shm_mb} MB, {_shm_source(limits)} (shared "
        "memory: DataLoader workers pass their batches through it)"
        if view.shm_mb
        else "/dev/shm: a private tmpfs without a size limit"
    )
    files = ""
    if outputs:
        files = f"; report and output files on disk: RLIMIT_FSIZE ({limits.file_size_mb} MB) each"
    if results and view.sized and limits.tmpfs_mb > 0:
        files = f"; reports and output: a private tmpfs of {2 * limits.tmpfs_mb} MB"
    if not view.sized or limits.tmpfs_mb <= 0 or not view.shm_mb:
        # /dev/shm is sized whenever this bubblewrap can size a tmpfs at all.
        why = (
            "no file-size limit was set"
            if view.shm_mb
            else "this bubblewrap has no --size: 0.7 or later needed"
        )
        return Layer(
            "disk",
            False,
            f"NOT bounded: {places} are tmpfs without a size limit ({why}); {shm}" + files,
        )
    sizes = f"{places}: private tmpfs of {limits.tmpfs_mb} MB each (the file-size limit); {shm}"
    if not (view.no_userns or own_namespaces):
        return Layer(
            "disk",
            False,
            f"NOT bounded: {sizes}; but the code can make a user namespace and mount a tmpfs of "
            "its own (this bubblewrap has no --disable-userns: 0.8 or later needed)" + files,
        )
    total = limits.tmpfs_mb * len(file_places) + view.shm_mb
    return Layer(
        "disk",
        True,
        f"{sizes}; {total} MB in all, in memory, gone with the sandbox; /dev and /run read-only"
        + files,
    )


def _shm_source(limits: Limits) -> str:
    if limits.shm_mb or limits.memory_mb:
        return "the memory limit"
    return "the default memory limit whatever a run's own"


def bwrap_prefix(
    bwrap: str, inputs: PlanInputs, env: dict[str, str], caches: tuple[Path, ...] = ()
) -> tuple[list[str], View]:
    """The bubblewrap command line, and what it hides and exposes.

    Mount order matters: a mount hides whatever an earlier one put under it. So the hidden
    folders (empty tmpfs), the read-only bind-backs, the scratch tmpfs and the output files are
    sorted outermost first, and the read-only remounts of the empty folders come last."""
    python, probe_dir, scratch, cwd = inputs.python, inputs.probe_dir, inputs.scratch, inputs.cwd
    project, results, network = inputs.project, inputs.results, inputs.network
    tmpfs_mb, shm_mb = inputs.limits.tmpfs_mb, inputs.limits.dev_shm_mb
    sized = tmpfs_mb > 0 and bwrap_sizes_tmpfs()
    size = ["--size", str(tmpfs_mb << 20)] if sized else []
    shared = ["--perms", "1777", *size] if sized else []
    shm_mb = shm_mb if shm_mb > 0 and bwrap_sizes_tmpfs() else 0
    shm = ["--perms", "1777", "--size", str(shm_mb << 20)] if shm_mb else []
    no_userns = not inputs.own_namespaces and bwrap_disables_userns()
    args = [bwrap, *_BWRAP_BASE]
    if network:
        args.append("--share-net")
    if no_userns:
        args += ["--unshare-user", "--disable-userns"]
    args += ["--ro-bind", "/", "/", "--dev", "/dev"]
    for device in [*sorted(Path("/dev").glob("nvidia*")), Path("/dev/dri")]:
        if device.exists():
            args += ["--dev-bind", str(device), str(device)]
    args += [*shm, "--tmpfs", "/dev/shm", "--remount-ro", "/dev", "--proc", "/proc"]
    homes = home_dirs()
    private = [d for d in PRIVATE_DIRS if os.path.isdir(d) and not os.path.islink(d)]
    empty = [d for d in EMPTY_DIRS if os.path.isdir(d) and not os.path.islink(d)]
    hidden = [*map(Path, private), *map(Path, empty), *homes]
    # What the project view covers is mounted from its copy, not bound back read-only.
    covered = project.covers if project is not None else (lambda _path: False)
    needed = [
        *interpreter_paths(python),
        *site_paths(python),
        *environment_paths(env),
        *(p for p in (cwd, *inputs.read_paths) if not covered(Path(os.path.abspath(p)))),
    ]
    sources = {s.original for s in project.sources} if project is not None else set()
    kept = [p for p in keep_paths(needed, hidden) if p not in sources]
    mounts: list[tuple[Path, int, list[str]]] = []
    for folder in private:
        mounts.append((Path(folder), 0, [*shared, "--tmpfs", folder]))
    for folder in [*map(Path, empty), *homes]:
        mounts.append((folder, 0, ["--tmpfs", str(folder)]))
    for path in kept:
        mounts.append((path, 1, ["--ro-bind", str(path), str(path)]))
    mounts.append((probe_dir, 1, ["--ro-bind", str(probe_dir), str(probe_dir)]))
    own = ["--perms", "0700", *size] if sized else []
    mounts.append((scratch, 2, [*own, "--tmpfs", str(scratch)]))
    if results is not None:  # a report and an output file of up to the file-size limit each
        twice = ["--perms", "0700", "--size", str(2 * tmpfs_mb << 20)] if sized else []
        mounts.append((results, 2, [*twice, "--tmpfs", str(results)]))
    for file in inputs.outputs:
        mounts.append((file, 3, ["--bind", str(file), str(file)]))
    if project is not None:
        mounts += project.bwrap_mounts()
    for cache in caches:
        mounts.append((cache, 1, ["--ro-bind", str(cache), str(cache)]))
        for name in CACHE_SECRETS:
            secret = cache / name
            if secret.exists() and not secret.is_symlink():
                # An empty file to read (a refused read would crash the library asking).
                mounts.append((secret, 4, ["--dev-bind", "/dev/null", str(secret)]))
    for _path, _order, mount in sorted(mounts, key=lambda m: (len(m[0].parts), m[1], str(m[0]))):
        args += mount
    for folder in [*map(Path, empty), *homes]:
        args += ["--remount-ro", str(folder)]
    args += ["--chdir", str(cwd), "--"]
    exposed = tuple(home for home in homes if home in kept)
    rebound = tuple(p for p in kept if any(_under(p, h) for h in homes) and p not in homes)
    view = View(
        tuple(homes),
        exposed,
        rebound,
        (*private, "/dev/shm"),
        sized,
        no_userns,
        shm_mb,
        tuple(caches),
        network,
    )
    return args, view


def cache_paths(environ: Mapping[str, str]) -> tuple[Path, ...]:
    """The model and dataset caches that exist here: the folders named by TORCH_HOME, HF_HOME
    and the other Hugging Face variables, else their defaults under XDG_CACHE_HOME or
    ~/.cache. Never a home folder itself, `/`, or a system folder."""
    home = environ.get("HOME") or _password_home() or ""
    xdg = environ.get("XDG_CACHE_HOME") or (os.path.join(home, ".cache") if home else "")
    candidates = []
    for name, default in CACHE_FOLDERS:
        value = environ.get(name) or (os.path.join(xdg, default) if xdg else "")
        candidates.append(value)
    candidates += [environ.get(name, "") for name in CACHE_EXTRA]
    homes = set(home_dirs())
    found: list[Path] = []
    for value in candidates:
        if not value or not os.path.isabs(value) or not os.path.isdir(value):
            continue
        path = Path(os.path.realpath(value))
        if path in homes or path == Path("/") or str(path) in SYSTEM_DIRS:
            continue
        if path not in found:
            found.append(path)
    return tuple(found)


def cache_environment(caches: tuple[Path, ...]) -> dict[str, str]:
    """TORCH_HOME and HF_HOME for the child, pointing at the real caches (its HOME is not)."""
    env: dict[str, str] = {}
    for path in caches:
        if path.name == "torch" or os.environ.get("TORCH_HOME") == str(path):
            env.setdefault("TORCH_HOME", str(path))
        elif path.name == "huggingface" or os.environ.get("HF_HOME") == str(path):
            env.setdefault("HF_HOME", str(path))
    return env


def home_dirs() -> list[Path]:
    """This user's home folders, hidden inside bubblewrap: `$HOME`, the password database's,
    and as root `/root` and `/home` (root reads every user's home). Never `/` or a folder that
    holds a system folder."""
    candidates = [os.environ.get("HOME"), _password_home()]
    if os.geteuid() == 0:
        candidates += ["/root", "/home"]
    found: set[Path] = set()
    for candidate in candidates:
        if not candidate or not os.path.isabs(candidate):
            continue
        real = Path(os.path.realpath(candidate))
        if not real.is_dir() or any(_under(Path(system), real) for system in SYSTEM_DIRS):
            continue
        found.add(real)
    return _outermost(found)


def _password_home() -> str | None:
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_dir
    except (ImportError, KeyError):
        return None


def interpreter_paths(python: Path) -> list[Path]:
    """Folders the interpreter needs: its venv (as invoked and resolved) and, following each
    `pyvenv.cfg` `home` (a venv made from another venv's python, or a wrapper script's), the
    installations behind it, such as a pyenv or conda Python inside the home folder."""
    paths = [python.parent.parent, Path(os.path.realpath(python)).parent.parent]
    pending = list(paths)
    seen: set[Path] = set()
    while pending and len(seen) < 8:
        prefix = pending.pop()
        if prefix in seen:
            continue
        seen.add(prefix)
        try:
            lines = (prefix / "pyvenv.cfg").read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        for line in lines:
            key, _, value = line.partition("=")
            if key.strip() != "home" or not os.path.isabs(value.strip()):
                continue
            home = Path(value.strip())
            found = [home.parent, Path(os.path.realpath(home)).parent]
            for name in ("python3", "python"):
                if (home / name).exists():
                    found.append(Path(os.path.realpath(home / name)).parent.parent)
            paths += found
            pending += found
    return list(dict.fromkeys(paths))


def site_paths(python: Path) -> list[Path]:
    """Folders that `.pth` files in the interpreter's site-packages add to `sys.path` (editable
    installs, often under the home), and the package folders (or module files) of setuptools'
    editable finders that a `.pth` imports. Read as text, never executed; other `import` lines
    are skipped."""
    found: list[Path] = []
    for prefix in dict.fromkeys(interpreter_paths(python)):
        try:
            sites = sorted(prefix.glob("lib*/python*/site-packages"))
        except OSError:
            continue
        for site in sites:
            try:
                pth_files = sorted(site.glob("*.pth"))[:PTH_FILES]
            except OSError:
                continue
            for pth in pth_files:
                text = _read_head(pth, PTH_LIMIT).decode("utf-8", "replace")
                for line in text.splitlines():
                    line = line.strip()
                    if line.startswith(("import ", "import\t")):
                        finder = EDITABLE_FINDER.match(line)
                        if finder:
                            found += editable_finder_paths(site / f"{finder.group(1)}.py")
                        continue
                    if not line or line.startswith("#"):
                        continue
                    path = Path(line) if os.path.isabs(line) else site / line
                    if os.path.isdir(path):  # False, not an error, for a name too long
                        found.append(path)
    return found


def editable_finder_paths(finder: Path) -> list[Path]:
    """The package folders (and single-module files) a setuptools editable finder maps to:
    the values of its `MAPPING` and `NAMESPACES` literals, parsed with `ast`, never imported.
    Anything malformed, oversized or not an absolute path that exists is ignored."""
    data = _read_head(finder, FINDER_LIMIT + 1)
    if len(data) > FINDER_LIMIT:
        return []  # cut short, it would parse as something else or not at all
    try:
        tree = ast.parse(data.decode("utf-8", "replace"))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    values: list[object] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if not isinstance(target, ast.Name) or target.id not in ("MAPPING", "NAMESPACES"):
            continue
        try:
            literal = ast.literal_eval(value)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            continue
        if not isinstance(literal, dict):
            continue
        for item in literal.values():  # MAPPING: a path; NAMESPACES: a list of paths
            values += item if isinstance(item, list) else [item]
    found: list[Path] = []
    for value in values[:FINDER_PATHS]:
        if not isinstance(value, str) or not os.path.isabs(value):
            continue
        if os.path.isdir(value):
            found.append(Path(value))
            continue
        # A top-level module is mapped without its suffix (setuptools tries each in turn).
        found += [Path(value + s) for s in all_suffixes() if os.path.isfile(value + s)]
    return found


def _read_head(path: Path, limit: int) -> bytes:
    """At most `limit` bytes of `path`; nothing when it cannot be read."""
    try:
        with open(path, "rb") as handle:
            return handle.read(limit)
    except OSError:
        return b""


def environment_paths(env: dict[str, str]) -> list[Path]:
    """Folders the child's environment points at (CUDA, conda, torch caches, libraries)."""
    values = [env[name] for name in PATH_VARIABLES if env.get(name)]
    values += [part for part in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if part]
    return [Path(value) for value in values if os.path.isabs(value) and os.path.isdir(value)]


def keep_paths(paths: Iterable[Path], hidden: Iterable[Path] | None = None) -> list[Path]:
    """The paths under a hidden folder that must be bound back, outermost only, sorted.
    `hidden` defaults to every folder the sandbox hides here (including the homes)."""
    folders = list(hidden) if hidden is not None else [*map(Path, HIDDEN_DIRS), *home_dirs()]
    wanted = set()
    for path in paths:
        real = Path(os.path.realpath(path))
        for candidate in {Path(os.path.abspath(path)), real}:
            if any(_under(candidate, h) for h in folders) and candidate.exists():
                wanted.add(candidate)
    kept: list[Path] = []
    for path in sorted(wanted, key=lambda p: (len(p.parts), str(p))):
        # Covered by an outer bind-back, unless a hidden folder lies between the two (a home
        # inside the project): that one is hidden again on top, so bind this one back too.
        between = (h for h in folders for k in kept if h != k and _under(h, k))
        if not any(_under(path, k) for k in kept) or any(_under(path, h) for h in between):
            kept.append(path)
    return sorted(kept)


def _outermost(paths: Iterable[Path]) -> list[Path]:
    kept: list[Path] = []
    for path in sorted(paths, key=lambda p: (len(p.parts), str(p))):
        if not any(_under(path, k) for k in kept):
            kept.append(path)
    return kept


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
def can_unshare_net() -> bool:
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


def _loopback_up() -> None:
    """Bring up `lo` in a new network namespace (it starts down): the interface's flags with
    IFF_UP set, through the SIOCGIFFLAGS/SIOCSIFFLAGS ioctls. Inside the new user namespace
    this process holds the capability that needs; failing that, the run has no loopback."""
    import fcntl
    import socket
    import struct

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(sock.fileno(), siocgifflags, request))[1]
        fcntl.ioctl(sock.fileno(), siocsifflags, struct.pack("16sh", b"lo", flags | iff_up))


def _user_process_count() -> int | None:
    """This user's processes as RLIMIT_NPROC counts them (threads too, on Linux), or None.

    Linux: from /proc. Elsewhere (macOS): from `ps`, run here, before the fork."""
    uid = os.getuid()
    if sys.platform.startswith("linux"):
        count = 0
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.stat(f"/proc/{entry}").st_uid == uid:
                        count += len(os.listdir(f"/proc/{entry}/task"))
                except OSError:
                    continue
        return count
    ps = "/bin/ps" if os.path.exists("/bin/ps") else shutil.which("ps")
    if ps is None:
        return None
    try:
        done = subprocess.run(
            [ps, "-A", "-o", "uid="], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return sum(1 for word in done.stdout.split() if word == str(uid))


def _preexec(
    limits: Limits,
    cgroup: PidsCgroup | None,
    unshare_net: bool,
    pdeathsig: bool,
    nproc: int | None,
    kernel: seccomp.Filter | None = None,
    loopback: bool = False,
) -> Callable[[], None]:
    """Runs in the child between fork and exec: only async-signal-tolerant, prepared work."""
    assert resource is not None  # plan() checked the platform
    libc = _libc() if (unshare_net or pdeathsig or kernel is not None) else None
    memory = limits.memory_mb << 20
    size = limits.file_size_mb << 20
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
            if libc.unshare(flags) == 0 and loopback:
                _loopback_up()
        if libc is not None and kernel is not None:
            # Last: nothing above needs the refused calls, and everything after inherits it.
            kernel.new_session_keyring(libc)
            if not kernel.install(libc):
                os._exit(126)  # the plan promised the filter: never run without it

    return apply
