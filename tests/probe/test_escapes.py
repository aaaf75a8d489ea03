"""The sandbox escape suite: hostile training scripts that try to get out, and what they get.

test_sandbox.py and test_limits.py already cover the network, writes outside the scratch folder,
a cold fork bomb, secret names in the environment, hangs, memory and output floods. This adds
symlinks out of the scratch folder, /proc tricks, the user's home seen through the environment,
secret values (cold and warm), ptrace, a `setsid` daemon, a warm fork bomb, disk fill, a stderr
and descriptor flood, signals to the parent and to every process, and a language-server-like
session surviving 100 failing repros with no leftover processes, descriptors or memory growth.

Escapes that succeed today are tested in tests/robustness/test_found_bugs.py, not here. Every
attack that could hurt the machine if it got out (kill(-1), ptrace) runs only with
`sandbox="bwrap"`, which refuses to run at all rather than run without bubblewrap.

Every cold attack also runs as a distributed repro (`nproc=2`: torchrun and two ranks, each
running the hostile script, all in the one sandbox), so that the layers and limits hold for
every rank and nothing a rank starts outlives the run. The scripts name what they create after
their rank, since the ranks share the scratch folder as they would share a machine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.probe import cases
from tests.probe.support import bwrap_usable, layer, leftovers, run_as
from torchls.probe import ReproOptions, ReproSession
from torchls.probe.prepare import prepare

needs_bwrap = pytest.mark.skipif(not bwrap_usable(), reason="bubblewrap is not usable here")

SETTLE_S = 10.0  # bounded wait for killed processes to disappear from /proc
# One process as usual, and the same attack from every rank of a distributed repro.
RANKS = pytest.mark.parametrize("nproc", [None, 2], ids=["one-process", "two-ranks"])


def output_of(report) -> str:
    output = report.data["output"]
    return output["head"] + output["tail"]


def wait_until_gone(marker: str) -> list[int]:
    """Live processes whose command line contains `marker`, after a bounded wait for them to
    exit (a SIGKILLed process takes a moment to leave /proc)."""
    end = time.monotonic() + SETTLE_S
    while (found := leftovers(marker)) and time.monotonic() < end:
        time.sleep(0.05)
    return found


@pytest.fixture
def outside(tmp_path: Path):
    """A folder on the host outside any path the sandbox makes writable: in the real home
    (visible, read-only inside bubblewrap), removed afterwards."""
    folder = Path.home() / f".torchls-escape-{uuid.uuid4().hex}"
    folder.mkdir()
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# -- symlinks -----------------------------------------------------------------------------------

SYMLINKS = """\
import os
import sys

scratch = os.environ["HOME"]
rank = os.environ.get("RANK", "0")
for index, target in enumerate(sys.argv[1:]):
    link = os.path.join(scratch, f"link{rank}-{index}")
    os.symlink(target, link)
    try:
        if os.path.isdir(link):
            with open(os.path.join(link, "planted.txt"), "w") as handle:
                handle.write("escaped")
        else:
            with open(link, "w") as handle:
                handle.write("escaped")
        print("WROTE", target)
    except OSError as error:
        print("REFUSED", target, error.errno)
# Leave the links behind: removing the scratch folder must not follow them.
print("SCRATCH", scratch)
"""


@needs_bwrap
@RANKS
def test_symlinks_out_of_the_scratch_folder_reach_nothing(repro, project, outside, tmp_path, nproc):
    target_file = outside / "victim.txt"
    target_file.write_text("original")
    keep = outside / "keep.txt"
    keep.write_text("keep")
    host_tmp = tmp_path / "host-tmp.txt"
    host_tmp.write_text("original")
    # A project file other than the script: with two ranks, one would rewrite it under the
    # other as it starts.
    notes = project / "notes.txt"
    notes.write_text("original")
    targets = [target_file, outside, notes, host_tmp, Path("/etc/hostname")]
    report, path = repro(SYMLINKS, argv=tuple(str(t) for t in targets), nproc=nproc)
    assert report.status == "ok", output_of(report)
    output = output_of(report)
    for visible in (target_file, outside, Path("/etc/hostname")):
        assert f"REFUSED {visible} " in output, output  # read-only inside the sandbox
    # The project is seen through a copy: the link's write lands there, listed, never real.
    assert f"WROTE {notes}" in output
    written = [item["path"] for item in report.data["written"]["files"]]
    assert str(notes) in written and notes.read_text() == "original"
    # The host's /tmp is out of sight: that write lands on the sandbox's own empty /tmp.
    assert target_file.read_text() == "original"
    assert keep.read_text() == "keep" and not (outside / "planted.txt").exists()
    assert host_tmp.read_text() == "original"
    assert path.read_text() == SYMLINKS
    scratch = Path(output.split("SCRATCH ", 1)[1].split()[0])
    assert not scratch.exists(), "the scratch folder was not removed"
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt", "victim.txt"]


# -- /proc --------------------------------------------------------------------------------------

PROC = """\
import os
import sys

secret, host_file, server_pid = sys.argv[1], sys.argv[2], sys.argv[3]
found = []
pids = [p for p in os.listdir("/proc") if p.isdigit()]
print("PIDS", len(pids))
for pid in [*pids, "self", "1", server_pid]:
    for name in ("environ", "cmdline"):
        try:
            with open(f"/proc/{pid}/{name}", "rb") as handle:
                if secret.encode() in handle.read():
                    found.append(f"{pid}/{name}")
        except OSError:
            pass
    for root in (f"/proc/{pid}/root", f"/proc/{pid}/cwd/.."):
        try:
            with open(root + host_file) as handle:
                found.append("READ " + root + host_file + " " + handle.read())
        except OSError:
            pass
        try:  # lands on the sandbox's own /tmp, if anywhere: the test checks the host
            with open(root + host_file + ".planted", "w") as handle:
                handle.write("escaped")
        except OSError:
            pass
print("FOUND", found)
"""


@needs_bwrap
@RANKS
def test_proc_tricks_see_no_secret_and_no_host_file(repro, monkeypatch, tmp_path, nproc):
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("TORCHLS_TEST_CANARY", secret)
    host_file = tmp_path / "host-only.txt"  # under /tmp: hidden behind a tmpfs in the sandbox
    host_file.write_text(secret)
    report, _ = repro(PROC, argv=(secret, str(host_file), str(os.getpid())), nproc=nproc)
    output = output_of(report)
    assert report.status == "ok", output
    assert "FOUND []" in output, output
    assert secret not in json.dumps(report.data)
    assert not Path(str(host_file) + ".planted").exists()
    assert layer(report, "pid_namespace")["held"]
    # Only the sandbox's own processes are visible (bubblewrap's init and the probe; with
    # ranks, torchrun and one probe per rank).
    assert int(output.split("PIDS ", 1)[1].split()[0]) <= 4 + (nproc or 0)


# -- home and environment -----------------------------------------------------------------------

HOME_VIA_ENV = """\
import os

for name in ("~/.ssh/id_rsa", "~/.aws/credentials", "~/.netrc"):
    path = os.path.expanduser(name)
    try:
        with open(path) as handle:
            print("READ", path, handle.read())
    except OSError as error:
        print("MISSING", path, error.errno)
print("HOME", os.environ.get("HOME"))
"""


@RANKS
def test_home_in_the_environment_is_the_scratch_folder(repro, monkeypatch, tmp_path, nproc):
    """Code that looks for credentials through `~` finds an empty scratch folder. (Absolute
    paths into the real home are another matter: see test_found_bugs.py.)"""
    fake_home = tmp_path / "home"
    (fake_home / ".ssh").mkdir(parents=True)
    (fake_home / ".ssh" / "id_rsa").write_text("-----BEGIN FAKE KEY-----")
    (fake_home / ".aws").mkdir()
    (fake_home / ".aws" / "credentials").write_text("aws_secret_access_key = FAKE")
    monkeypatch.setenv("HOME", str(fake_home))
    report, _ = repro(HOME_VIA_ENV, nproc=nproc)
    output = output_of(report)
    assert report.status == "ok", output
    assert "READ" not in output and "FAKE" not in output
    assert f"HOME {fake_home}" not in output


ENVIRONMENT = """\
import os

print("ENV", sorted(os.environ.items()))
with open("/proc/self/environ", "rb") as handle:
    print("PROC", handle.read())
"""


@pytest.mark.parametrize("runner,nproc", [("cold", None), ("warm", None), ("cold", 2)])
def test_secret_values_are_invisible_cold_and_warm(project, monkeypatch, runner, nproc):
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    for name in (
        "AWS_SECRET_ACCESS_KEY",
        "GITHUB_TOKEN",
        "HF_TOKEN",
        "MY_PASSWORD",
        "SSH_AUTH_SOCK",
    ):
        monkeypatch.setenv(name, secret)
    path = project / "train.py"
    path.write_text(ENVIRONMENT)
    options = ReproOptions(
        python=sys.executable, timeout_s=30.0, pass_env=("HF_TOKEN",), nproc=nproc
    )
    report = run_as(runner, path, options)
    assert report.data["timing"]["runner"] == runner
    assert report.status == "ok", output_of(report)
    assert secret not in json.dumps(report.data)
    assert "ENV" in output_of(report)


# -- ptrace -------------------------------------------------------------------------------------

PTRACE = """\
import ctypes
import json
import os
import sys

libc = ctypes.CDLL(None, use_errno=True)
PTRACE_ATTACH, PTRACE_SEIZE, PTRACE_DETACH = 16, 0x4206, 17
WALL = 0x40000000


def attach(pid, request):
    if libc.ptrace(request, pid, None, None) != 0:
        return ctypes.get_errno()
    if request == PTRACE_ATTACH:  # the tracee stops: wait for it, then let it go
        os.waitpid(pid, WALL)
        libc.ptrace(PTRACE_DETACH, pid, None, None)
    return True


results = {}
server = int(sys.argv[1])
results["server-attach"] = attach(server, PTRACE_ATTACH)
results["server-seize"] = attach(server, PTRACE_SEIZE)
results["parent-seize"] = attach(os.getppid(), PTRACE_SEIZE)  # inside the sandbox: harmless
for label, pid in (("server", server), ("parent", os.getppid())):
    try:
        with open(f"/proc/{pid}/mem", "r+b"):
            results[f"{label}-mem"] = "OPENED"
    except OSError as error:
        results[f"{label}-mem"] = error.errno
print("PTRACE", json.dumps(results))
"""


@needs_bwrap
@RANKS
def test_ptrace_cannot_reach_the_server(repro, nproc):
    report, _ = repro(PTRACE, argv=(str(os.getpid()),), sandbox="bwrap", nproc=nproc)
    output = output_of(report)
    assert report.status == "ok", output
    results = json.loads(output.split("PTRACE ", 1)[1].splitlines()[0])
    assert results["server-attach"] is not True, results
    assert results["server-seize"] is not True, results
    assert results["server-mem"] != "OPENED", results
    with open("/proc/self/status", encoding="utf-8") as handle:
        tracer = next(line for line in handle if line.startswith("TracerPid:"))
    assert tracer.split()[1] == "0"


# -- processes that try to stay -----------------------------------------------------------------

DAEMON = """\
import os
import subprocess
import sys

marker = sys.argv[1]
# A plain detached child in its own session ...
subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(600)", marker],
    start_new_session=True,
    stdin=subprocess.DEVNULL,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
)
# ... and a classic double-fork daemon that ignores SIGHUP and SIGTERM.
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(
            sys.executable,
            [
                sys.executable,
                "-c",
                "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "signal.signal(signal.SIGHUP, signal.SIG_IGN); time.sleep(600)",
                marker,
            ],
        )
    os._exit(0)
os.wait()
print("DETACHED")
"""


@pytest.mark.parametrize("runner,nproc", [("cold", None), ("warm", None), ("cold", 2)])
def test_setsid_daemon_does_not_outlive_the_run(repro, warm_repro, runner, nproc):
    marker = f"torchls-daemon-{uuid.uuid4().hex}"
    run = repro if runner == "cold" else warm_repro
    extra = {"nproc": nproc} if nproc else {}
    report, _ = run(DAEMON, argv=(marker,), **extra)
    assert "DETACHED" in output_of(report), output_of(report)
    assert wait_until_gone(marker) == []


@RANKS
def test_setsid_daemon_without_bubblewrap_is_caught_by_the_pids_cgroup(repro, nproc):
    marker = f"torchls-daemon-{uuid.uuid4().hex}"
    report, _ = repro(DAEMON, argv=(marker,), sandbox="none", nproc=nproc)
    if (
        not layer(report, "processes")["held"]
        or "cgroup" not in layer(report, "processes")["detail"]
    ):
        wait_until_gone(marker)
        for pid in leftovers(marker):  # documented: without a PID namespace or cgroup
            os.kill(pid, signal.SIGKILL)
        pytest.skip("no pids cgroup here: a setsid daemon outlives a run without bubblewrap")
    assert "DETACHED" in output_of(report)
    assert wait_until_gone(marker) == []


def test_fork_bomb_in_a_warm_run_is_contained_and_the_worker_survives(warm_repro):
    """The bomb's processes are forks of the worker (same command line): once the run is over,
    only the processes that were there before remain, and the same worker serves the next run."""
    after, _ = warm_repro(cases.CLEAN, name="before_fork_bomb.py")  # the worker is up
    before = set(leftovers("torchls_probe.worker"))
    report, _ = warm_repro(cases.FORK_BOMB, timeout_s=4.0)
    assert report.status == "timeout"
    end = time.monotonic() + SETTLE_S
    while set(leftovers("torchls_probe.worker")) - before and time.monotonic() < end:
        time.sleep(0.05)
    # A subset: workers of other sessions on this machine may end meanwhile; none may appear.
    assert set(leftovers("torchls_probe.worker")) <= before
    after, _ = warm_repro(cases.CLEAN, name="after_fork_bomb.py")
    assert after.status == "ok"


# -- disk and output ----------------------------------------------------------------------------

DISK_FILL = """\
import os

chunk = b"x" * (1 << 20)
scratch = os.environ["HOME"]
written = 0
try:
    with open(os.path.join(scratch, "big.bin"), "wb") as handle:
        for _ in range(64):
            handle.write(chunk)
            written += len(chunk)
except OSError as error:
    print("STOPPED", error.errno, written)
print("SCRATCH", scratch)
"""


@RANKS
def test_a_file_cannot_outgrow_the_file_size_limit_and_nothing_is_left(repro, nproc):
    report, _ = repro(DISK_FILL, file_size_mb=4, nproc=nproc)
    output = output_of(report)
    # EFBIG; two ranks filling one 4 MB tmpfs may see it full first (ENOSPC).
    errors = ("27",) if nproc is None else ("27", "28")
    stopped = [e for e in errors if f"STOPPED {e} " in output]
    assert stopped, output
    written = int(output.split(f"STOPPED {stopped[0]} ", 1)[1].split()[0])
    assert written <= 4 << 20
    scratch = Path(output.split("SCRATCH ", 1)[1].split()[0])
    assert not scratch.exists()


FLOOD_EVERYTHING = """\
import os
import subprocess
import sys

# A grandchild that inherits the descriptors floods them from outside the probe's Python.
subprocess.Popen(
    [sys.executable, "-c", "import os\\nwhile True:\\n    os.write(2, b'e' * 65536)"],
)
junk = b'{"event": "progress", "stage": "step", "message": "' + b"x" * 200 + b'"}\\n'
for fd in sorted(int(name) for name in os.listdir("/proc/self/fd")):
    for _ in range(2000):
        try:
            os.write(fd, junk)
            os.write(fd, b"z" * 70000)
        except OSError:
            break
while True:
    sys.stderr.write("stderr flood " * 100 + "\\n")
"""


@RANKS
def test_flood_on_every_descriptor_and_from_a_grandchild_is_bounded(repro, nproc):
    cap = 64 << 10
    report, _ = repro(
        FLOOD_EVERYTHING, output_cap_bytes=cap, file_size_mb=4, timeout_s=20.0, nproc=nproc
    )
    assert report.data["stopped_by"] in ("output", "timeout"), report.data["stopped_by"]
    output = report.data["output"]
    assert output["bytes"] <= 4 << 20
    assert len(output["head"]) + len(output["tail"]) <= 8192
    assert len(json.dumps(report.data)) < 1 << 20
    assert wait_until_gone("os.write(2, b'e' * 65536)") == []


# -- signals ------------------------------------------------------------------------------------

SIGNALS = """\
import os
import signal
import sys

for pid in (int(sys.argv[1]), int(sys.argv[2]), os.getppid()):
    try:
        os.kill(pid, signal.SIGKILL)
        print("KILLED", pid)
    except OSError as error:
        print("REFUSED", pid, error.errno)
try:
    os.kill(-1, signal.SIGKILL)  # every process this user may signal
except OSError as error:
    print("REFUSED -1", error.errno)
"""

# The "server": a separate interpreter running the repro, so that an escape kills it and not
# the test run. It prints the report's status when it survives.
DRIVER = """\
import json
import sys

from torchls.probe import ReproOptions, ReproSession
from torchls.probe.prepare import prepare

path, warm, canary = sys.argv[1], sys.argv[2] == "warm", sys.argv[3]
nproc = int(sys.argv[4]) if sys.argv[4] != "none" else None
import os

options = ReproOptions(python=sys.executable, timeout_s=30.0, sandbox="bwrap",
                       argv=(str(os.getpid()), canary), nproc=nproc)
session = ReproSession(warm=warm)
if warm:
    session.prewarm_prepared(prepare(path, options), wait=True)
report = session.run(path, options)
session.close()
print("DRIVER", json.dumps({"status": report.status, "runner": report.data["timing"]["runner"]}))
"""


@needs_bwrap
@pytest.mark.parametrize("runner,nproc", [("cold", None), ("warm", None), ("cold", 2)])
def test_signals_to_the_parent_and_to_everything_stay_inside(project, runner, nproc):
    path = project / "train.py"
    path.write_text(SIGNALS)
    canary = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        driver = subprocess.run(
            [sys.executable, "-c", DRIVER, str(path), runner, str(canary.pid), str(nproc).lower()],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=Path(__file__).resolve().parents[2],
            check=False,
        )
        assert driver.returncode == 0, driver.stderr[-3000:]
        line = next(x for x in driver.stdout.splitlines() if x.startswith("DRIVER "))
        result = json.loads(line.split(" ", 1)[1])
        assert result["runner"] == runner
        assert canary.poll() is None, "a process outside the sandbox was killed"
    finally:
        canary.kill()
        canary.wait()


# -- a server's worth of failing repros ---------------------------------------------------------


def _descendants(root: int) -> set[int]:
    """Live (non-zombie) processes below `root`."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found: set[int] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def _rss_kb() -> int:
    with open("/proc/self/status", encoding="utf-8") as handle:
        return int(next(line for line in handle if line.startswith("VmRSS:")).split()[1])


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


FAILING = """\
import torch


def broken(x):
    return x.view(3, 7)


broken(torch.arange(12.0))
"""


def test_a_hundred_failing_warm_repros_leave_no_trace(tmp_path):
    project = tmp_path / "soak"
    project.mkdir()
    path = project / "train.py"
    path.write_text(FAILING)
    options = ReproOptions(python=sys.executable, timeout_s=30.0)
    baseline = _descendants(os.getpid())  # a warm worker of another test may be running
    session = ReproSession()
    figures: dict[int, tuple[int, int, int, set[int]]] = {}
    try:
        session.prewarm_prepared(prepare(path, options), wait=True)
        for run in range(1, 101):
            report = session.run(path, options)
            assert report.status == "error" and report.data["timing"]["runner"] == "warm", (
                run,
                report.status,
            )
            if run in (10, 100):
                figures[run] = (
                    _rss_kb(),
                    _open_fds(),
                    threading.active_count(),
                    _descendants(os.getpid()),
                )
    finally:
        session.close()
    rss_10, fds_10, threads_10, processes_10 = figures[10]
    rss_100, fds_100, threads_100, processes_100 = figures[100]
    print(f"RSS after 10 runs: {rss_10} kB; after 100: {rss_100} kB")
    assert rss_100 <= rss_10 * 1.25, (rss_10, rss_100)
    assert fds_100 == fds_10
    assert threads_100 == threads_10
    assert processes_100 == processes_10  # the warm worker, nothing else
    assert len(processes_100 - baseline) >= 1  # the session's own warm worker
    end = time.monotonic() + SETTLE_S
    while _descendants(os.getpid()) - baseline and time.monotonic() < end:
        time.sleep(0.05)
    assert _descendants(os.getpid()) - baseline == set()
    assert wait_until_gone("torchls_probe --request") == []
