"""OPEN BUGS (issue 8): reproducers that FAIL today, kept out of the default run on purpose.

Run them with `pytest tests/robustness/open_bugs.py`. Each test states the wanted behaviour;
when one passes, move it to test_regressions.py. Found by the robustness suite (issue 8):
pygls JSON-RPC framing/params handling, and probe sandbox gaps.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.robustness.test_regressions import ROOT, run_capped

FOUND_WAIT_S = 10.0  # for answers that come at once when the bug is fixed
HANG_WAIT_S = 30.0  # for whole runs (a cold repro imports torch) that hang today


# == the analysis and its fixes =================================================================


# == torchls check ==============================================================================


# == the language server ========================================================================


# == the runtime probe's sandbox ================================================================

pytest.importorskip("torch")  # the probe runs real training code

DRIVER = """\
import json
import sys

from torchls.probe import ReproOptions, run_repro

report = run_repro(sys.argv[1], ReproOptions(python=sys.executable, timeout_s=20.0,
                   argv=tuple(sys.argv[2:])))
print("DRIVER", json.dumps({"status": report.status}))
"""


def run_driver(path: Path, *argv: str) -> tuple[int | None, str]:
    """A cold repro of `path`, from a separate "server" process under a memory cap."""
    return run_capped(
        [sys.executable, "-c", DRIVER, str(path), *argv], timeout=HANG_WAIT_S, cwd=ROOT
    )


PLANT = """\
import os
import sys

scratch = os.environ["HOME"]
target = os.path.join(scratch, sys.argv[1])
if os.path.lexists(target):
    os.unlink(target)
if sys.argv[2] == "fifo":
    os.mkfifo(target)
else:
    os.symlink(sys.argv[2], target)
os._exit(0)  # before the probe writes its report
"""


@pytest.mark.parametrize(
    ("name", "what"),
    [("report.json", "fifo"), ("report.json", "/dev/zero"), ("stderr.txt", "/dev/zero")],
)
def test_files_planted_in_the_scratch_folder_cannot_hang_or_exhaust_the_server(
    tmp_path: Path, name: str, what: str
) -> None:
    """The run's scratch folder is writable by the user's code, and the server reads
    report.json and stderr.txt from it after the run, following symlinks and opening FIFOs:
    a FIFO blocks `read_probe_report` forever; a symlink to /dev/zero passes the size check
    (st_size 0) and is read without end (MemoryError under the cap here; without one, the
    server eats the machine's memory). Read them with O_NOFOLLOW|O_NONBLOCK, fstat S_ISREG,
    and a bounded read."""
    path = tmp_path / "plant.py"
    path.write_text(PLANT)
    status, output = run_driver(path, name, what)
    assert status == 0 and "DRIVER" in output, output[-3000:]


PRECREATE = """\
import os

scratch = os.environ["HOME"]  # the warm worker's scratch root
for run in range(1, 50):
    try:
        os.symlink("/etc", os.path.join(scratch, f"run-{run}"))
    except OSError:
        pass
"""

TAMPER = """\
import glob
import os

marker = "TAMPERED-BY-" + "AN-EARLIER-RUN"
for path in glob.glob(os.path.join(os.environ["HOME"], "**", "*.py"), recursive=True):
    with open(path, "a") as handle:
        handle.write(f"\\nprint({marker!r})\\n")
"""

CLEAN = "import torch\n\nprint(torch.ones(2).sum().item())\n"


def warm_pair(tmp_path: Path, first: str) -> tuple[object, object]:
    """Run `first`, then a clean file, through one warm session; both reports."""
    from torchls.probe import ReproOptions, ReproSession
    from torchls.probe.prepare import prepare

    project = tmp_path / "project"
    project.mkdir()
    (project / "first.py").write_text(first)
    (project / "clean.py").write_text(CLEAN)
    options = ReproOptions(python=sys.executable, timeout_s=30.0)
    session = ReproSession()
    try:
        session.prewarm_prepared(prepare(project / "first.py", options), wait=True)
        before = session.run(project / "first.py", options)
        assert before.data["timing"]["runner"] == "warm"
        return before, session.run(project / "clean.py", options)
    finally:
        session.close()


def test_a_warm_run_cannot_break_later_warm_runs(tmp_path: Path) -> None:
    """The worker's scratch root is the runs' HOME and writable; the server creates
    `run-N` there with `mkdir()` for run N. A run that creates `run-2` ... `run-49` first makes
    every later run of the session raise FileExistsError (not even a cold fallback)."""
    _, after = warm_pair(tmp_path, PRECREATE)
    assert after.status == "ok", after.data.get("output")


def test_a_warm_run_cannot_change_the_probe_of_later_runs(tmp_path: Path) -> None:
    """The probe package is staged into the worker's scratch root, which every run can write.
    Forked children import some probe modules lazily, so code appended by one run runs inside
    every later run of the session, for any file: it can forge their reports."""
    _, after = warm_pair(tmp_path, TAMPER)
    assert "TAMPERED-BY-AN-EARLIER-RUN" not in json.dumps(after.data)


READ_HOME = """\
import sys

for path in sys.argv[1:]:
    try:
        with open(path) as handle:
            print("READ", path, handle.read())
    except OSError as error:
        print("REFUSED", path, error.errno)
"""


def test_the_users_home_is_not_readable(tmp_path: Path) -> None:
    """bubblewrap binds / read-only and hides only /tmp, /var/tmp and /run: every file the
    user can read, SSH keys and cloud credentials included, is readable by the code under
    test (it cannot send them anywhere: no network, no writable place but the scratch). The
    test plants a fake key and credentials file in the real home and removes them."""
    from torchls.probe import ReproOptions, run_repro

    home = Path.home() / f".torchls-escape-{uuid.uuid4().hex}"
    secret = f"FAKE-KEY-{uuid.uuid4().hex}"
    try:
        (home / ".ssh").mkdir(parents=True)
        (home / ".ssh" / "id_rsa").write_text(secret)
        (home / ".aws").mkdir()
        (home / ".aws" / "credentials").write_text(f"aws_secret_access_key = {secret}")
        path = tmp_path / "read_home.py"
        path.write_text(READ_HOME)
        targets = (str(home / ".ssh" / "id_rsa"), str(home / ".aws" / "credentials"))
        report = run_repro(path, ReproOptions(python=sys.executable, timeout_s=30.0, argv=targets))
        assert secret not in json.dumps(report.data)
    finally:
        shutil.rmtree(home, ignore_errors=True)


FILL = textwrap.dedent(
    """\
    import os

    chunk = b"x" * (1 << 20)
    written = 0
    for folder in (os.environ["HOME"], "/tmp", "/var/tmp", "/dev/shm"):
        for number in range(32):
            try:
                with open(os.path.join(folder, f"fill-{number}.bin"), "wb") as handle:
                    for _ in range(2):
                        handle.write(chunk)
                        written += len(chunk)
            except OSError:
                break
    print("WRITTEN", written)
    """
)


def test_a_run_cannot_write_without_bound_across_files(tmp_path: Path) -> None:
    """RLIMIT_FSIZE caps each file, not the total: with a 2 MB limit, a run writes 32 files of
    2 MB each in the scratch folder (the host's disk), in the sandbox's /tmp and /dev/shm
    (tmpfs: the host's memory, outside the memory limit), 192 MB here; in a minute's run, it
    can fill a disk or RAM. Wanted: a total bounded by a few times the file-size limit."""
    from torchls.probe import ReproOptions, run_repro

    path = tmp_path / "fill.py"
    path.write_text(FILL)
    report = run_repro(path, ReproOptions(python=sys.executable, timeout_s=30.0, file_size_mb=2))
    output = report.data["output"]["head"] + report.data["output"]["tail"]
    written = int(output.split("WRITTEN ", 1)[1].split()[0])
    assert written <= 4 * (2 << 20), f"{written >> 20} MB written with a 2 MB file-size limit"


def test_a_process_limit_reported_on_macos_is_applied(monkeypatch, tmp_path: Path) -> None:
    """On macOS, as a normal user, `plan()` reports the layer "processes: held, RLIMIT_NPROC
    (this user's processes + N)", but the preexec function sets RLIMIT_NPROC only on Linux
    (it counts the user's processes through /proc): the report claims a limit that is not
    there, and a fork bomb runs until the wall clock. Simulated here: sys.platform "darwin",
    uid 1000, no pids cgroup; the preexec function runs in a forked child."""
    from torchls.probe import sandbox

    monkeypatch.setattr(sandbox.sys, "platform", "darwin")
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(sandbox.PidsCgroup, "create", classmethod(lambda cls, limit: None))
    limits = sandbox.Limits(memory_mb=4096, cpu_s=60, file_size_mb=16, max_processes=64)
    launch = sandbox.plan(
        python=Path(sys.executable),
        probe_dir=tmp_path,
        scratch=tmp_path,
        cwd=tmp_path,
        read_paths=[],
        limits=limits,
        mode="none",
    )
    monkeypatch.undo()
    [processes] = [layer for layer in launch.layers if layer.name == "processes"]
    if not processes.held or "RLIMIT_NPROC" not in processes.detail:
        return  # not claimed: nothing to check
    before = resource.getrlimit(resource.RLIMIT_NPROC)
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child only applies the limits and reports them
        try:
            launch.preexec()
            os.write(writer, json.dumps(resource.getrlimit(resource.RLIMIT_NPROC)).encode())
        finally:
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader) as handle:
        after = tuple(json.loads(handle.read()))
    os.waitpid(child, 0)
    assert after != before, f"layer says {processes.detail!r}, RLIMIT_NPROC stays {after}"


def test_repro_without_the_resource_module_says_it_is_unsupported(tmp_path: Path) -> None:
    """Windows has no `resource` module (nor preexec_fn, killpg, namespaces). torchls.probe
    imports `resource` at module level, so `torchls repro` (and the editor's repro action)
    fails with ModuleNotFoundError and a traceback. Wanted: a one-line "not supported on this
    platform" error and exit status 2. Simulated by hiding `resource` from the interpreter."""
    path = tmp_path / "train.py"
    path.write_text("print('hello')\n")
    code = (
        "import sys; sys.modules['resource'] = None\n"
        "from torchls.cli import main\n"
        f"sys.exit(main(['repro', {str(path)!r}]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
