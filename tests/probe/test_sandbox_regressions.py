"""Regression tests for the runtime probe's sandbox bugs found by the robustness suite (fixed).

Each test states the wanted behaviour and would fail again if its bug came back: files a run
plants where the server reads its results, warm runs that break or alter later warm runs, the
user's home readable from the sandbox (also through a spec naming a file outside the project),
a flat-layout editable install in the home not importable, writes bounded per file but not in
total (and the capabilities a warm run held in its own user namespace, which could get around
that bound), a /dev/shm too small for DataLoader batches, a process limit reported on macOS but
not applied, a traceback where the platform is not supported, and one failed bubblewrap trial
that weakened every later run of the process. A failure stays bounded: runs
that used to hang or exhaust memory go through a separate "server" process under an
address-space limit and a wall-clock cut-off (`run_capped`).
"""

from __future__ import annotations

import ast
import json
import os
import re
import resource
import shutil
import stat
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.probe.support import bwrap_usable, layer, run_as
from tests.robustness.test_regressions import ROOT, run_capped
from torchls.probe import ReproOptions, ReproSession, ReproUsageError, run_repro
from torchls.probe.options import DEFAULT_MEMORY_MB
from torchls.probe.prepare import prepare
from torchls.probe.scratch import Unreadable, read_head_tail, read_regular, read_tail

pytest.importorskip("torch")  # the probe runs real training code

needs_bwrap = pytest.mark.skipif(not bwrap_usable(), reason="bubblewrap is not usable here")
SANDBOXES = [pytest.param("auto", marks=needs_bwrap), "none"]
HANG_WAIT_S = 60.0  # for whole runs from a separate process (imports torch twice)


def output_of(report) -> str:
    return report.data["output"]["head"] + report.data["output"]["tail"]


# == files the server reads back ==================================================================

DRIVER = """\
import json
import sys

from torchls.probe import ReproOptions, run_repro

report = run_repro(sys.argv[1], ReproOptions(python=sys.executable, timeout_s=20.0,
                   sandbox=sys.argv[2], argv=tuple(sys.argv[3:])))
messages = [f.message for f in report.findings]
print("DRIVER", json.dumps({"status": report.status, "messages": messages,
                            "notes": report.data.get("notes"), "output": report.data["output"]}))
"""


def run_driver(path: Path, sandbox: str, *argv: str) -> tuple[int | None, str]:
    """A cold repro of `path`, from a separate "server" process under a memory cap."""
    return run_capped(
        [sys.executable, "-c", DRIVER, str(path), sandbox, *argv], timeout=HANG_WAIT_S, cwd=ROOT
    )


# Replaces every file the server reads back by a FIFO or a symlink: the report and the output
# (their paths are in the request named on the probe's command line), the child's stderr (next
# to them in the run's folder), and the same names in HOME. Then exits before the probe writes
# its report. Inside bubblewrap most of this is refused (the report and output are mount
# points; the run's folder is not the host's); without it, all of it lands.
PLANT = """\
import json
import os
import sys

argv = open("/proc/self/cmdline", "rb").read().split(b"\\0")
request = json.load(open(argv[argv.index(b"--request") + 1]))
folder = os.path.dirname(os.path.dirname(request["out"]))
targets = [request["out"], request["output_file"], os.path.join(folder, "stderr.txt")]
targets += [os.path.join(os.environ["HOME"], name) for name in ("report.json", "stderr.txt")]
for target in targets:
    try:
        if os.path.lexists(target):
            os.unlink(target)
        if sys.argv[1] == "fifo":
            os.mkfifo(target)
        else:
            os.symlink(sys.argv[1], target)
        print("PLANTED", target, flush=True)
    except OSError as error:
        print("REFUSED", target, error.errno, flush=True)
os._exit(0)  # before the probe writes its report
"""


@pytest.mark.parametrize("sandbox", SANDBOXES)
@pytest.mark.parametrize("what", ["fifo", "/dev/zero"])
def test_files_planted_in_the_scratch_folder_cannot_hang_or_exhaust_the_server(
    tmp_path: Path, sandbox: str, what: str
) -> None:
    """The server reads the report, the output and the child's stderr back after the run,
    from places the run's code can write. A FIFO there used to block the server forever, a
    symlink to /dev/zero (st_size 0) was read without end. Now each is opened with
    O_NOFOLLOW|O_NONBLOCK, checked to be a regular file and read with a bound, a refused report
    counts as no report (with the reason in the finding), and inside bubblewrap the report and
    output are single bound files that cannot be swapped at all."""
    path = tmp_path / "plant.py"
    path.write_text(PLANT)
    status, output = run_driver(path, sandbox, what)
    assert status == 0 and "DRIVER" in output, output[-3000:]
    result = json.loads(output.split("DRIVER ", 1)[1].splitlines()[0])
    assert result["status"] == "crashed", result
    if sandbox == "none":  # everything was planted: the reason is in the report
        kind = "a FIFO" if what == "fifo" else "a symbolic link"
        assert any(f"report.json is {kind}" in m for m in result["messages"]), result
        assert kind in result["output"].get("note", ""), result["output"]
    else:  # bound files are mount points: they cannot be removed or replaced (EBUSY)
        planted = result["output"]["head"]
        for name in ("report.json", "output.txt"):
            assert re.search(rf"REFUSED \S+/out/{name} 16\n", planted), planted


def test_reading_back_refuses_links_fifos_devices_and_oversized_files(tmp_path: Path) -> None:
    regular = tmp_path / "regular.txt"
    regular.write_bytes(b"0123456789")
    assert read_regular(regular, 10) == b"0123456789"
    assert read_tail(regular, 4) == b"6789"
    assert read_head_tail(regular, 3, 2) == (10, b"012", b"89")
    with pytest.raises(Unreadable, match="larger than 9 bytes"):
        read_regular(regular, 9)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "link"
    link.symlink_to("/dev/zero")
    folder = tmp_path / "folder"
    folder.mkdir()
    for path, why in ((fifo, "a FIFO"), (link, "a symbolic link"), (folder, "a folder")):
        for read in (lambda p: read_regular(p, 1 << 20), lambda p: read_tail(p, 10)):
            with pytest.raises(Unreadable, match=why):
                read(path)
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "missing", 10)


def test_the_warm_worker_reads_back_and_clears_without_following_links(tmp_path: Path) -> None:
    from torchls_probe.runfiles import Shared, read_output, read_report

    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "report.json")
    (run / "output.txt").symlink_to("/dev/zero")
    assert read_report(str(run / "report.json"), 1 << 20) == (
        None,
        "report.json is not a regular file",
    )
    assert (
        read_output(str(run / "output.txt"), 10, 10)["note"] == "output.txt is not a regular file"
    )
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    shared = Shared(str(run))
    (run / "to-outside").symlink_to(outside)
    locked = run / "a" / "b"
    locked.mkdir(parents=True)
    (locked / "file").write_text("x")
    locked.chmod(0)
    (run / "a").chmod(0)
    assert shared.clear()
    assert os.listdir(run) == []
    assert (outside / "keep.txt").read_text() == "keep"


# == warm runs ====================================================================================

# Tries to break every later run of the session: `run-N` names (what the server used to create
# with mkdir()) pre-created as symlinks in HOME and in the folder above it (the worker's scratch
# root), the private /tmp, /var/tmp and /dev/shm filled up (bubblewrap only: elsewhere they are
# the host's), folders locked with mode 000, and a FIFO where its own report goes.
BREAK = """\
import os
import sys

home = os.environ["HOME"]
for folder in (home, os.path.dirname(home)):
    for run in range(1, 50):
        for name in (f"run-{run}", f"run-{run:08x}"):
            try:
                os.symlink("/etc", os.path.join(folder, name))
            except OSError:
                pass
if sys.argv[1] == "fill":
    chunk = b"x" * (1 << 20)
    for folder in ("/tmp", "/var/tmp", "/dev/shm", home):
        try:
            os.makedirs(os.path.join(folder, "locked", "deeper"))
            with open(os.path.join(folder, "locked", "deeper", "fill.bin"), "wb") as handle:
                while True:
                    handle.write(chunk)
        except OSError:
            pass
        try:
            for number in range(64):
                with open(os.path.join(folder, f"fill-{number}.bin"), "wb") as handle:
                    handle.write(chunk)
        except OSError:
            pass
        os.chmod(os.path.join(folder, "locked", "deeper"), 0)
        os.chmod(os.path.join(folder, "locked"), 0)
os.mkfifo(os.path.join(home, "report.json.fifo"))
print("BROKEN")
"""

# What the next run finds: its HOME, the scratch root above it and, inside bubblewrap, the
# private /tmp, /var/tmp and /dev/shm (elsewhere those are the host's: not looked at); and it
# can still write a file of half its disk budget in each.
CHECK = """\
import os
import sys

home = os.environ["HOME"]
folders = [home, os.path.dirname(home)]
if sys.argv[1] == "fill":
    folders += ["/tmp", "/var/tmp", "/dev/shm"]
found = {folder: sorted(os.listdir(folder)) for folder in folders}
for folder in folders[1:] if sys.argv[1] == "fill" else [home]:
    with open(os.path.join(folder, "two-mb.bin"), "wb") as handle:
        handle.write(b"y" * (2 << 20))
print("FOUND", found)
"""


def warm_pair(tmp_path: Path, first: str, second: str, argv: tuple[str, ...], **options):
    """Run `first`, then `second`, through one warm session; both reports."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "first.py").write_text(first)
    (project / "second.py").write_text(second)
    opts = ReproOptions(python=sys.executable, timeout_s=30.0, argv=argv, **options)
    session = ReproSession()
    try:
        session.prewarm_prepared(prepare(project / "first.py", opts), wait=True)
        before = session.run(project / "first.py", opts)
        assert before.data["timing"]["runner"] == "warm"
        return before, session.run(project / "second.py", opts)
    finally:
        session.close()


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_a_warm_run_cannot_break_later_warm_runs(tmp_path: Path, sandbox: str) -> None:
    """The worker's scratch root used to be every run's HOME, and the server created `run-N`
    there with mkdir(): a run that created `run-2` ... `run-49` first made every later run of
    the session raise FileExistsError. Now the worker makes each run its own folder with an
    unpredictable name (its HOME), and after each run empties the scratch root and, inside
    bubblewrap, the private /tmp, /var/tmp and /dev/shm: the next run is served warm, sees
    nothing of the first and has its whole disk budget."""
    fill = "fill" if sandbox == "auto" else "no-fill"
    before, after = warm_pair(tmp_path, BREAK, CHECK, (fill,), sandbox=sandbox, file_size_mb=4)
    assert "BROKEN" in output_of(before), output_of(before)
    assert after.status == "ok", output_of(after)
    assert after.data["timing"]["runner"] == "warm"
    found = ast.literal_eval(output_of(after).split("FOUND ", 1)[1].splitlines()[0])
    home = next(iter(found))
    assert found.pop(home) == [] and found.pop(os.path.dirname(home)) == [Path(home).name], found
    for folder, names in found.items():  # /tmp keeps the mount points bound into it
        assert not {name for name in names if "fill" in name or "locked" in name}, folder


# Appends a print to every Python file it can reach: the probe package (on PYTHONPATH), and
# anything under HOME and the folder above it (the worker's scratch root, where the probe used
# to be staged), making read-only files writable first.
TAMPER = """\
import glob
import os

marker = "TAMPERED-BY-" + "AN-EARLIER-RUN"
roots = [*os.environ["PYTHONPATH"].split(os.pathsep), os.environ["HOME"]]
roots.append(os.path.dirname(os.environ["HOME"]))
changed = 0
for root in roots:
    for path in glob.glob(os.path.join(root, "**", "*.py"), recursive=True):
        try:
            os.chmod(os.path.dirname(path), 0o755)
            os.chmod(path, 0o644)
            with open(path, "a") as handle:
                handle.write(f"\\nprint({marker!r})\\n")
            changed += 1
        except OSError:
            pass
print("CHANGED", changed)
"""

CLEAN = "import torch\n\nprint(torch.ones(2).sum().item())\n"


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_a_warm_run_cannot_change_the_probe_of_later_runs(tmp_path: Path, sandbox: str) -> None:
    """The probe package used to be staged into the worker's scratch root, which every run
    could write, and forked children import some probe modules lazily: code appended by one run
    ran inside every later run of the session and could forge their reports. Now the package
    is staged read-only outside the scratch, bubblewrap mounts it read-only, and the worker
    imports every probe module before its first fork, so even a run that can rewrite the files
    (no bubblewrap, as root) changes nothing for later runs."""
    before, after = warm_pair(tmp_path, TAMPER, CLEAN, (), sandbox=sandbox)
    assert "CHANGED" in output_of(before), output_of(before)
    if sandbox == "auto":
        assert "CHANGED 0" in output_of(before), output_of(before)
        assert layer(before, "probe_code")["held"]
    else:
        assert not layer(before, "probe_code")["held"]
    assert after.status == "ok", output_of(after)
    assert "TAMPERED-BY-AN-EARLIER-RUN" not in json.dumps(after.data)


# == the home folder ==============================================================================

READ_HOME = """\
import sys

for path in sys.argv[1:]:
    try:
        with open(path) as handle:
            print("READ", path, handle.read())
    except OSError as error:
        print("REFUSED", path, error.errno)
"""


def plant_secrets(home: Path) -> tuple[str, tuple[str, str]]:
    secret = f"FAKE-KEY-{uuid.uuid4().hex}"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text(secret)
    (home / ".aws").mkdir()
    (home / ".aws" / "credentials").write_text(f"aws_secret_access_key = {secret}")
    return secret, (str(home / ".ssh" / "id_rsa"), str(home / ".aws" / "credentials"))


@needs_bwrap
def test_the_users_home_is_not_readable(tmp_path: Path) -> None:
    """bubblewrap used to bind / read-only and hide only /tmp, /var/tmp and /run: every file
    the user can read, SSH keys and cloud credentials included, was readable by the code under
    test. Now the home folders are empty read-only folders inside the sandbox, with only what
    the run needs bound back (here the interpreter, which lives under /root on the development
    VM). The test plants a fake key and credentials file in the real home and removes them."""
    home = Path.home() / f".torchls-escape-{uuid.uuid4().hex}"
    try:
        secret, targets = plant_secrets(home)
        path = tmp_path / "read_home.py"
        path.write_text(READ_HOME)
        report = run_repro(path, ReproOptions(python=sys.executable, timeout_s=30.0, argv=targets))
        assert report.status == "ok", output_of(report)
        assert secret not in json.dumps(report.data)
        assert all(f"REFUSED {target} " in output_of(report) for target in targets)
        assert layer(report, "home")["held"], layer(report, "home")
    finally:
        shutil.rmtree(home, ignore_errors=True)


@needs_bwrap
def test_a_project_inside_the_home_is_bound_back_and_nothing_else(
    tmp_path: Path, monkeypatch
) -> None:
    """The project (and the interpreter) may live in the home folder: those are bound back
    read-only, the rest of the home stays hidden."""
    home = tmp_path / "home"
    secret, targets = plant_secrets(home)
    project = home / "work" / "project"
    project.mkdir(parents=True)
    (project / "data.txt").write_text("project data")
    path = project / "read_home.py"
    path.write_text(READ_HOME)
    monkeypatch.setenv("HOME", str(home))
    argv = (*targets, str(project / "data.txt"))
    report = run_repro(path, ReproOptions(python=sys.executable, timeout_s=30.0, argv=argv))
    output = output_of(report)
    assert report.status == "ok", output
    assert secret not in json.dumps(report.data)
    assert f"READ {project / 'data.txt'} project data" in output
    assert layer(report, "home")["held"] and str(home) in layer(report, "home")["detail"]


@needs_bwrap
def test_a_project_that_is_the_home_folder_is_reported_as_exposing_it(
    tmp_path: Path, monkeypatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    (home / "train.py").write_text(CLEAN)
    report = run_repro(home / "train.py", ReproOptions(python=sys.executable, timeout_s=30.0))
    assert report.status == "ok", output_of(report)
    home_layer = layer(report, "home")
    assert not home_layer["held"] and "NOT hidden" in home_layer["detail"]
    assert "home" in report.data["sandbox"]["degraded"]


def test_without_bubblewrap_the_home_and_disk_layers_do_not_hold(tmp_path: Path) -> None:
    path = tmp_path / "clean.py"
    path.write_text(CLEAN)
    report = run_repro(path, ReproOptions(python=sys.executable, timeout_s=30.0, sandbox="none"))
    degraded = report.data["sandbox"]["degraded"]
    assert {"home", "disk", "filesystem", "probe_code"} <= set(degraded), degraded


# == editable installs ===========================================================================

USE_MYLIB = "import mylib\n\nprint('MYLIB', mylib.VALUE, mylib.helper.NAME)\n"


def editable_venv(home: Path, mapping: dict[str, str]) -> tuple[Path, Path]:
    """A venv inside `home` whose site-packages sees this interpreter's (torch) through a path
    `.pth`, and has `mylib` installed editable the way setuptools >= 64 installs a package
    without a src folder: `__editable__.mylib-0.1.pth` imports a finder module holding
    `MAPPING`. Returns the venv's python and its site-packages folder."""
    import venv

    editable_wheel = pytest.importorskip("setuptools.command.editable_wheel")
    folder = home / "venvs" / "mylib"
    venv.create(folder, with_pip=False, symlinks=True)
    python = folder / "bin" / "python"
    site = folder / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    torch_site = Path(pytest.importorskip("torch").__file__).parent.parent
    (site / "base.pth").write_text(f"{torch_site}\n")
    finder = "__editable___mylib_0_1_finder"
    text = editable_wheel._finder_template("__editable__.mylib-0.1.finder", mapping, {})
    (site / f"{finder}.py").write_text(text)
    (site / "__editable__.mylib-0.1.pth").write_text(f"import {finder}; {finder}.install()\n")
    return python, site


def make_mylib(home: Path) -> Path:
    package = home / "code" / "mylib" / "mylib"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from mylib import helper\n\nVALUE = 42\n")
    (package / "helper.py").write_text("NAME = 'helper'\n")
    return package


@needs_bwrap
def test_a_flat_layout_editable_install_in_the_home_is_importable(
    tmp_path: Path, monkeypatch
) -> None:
    """setuptools >= 64 installs a package without a src folder in editable mode as a `.pth`
    that imports a finder module whose `MAPPING` names the package folder. `.pth` import lines
    used to be skipped, so with that folder in the (hidden) home `import mylib` failed inside
    the sandbox. Now the finder is read as text, its MAPPING parsed with `ast`, and the folders
    it names bound back read-only; the rest of the home stays hidden."""
    home = tmp_path / "home"
    secret, targets = plant_secrets(home)
    package = make_mylib(home)
    python, _site = editable_venv(home, {"mylib": str(package)})
    monkeypatch.setenv("HOME", str(home))
    project = tmp_path / "project"
    project.mkdir()
    path = project / "use_mylib.py"
    path.write_text(USE_MYLIB + READ_HOME)
    report = run_repro(path, ReproOptions(python=str(python), timeout_s=30.0, argv=targets))
    output = output_of(report)
    assert report.status == "ok", output
    assert "MYLIB 42 helper\n" in output, output
    assert secret not in json.dumps(report.data)
    home_layer = layer(report, "home")
    assert home_layer["held"] and str(package) in home_layer["detail"], home_layer


FINDER_SIDE_EFFECT = """\
open({marker!r}, "w").write("executed")
MAPPING = {{"mylib": {package!r}, "mod": {module!r}, "bad": 3, "rel": "relative/path"}}
NAMESPACES: dict[str, list[str]] = {{"ns": [{namespace!r}]}}
"""


def test_editable_finders_are_parsed_not_run_and_malformed_ones_ignored(tmp_path: Path) -> None:
    from torchls.probe import sandbox

    package = tmp_path / "pkg"
    package.mkdir()
    (tmp_path / "mod.py").write_text("X = 1\n")
    namespace = tmp_path / "ns"
    namespace.mkdir()
    marker = tmp_path / "executed"
    finder = tmp_path / "__editable___x_finder.py"
    finder.write_text(
        FINDER_SIDE_EFFECT.format(
            marker=str(marker),
            package=str(package),
            module=str(tmp_path / "mod"),
            namespace=str(namespace),
        )
    )
    found = sandbox.editable_finder_paths(finder)
    assert found == [package, tmp_path / "mod.py", namespace], found
    assert not marker.exists()
    for text in (
        "MAPPING = {",  # not Python
        "MAPPING = dict(mylib=" + repr(str(package)) + ")",  # not a literal
        "MAPPING = [" + repr(str(package)) + "]",  # not a dict
        "MAPPING = {'a': " + repr(str(package)) + "}\n#" + "x" * sandbox.FINDER_LIMIT,  # too big
        "[" * 100_000 + "]" * 100_000,  # too deep for the parser
    ):
        finder.write_text(text)
        assert sandbox.editable_finder_paths(finder) == [], text[:40]
    assert sandbox.editable_finder_paths(tmp_path / "missing.py") == []


# == spec references =============================================================================

STEPS = """\
import torch


def make(device):
    return (torch.ones(2, requires_grad=True),)


def train_step(x):
    x.sum().backward()
"""


def project_in_home(tmp_path: Path, monkeypatch) -> tuple[Path, Path, Path]:
    """A downloaded project inside a (hidden) home, with a sibling folder holding a key."""
    home = tmp_path / "home"
    project = home / "work" / "project"
    (project / "helpers").mkdir(parents=True)
    (project / "helpers" / "steps.py").write_text(STEPS)
    (project / "train.py").write_text(CLEAN)
    secret = home / "work" / "secret"
    secret.mkdir()
    (secret / "key").write_text(f"FAKE-KEY-{uuid.uuid4().hex}")
    monkeypatch.setenv("HOME", str(home))
    return home, project, secret


@pytest.mark.parametrize(
    "reference",
    ["../secret/nothing.py:setup", "{secret}/nothing.py:setup", "link/nothing.py:setup"],
)
def test_a_spec_cannot_name_files_outside_the_project(
    tmp_path: Path, monkeypatch, reference: str
) -> None:
    """The folder of a spec's `step` or `setup` file is bound back into the sandbox, and it was
    taken as written: a downloaded project's spec with `setup: "../secret/nothing.py:setup"`
    made a sibling folder of the project, inside the hidden home, readable by the run (the
    home layer still said held). Now a reference outside the project root, as written or
    through a symbolic link, is refused before anything runs."""
    _home, project, secret = project_in_home(tmp_path, monkeypatch)
    (project / "link").symlink_to(secret)
    reference = reference.format(secret=secret)
    spec = project / "repro.yaml"
    spec.write_text(f"step: helpers/steps.py:train_step\nsetup: {json.dumps(reference)}\n")
    options = ReproOptions(python=sys.executable, spec=str(spec))
    with pytest.raises(ReproUsageError) as refused:
        prepare(project / "train.py", options)
    message = str(refused.value)
    assert "\n" not in message and reference in message, message
    assert f"outside the project root {project}" in message, message


def test_the_cli_refuses_a_spec_naming_files_outside_the_project(
    tmp_path: Path, monkeypatch
) -> None:
    _home, project, _secret = project_in_home(tmp_path, monkeypatch)
    (project / "repro.yaml").write_text("step: ../secret/nothing.py:step\n")
    done = subprocess.run(
        [sys.executable, "-m", "torchls", "repro", "train.py", "--spec", "repro.yaml"],
        capture_output=True,
        text=True,
        cwd=project,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("torchls: error: ") and "outside the project root" in line, line


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_a_spec_naming_files_inside_the_project_still_runs(
    tmp_path: Path, monkeypatch, sandbox: str
) -> None:
    _home, project, secret = project_in_home(tmp_path, monkeypatch)
    spec = project / "repro.yaml"
    spec.write_text("step: helpers/steps.py:train_step\nsetup: helpers/./steps.py:make\nsteps: 1\n")
    options = ReproOptions(python=sys.executable, spec=str(spec), timeout_s=30.0, sandbox=sandbox)
    assert str(secret) not in map(str, prepare(project / "train.py", options).read_paths)
    report = run_repro(project / "train.py", options)
    assert report.status == "ok", output_of(report)
    assert report.data["progress"]["backward_calls"] == 1, report.data["progress"]


# == total writes =================================================================================

# Two 1 MB chunks per file, up to 32 files per folder, in every place a run might write.
FILL = textwrap.dedent(
    """\
    import json
    import os

    chunk = b"x" * (1 << 20)
    written = {}
    home = os.environ["HOME"]
    places = (home, os.path.dirname(home), "/tmp", "/var/tmp", "/dev/shm", "/dev", "/run")
    for folder in places:
        written[folder] = 0
        for number in range(32):
            try:
                with open(os.path.join(folder, f"fill-{number}.bin"), "wb") as handle:
                    for _ in range(2):
                        handle.write(chunk)
                        written[folder] += len(chunk)
            except OSError:
                break
    print("WRITTEN", json.dumps(written))
    """
)


def written_by(report) -> dict[str, int]:
    return json.loads(output_of(report).split("WRITTEN ", 1)[1].splitlines()[0])


@needs_bwrap
@pytest.mark.parametrize("runner", ["cold", "warm"])
def test_a_run_cannot_write_without_bound_across_files(tmp_path: Path, runner: str) -> None:
    """RLIMIT_FSIZE caps each file, not the total: with a 2 MB limit a run used to write 32
    files of 2 MB in the scratch folder (the host's disk), /tmp, /var/tmp and /dev/shm (the
    host's memory), 192 MB here. Now every writable place inside bubblewrap is a private tmpfs
    (/dev and /run are read-only): the scratch, /tmp and /var/tmp of the file-size limit each,
    /dev/shm of the memory limit (shared memory: see the DataLoader test below), cold or warm.
    The folder above HOME lies on the scratch or on /tmp, so it shares their bound."""
    path = tmp_path / "fill.py"
    path.write_text(FILL)
    limit = 2 << 20
    options = ReproOptions(python=sys.executable, timeout_s=30.0, file_size_mb=2)
    memory = DEFAULT_MEMORY_MB << 20
    report = run_as(runner, path, options)
    assert report.data["timing"]["runner"] == runner
    written = written_by(report)
    home = next(iter(written))
    above = os.path.dirname(home)
    mb = {folder: size >> 20 for folder, size in written.items()}
    for folder in (home, "/tmp", "/var/tmp"):
        assert written[folder] <= limit, f"{mb} MB written with a 2 MB file-size limit"
    assert written[home] + written[above] + written["/tmp"] <= 2 * limit, mb
    assert written["/dev"] == written["/run"] == 0, mb
    assert limit < written["/dev/shm"] <= memory, mb
    disk = layer(report, "disk")
    assert disk["held"] and f"/dev/shm: a private tmpfs of {DEFAULT_MEMORY_MB} MB" in disk["detail"]


# Fills /dev/shm the way DataLoader workers do (many shared buffers, each under the file-size
# limit), well past the file-size limit in all.
SHARED_MEMORY = """\
import os

chunk = b"x" * (15 << 20)
for number in range(20):
    with open(f"/dev/shm/batch-{number}", "wb") as handle:
        handle.write(chunk)
total = sum(os.path.getsize(f"/dev/shm/batch-{number}") for number in range(20))
print("SHARED", total >> 20)
"""


@needs_bwrap
def test_dev_shm_holds_batches_beyond_the_file_size_limit(tmp_path: Path) -> None:
    """DataLoader workers pass every batch through /dev/shm. Sizing it like the other private
    tmpfs (the file-size limit, 256 MB by default) broke ordinary image training with
    num_workers > 0 ("unable to allocate shared memory ... No space left on device"), which
    worked when /dev/shm was unsized. Now it is sized by the memory limit: 300 MB fit with a
    16 MB file-size limit."""
    path = tmp_path / "shared.py"
    path.write_text(SHARED_MEMORY)
    options = ReproOptions(python=sys.executable, timeout_s=30.0, file_size_mb=16)
    report = run_repro(path, options)
    assert report.status == "ok", output_of(report)
    assert "SHARED 300\n" in output_of(report), output_of(report)


@needs_bwrap
def test_dev_shm_is_sized_by_the_memory_limit_and_the_rest_by_the_file_size_limit(
    tmp_path: Path,
) -> None:
    from torchls.probe import sandbox

    limits = sandbox.limits_for(1024, 30.0, 16, 64, "cpu")
    launch = sandbox.plan(
        sandbox.PlanInputs(
            python=Path(sys.executable),
            probe_dir=tmp_path,
            scratch=tmp_path / "home",
            cwd=tmp_path,
            read_paths=[],
            limits=limits,
            mode="bwrap",
        )
    )
    try:
        argv = launch.argv_prefix
        sizes = {argv[i + 3]: argv[i + 1] for i, a in enumerate(argv[:-3]) if a == "--size"}
        assert sizes == {
            "/dev/shm": str(1024 << 20),
            "/tmp": str(16 << 20),
            "/var/tmp": str(16 << 20),
            str(tmp_path / "home"): str(16 << 20),
        }, sizes
        disk = next(item for item in launch.layers if item.name == "disk")
        assert (
            disk.held and "/dev/shm: a private tmpfs of 1024 MB, the memory limit (" in disk.detail
        )
        assert "/tmp, /var/tmp: private tmpfs of 16 MB each (the file-size limit)" in disk.detail
        assert "1072 MB in all" in disk.detail, disk.detail
    finally:
        launch.close()


# Capabilities of the run's code, and whether it can make a user namespace of its own (where it
# would hold every capability, and could mount a tmpfs outside the disk budget).
CAPABILITIES = """\
import ctypes
import os

for line in open("/proc/self/status"):
    if line.startswith("CapEff"):
        print("CAPEFF", int(line.split()[1], 16))
libc = ctypes.CDLL(None, use_errno=True)
if os.fork() == 0:
    result = libc.unshare(0x10000000 | 0x00020000)  # CLONE_NEWUSER | CLONE_NEWNS
    print("USERNS", result, ctypes.get_errno(), flush=True)
    os._exit(0)
os.wait()
"""


@needs_bwrap
@pytest.mark.parametrize("runner", ["cold", "warm"])
def test_the_runs_code_holds_no_capability_and_no_user_namespace(
    tmp_path: Path, runner: str
) -> None:
    """A warm run's child makes its own user namespace (for a PID namespace per run), which
    used to leave the run's code with every capability inside it: a non-root user's code could
    map itself into it and mount a tmpfs of unbounded size. Now the child drops them all before
    the code runs; cold runs cannot make a user namespace at all (`--disable-userns`)."""
    path = tmp_path / "caps.py"
    path.write_text(CAPABILITIES)
    options = ReproOptions(python=sys.executable, timeout_s=30.0)
    report = run_as(runner, path, options)
    output = output_of(report)
    assert report.data["timing"]["runner"] == runner
    assert "CAPEFF 0\n" in output, output
    assert "USERNS 0 " not in output and "USERNS -1" in output, output


@needs_bwrap
@pytest.mark.parametrize("missing", ["--size", "--disable-userns"])
def test_an_older_bubblewrap_runs_and_says_what_it_cannot_bound(
    tmp_path, monkeypatch, missing: str
) -> None:
    """bubblewrap before 0.7 has no `--size`, before 0.8 no `--disable-userns` (Ubuntu 22.04
    ships 0.6): the run still works, and the disk layer says it is not bounded, and why."""
    from torchls.probe import sandbox

    if missing == "--size":
        monkeypatch.setattr(sandbox, "bwrap_sizes_tmpfs", lambda: False)
    monkeypatch.setattr(sandbox, "bwrap_disables_userns", lambda: False)
    path = tmp_path / "clean.py"
    path.write_text(CLEAN)
    report = run_repro(path, ReproOptions(python=sys.executable, timeout_s=30.0))
    assert report.status == "ok", output_of(report)
    disk = layer(report, "disk")
    assert not disk["held"] and missing in disk["detail"], disk
    assert "--disable-userns" in layer(report, "capabilities")["detail"]


# == platforms ====================================================================================


def plan_without_bwrap(folder: Path, limits):
    """The launch plan for a run without bubblewrap, every path in `folder`."""
    from torchls.probe import sandbox

    return sandbox.plan(
        sandbox.PlanInputs(
            python=Path(sys.executable),
            probe_dir=folder,
            scratch=folder,
            cwd=folder,
            read_paths=[],
            limits=limits,
            mode="none",
        )
    )


def test_a_process_limit_reported_on_macos_is_applied(monkeypatch, tmp_path: Path) -> None:
    """On macOS, as a normal user, `plan()` reported "processes: held, RLIMIT_NPROC (this
    user's processes + N)" while the preexec function set RLIMIT_NPROC only on Linux (it
    counted the user's processes through /proc). Now the count comes from `ps` elsewhere and
    the limit is applied wherever it is claimed. Simulated here: sys.platform "darwin", uid
    1000, no pids cgroup; the preexec function runs in a forked child."""
    from torchls.probe import sandbox

    monkeypatch.setattr(sandbox.sys, "platform", "darwin")
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(sandbox.PidsCgroup, "create", classmethod(lambda cls, limit: None))
    limits = sandbox.Limits(memory_mb=4096, cpu_s=60, file_size_mb=16, max_processes=64)
    launch = plan_without_bwrap(tmp_path, limits)
    monkeypatch.undo()
    [processes] = [layer for layer in launch.layers if layer.name == "processes"]
    assert processes.held and "RLIMIT_NPROC" in processes.detail, processes
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
    assert str(after[0]) in processes.detail


def test_a_process_limit_that_cannot_be_counted_is_not_claimed(monkeypatch, tmp_path) -> None:
    from torchls.probe import sandbox

    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(sandbox.PidsCgroup, "create", classmethod(lambda cls, limit: None))
    monkeypatch.setattr(sandbox, "_user_process_count", lambda: None)
    limits = sandbox.Limits(memory_mb=4096, cpu_s=60, file_size_mb=16, max_processes=64)
    launch = plan_without_bwrap(tmp_path, limits)
    [processes] = [layer for layer in launch.layers if layer.name == "processes"]
    assert not processes.held and "NOT limited" in processes.detail


WITHOUT_RESOURCE = "import sys; sys.modules['resource'] = None\n"


def test_repro_without_the_resource_module_says_it_is_unsupported(tmp_path: Path) -> None:
    """Windows has no `resource` module (nor preexec_fn, killpg, namespaces). torchls.probe
    used to import `resource` at module level, so `torchls repro` (and the editor's repro
    action) failed with ModuleNotFoundError and a traceback. Now it is a one-line "not
    supported on this platform" error and exit status 2. Simulated by hiding `resource`."""
    path = tmp_path / "train.py"
    path.write_text("print('hello')\n")
    code = (
        WITHOUT_RESOURCE + "from torchls.cli import main\n"
        f"sys.exit(main(['repro', {str(path)!r}]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("torchls: error: ") and "not supported on this platform" in line


async def test_the_editors_repro_without_the_resource_module_says_it_is_unsupported(
    tmp_path: Path,
) -> None:
    """The language server's `torchls.runRepro` answers the same way, and stays up."""
    from lsprotocol import types

    from tests.lsp.support import end_session, initialize, make_client, open_doc

    client = make_client()
    server = [
        sys.executable,
        "-c",
        WITHOUT_RESOURCE + "from torchls.cli import main\nsys.exit(main(['server']))\n",
    ]
    await client.start_io(*server)
    try:
        await initialize(client, "visual_studio_code", root=tmp_path)
        doc = open_doc(client, tmp_path / "train.py", "print('hello')\n")
        result = await client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="torchls.runRepro", arguments=[{"uri": doc.uri}])
        )
        assert result["status"] == "failed", result
        assert "not supported on this platform" in result["message"], result
        hover = await client.text_document_hover_async(
            types.HoverParams(
                text_document=types.TextDocumentIdentifier(uri=doc.uri),
                position=types.Position(line=0, character=1),
            )
        )
        assert hover is None or hover.contents is not None  # still serving
    finally:
        await end_session(client)


def test_staged_probe_is_read_only_on_the_host(tmp_path: Path) -> None:
    """Without bubblewrap the permissions are all there is (root ignores them, the owner can
    change them), but they keep an honest user's tools from editing the staged copy."""
    from torchls.probe.locate import probe_package
    from torchls.probe.scratch import RunFolder

    folder = RunFolder.create(probe_package(), cold=True)
    try:
        folder.seal({"file": "x"})
        files = [p for p in folder.probe.rglob("*") if p.is_file()]
        assert files and all(not p.stat().st_mode & stat.S_IWUSR for p in files)
        assert folder.report.is_file() and folder.output.is_file()
    finally:
        folder.remove()
    assert not folder.root.exists()


# == failing open =================================================================================


def test_one_failed_bubblewrap_trial_no_longer_weakens_every_later_run(
    monkeypatch, tmp_path: Path
) -> None:
    """`bwrap_works` ran its trial once per process (lru_cache): one trial that failed (a
    10 s timeout on a loaded machine) dropped every later run of that process, the language
    server's forever, to limits only, the host's /tmp and home writable. Now a failure is
    retried and never remembered, and a plan under `auto` refuses rather than run weaker."""
    from torchls.probe import sandbox

    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sandbox, "BWRAP_RETRY_S", (0.0, 0.0))
    outcomes = iter(["timed out", None])  # fails once, then works
    monkeypatch.setattr(sandbox, "_bwrap_try", lambda path, extra: next(outcomes))
    found = sandbox.bwrap_state()
    assert (found.state, found.tries, found.path) == ("works", 2, str(fake))

    monkeypatch.setattr(sandbox, "_bwrap_try", lambda path, extra: "still failing")
    monkeypatch.setattr(sandbox, "_passed", {})  # past the moment a pass is remembered
    limits = sandbox.limits_for(1024, 10.0, 16, 64, "cpu")
    for mode in ("auto", "bwrap"):
        with pytest.raises(sandbox.SandboxRefused, match="--sandbox none"):
            sandbox.plan(
                sandbox.PlanInputs(
                    python=Path(sys.executable),
                    probe_dir=tmp_path,
                    scratch=tmp_path,
                    cwd=tmp_path,
                    read_paths=[],
                    limits=limits,
                    mode=mode,
                )
            )
    monkeypatch.setattr(sandbox, "_bwrap_try", lambda path, extra: None)
    assert sandbox.bwrap_state().state == "works"  # the failures were not remembered
