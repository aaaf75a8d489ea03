"""The sandbox fails closed (issue #31 item 1): a bubblewrap that is installed but fails refuses
the run, a transient failure is retried and never remembered, and only a machine without
bubblewrap runs degraded, saying so first in every report and on every CLI run.

A warm worker decides bubblewrap when it starts; each of its runs decides again, and refuses or
goes cold as a cold run would.

The failing bubblewraps are wrapper scripts put first on PATH: one that always exits 1, one
that fails its first call and then hands every call to the real bubblewrap. The hidden-style
case writes a checkpoint into /tmp and a dot file into the home, by name, as a script that
hides its side effects would; those writes must reach the host in no mode but `none`.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from torchls.probe import ReproOptions, run_repro
from torchls.probe import sandbox as sandbox_module
from torchls.probe.options import ReproUsageError
from torchls.probe.prepare import prepare
from torchls.probe.sandbox import SandboxRefused, bwrap_state, protections_line
from torchls.probe.warm import ReproSession

REAL_BWRAP = shutil.which("bwrap")
needs_bwrap = pytest.mark.skipif(
    REAL_BWRAP is None or sandbox_module._bwrap_try(REAL_BWRAP, ()) is not None,
    reason="bubblewrap is not usable here",
)

# Writes where the host would keep them: /tmp/<name>.pt, and ~/.<marker> both as `~` says
# (the sandbox's HOME) and as the password database says (the real home).
HIDDEN = """\
import os, pwd, sys
import torch

name, marker = sys.argv[1], sys.argv[2]
model = torch.nn.Linear(4, 1)
targets = [
    f"/tmp/{name}.pt",
    os.path.expanduser(f"~/.{marker}"),
    os.path.join(pwd.getpwuid(os.geteuid()).pw_dir, f".{marker}"),
]
for target in targets:
    try:
        if target.endswith(".pt"):
            torch.save(model.state_dict(), target)
        else:
            with open(target, "w") as handle:
                handle.write("planted")
        print("WROTE", target)
    except OSError as error:
        print("REFUSED", target, error.errno)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):  # the repro stops at its step bound: the writes come before
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def _host_targets(name: str, marker: str) -> list[Path]:
    home = Path(os.path.expanduser("~"))
    real_home = Path(pwd.getpwuid(os.geteuid()).pw_dir)
    return [Path("/tmp") / f"{name}.pt", home / f".{marker}", real_home / f".{marker}"]


@pytest.fixture
def hidden(project: Path):
    """The hidden-style case in the project, and the host paths it would write (removed
    afterwards whatever happened, so a failing test leaves nothing behind)."""
    name, marker = f"torchls-hidden-{uuid.uuid4().hex}", f"torchls-marker-{uuid.uuid4().hex}"
    path = project / "train.py"
    path.write_text(HIDDEN, encoding="utf-8")
    targets = _host_targets(name, marker)
    yield path, (name, marker), targets
    for target in targets:
        target.unlink(missing_ok=True)


def _options(argv: tuple[str, ...], **changes: object) -> ReproOptions:
    return ReproOptions(python=sys.executable, timeout_s=60.0, device="cpu", argv=argv, **changes)  # type: ignore[arg-type]


def _wrapper(folder: Path, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "bwrap"
    script.write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
    script.chmod(0o755)
    return script


def _failing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    calls = tmp_path / "calls"
    folder = tmp_path / "failing-bin"
    _wrapper(folder, f'echo x >> "{calls}"\necho "bwrap: simulated failure" >&2\nexit 1')
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return calls


def _fails_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    state = tmp_path / "failed-once"
    folder = tmp_path / "flaky-bin"
    _wrapper(
        folder,
        f'if [ ! -e "{state}" ]; then : > "{state}"; echo "bwrap: transient" >&2; exit 1; fi\n'
        f'exec "{REAL_BWRAP}" "$@"',
    )
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return state


def _without_bwrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A PATH on which no bubblewrap is found: this interpreter's folder and an empty one."""
    empty = tmp_path / "no-bwrap-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{empty}")
    assert shutil.which("bwrap") is None


def _layer(report, name: str) -> dict:
    return next(layer for layer in report.data["sandbox"]["layers"] if layer["name"] == name)


@pytest.mark.parametrize("mode", ["auto", "bwrap"])
def test_a_bubblewrap_that_fails_refuses_the_run(hidden, tmp_path, monkeypatch, mode):
    path, argv, targets = hidden
    calls = _failing(tmp_path, monkeypatch)
    with pytest.raises(SandboxRefused) as refused:
        run_repro(path, _options(argv, sandbox=mode))
    message = str(refused.value)
    assert message.startswith(f"sandbox refused (--sandbox {mode}): bubblewrap is installed")
    assert "bwrap: simulated failure" in message  # the reason
    assert "--sandbox none" in message  # the way to opt out
    # Retried with a back-off before refusing, and never started the run.
    assert calls.read_text().count("x") == 1 + len(sandbox_module.BWRAP_RETRY_S)
    for target in targets:
        assert not target.exists(), target


@needs_bwrap
def test_a_failure_is_not_remembered_for_later_runs(hidden, tmp_path, monkeypatch):
    """The trial ran once per process (lru_cache): one failure weakened every later run of the
    language server. Now the next run tries again and, bubblewrap working, runs sandboxed."""
    path, argv, targets = hidden
    saved = os.environ["PATH"]
    _failing(tmp_path, monkeypatch)
    with pytest.raises(SandboxRefused):
        run_repro(path, _options(argv))
    monkeypatch.setenv("PATH", saved)
    report = run_repro(path, _options(argv))
    assert report.status == "ok", report.data.get("exception")
    assert _layer(report, "bubblewrap")["held"]
    for target in targets:
        assert not target.exists(), target


@needs_bwrap
def test_a_bubblewrap_that_fails_once_then_works_runs_sandboxed(hidden, tmp_path, monkeypatch):
    path, argv, targets = hidden
    state = _fails_once(tmp_path, monkeypatch)
    report = run_repro(path, _options(argv))
    assert state.exists()  # the first trial did fail
    assert report.status == "ok", report.data.get("exception")
    bwrap = _layer(report, "bubblewrap")
    assert bwrap["held"] and bwrap["detail"] == str(tmp_path / "flaky-bin" / "bwrap")
    assert report.data["sandbox"]["summary"] is None  # the full set held
    output = report.data["output"]["head"]
    assert "WROTE /tmp/" in output  # into the sandbox's private /tmp
    for target in targets:
        assert not target.exists(), target


@needs_bwrap
@pytest.mark.parametrize("mode", ["auto", "bwrap"])
def test_hidden_writes_never_reach_the_host_with_a_working_bubblewrap(hidden, mode):
    path, argv, targets = hidden
    report = run_repro(path, _options(argv, sandbox=mode))
    assert report.status == "ok", report.data.get("exception")
    assert _layer(report, "filesystem")["held"] and _layer(report, "home")["held"]
    for target in targets:
        assert not target.exists(), target


def test_without_bubblewrap_auto_runs_degraded_and_says_so_first(hidden, tmp_path, monkeypatch):
    """Kept as before (limits only), but named as such: the report's summary, which the CLI
    prints first, lists what is active and what is not."""
    path, argv, _targets = hidden
    _without_bwrap(tmp_path, monkeypatch)
    report = run_repro(path, _options(argv))
    summary = report.data["sandbox"]["summary"]
    assert summary.startswith("sandbox DEGRADED (bubblewrap is not installed")
    active, missing = summary.split("; NOT active: ")
    assert "memory" in active and "wall_clock" in active
    for name in ("bubblewrap", "filesystem", "home", "pid_namespace"):
        assert name in missing.split(", ")
    with pytest.raises(ReproUsageError, match="--sandbox bwrap"):
        run_repro(path, _options(argv, sandbox="bwrap"))  # asked for, absent: refused


def test_none_is_the_one_mode_whose_writes_reach_the_host(hidden, tmp_path, monkeypatch):
    path, argv, targets = hidden
    _failing(tmp_path, monkeypatch)  # not even tried: none asks for no sandbox
    report = run_repro(path, _options(argv, sandbox="none"))
    assert report.status == "ok", report.data.get("exception")
    assert report.data["sandbox"]["summary"].startswith(
        "sandbox DEGRADED (disabled by request (--sandbox none))"
    )
    assert targets[0].exists()  # /tmp/<name>.pt: documented, the user opted out


def _cli(path: Path, argv: tuple[str, ...], env_path: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *(sys.executable, "-m", "torchls", "repro", path.name),
            *("--python", sys.executable, "--device", "cpu", "--args", " ".join(argv)),
        ],
        capture_output=True,
        text=True,
        cwd=path.parent,
        timeout=180,
        check=False,
        env={**os.environ, "PATH": env_path},
    )


def test_cli_refuses_with_the_reason_and_the_opt_out(hidden, tmp_path, monkeypatch):
    path, argv, _targets = hidden
    _failing(tmp_path, monkeypatch)
    done = _cli(path, argv, os.environ["PATH"])
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("torchls: error: sandbox refused (--sandbox auto)")
    assert "bwrap: simulated failure" in done.stderr and "--sandbox none" in done.stderr


def test_cli_without_bubblewrap_says_degraded_first_and_on_stderr(hidden, tmp_path, monkeypatch):
    path, argv, _targets = hidden
    _without_bwrap(tmp_path, monkeypatch)
    done = _cli(path, argv, os.environ["PATH"])
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith("torchls: sandbox DEGRADED (bubblewrap is not installed")
    assert "NOT active: bubblewrap, filesystem, home" in first
    assert f"torchls: warning: {first.removeprefix('torchls: ')}" in done.stderr


@needs_bwrap
def test_cli_with_a_working_bubblewrap_prints_no_degraded_line(hidden):
    path, argv, targets = hidden
    done = _cli(path, argv, os.environ["PATH"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("torchls repro train.py: ok")
    assert "DEGRADED" not in done.stdout + done.stderr
    for target in targets:
        assert not target.exists(), target


def test_a_trial_failure_is_retried_and_never_cached(tmp_path, monkeypatch):
    calls = tmp_path / "calls"
    script = _wrapper(tmp_path / "bin", f'echo x >> "{calls}"\nexit 1')
    monkeypatch.setenv("PATH", str(script.parent))
    monkeypatch.setattr(sandbox_module, "BWRAP_RETRY_S", (0.0, 0.0))
    first, second = bwrap_state(), bwrap_state()
    assert first.state == second.state == "fails" and first.path == str(script)
    assert first.tries == 3
    # A bubblewrap that says nothing still gets a reason the user can act on.
    assert "exit status 1: no message" in first.detail
    assert calls.read_text().count("x") == 6  # each call tried again: nothing remembered
    assert not sandbox_module.bwrap_sizes_tmpfs()
    assert not sandbox_module.bwrap_disables_userns()


def test_the_protections_line_names_active_and_missing_layers():
    full = [{"name": "bubblewrap", "held": True, "detail": "/usr/bin/bwrap"}]
    assert protections_line(full) is None
    weaker = [*full, {"name": "home", "held": False, "detail": "NOT hidden"}]
    assert protections_line(weaker) == (
        "sandbox: fewer protections than the full set: active: bubblewrap; NOT active: home"
    )
    absent = [
        {"name": "bubblewrap", "held": False, "detail": "bubblewrap is not installed"},
        {"name": "memory", "held": True, "detail": "RLIMIT_AS"},
    ]
    assert protections_line(absent) == (
        "sandbox DEGRADED (bubblewrap is not installed): active: memory; NOT active: bubblewrap"
    )


@needs_bwrap
def test_a_warm_run_rechecks_bubblewrap_and_refuses_as_a_cold_run(hidden, tmp_path, monkeypatch):
    """The warm worker is started with bubblewrap decided once; each run decides again. A
    bubblewrap that fails by the time of a run refuses that run (the reason and the opt-out),
    as a cold run would, and the worker serves the next run once bubblewrap works again."""
    path, argv, targets = hidden
    options = _options(argv)
    session = ReproSession()
    try:
        session.prewarm_prepared(prepare(path, options), wait=True)
        saved = os.environ["PATH"]
        calls = _failing(tmp_path, monkeypatch)
        with pytest.raises(SandboxRefused) as refused:
            session.run(path, options)
        message = str(refused.value)
        assert message.startswith("sandbox refused (--sandbox auto): bubblewrap is installed")
        assert "bwrap: simulated failure" in message and "--sandbox none" in message
        # Tried with the back-off of a cold run's decision, once for this run.
        assert calls.read_text().count("x") == 1 + len(sandbox_module.BWRAP_RETRY_S)
        for target in targets:
            assert not target.exists(), target
        monkeypatch.setenv("PATH", saved)
        report = session.run(path, options)
        assert report.data["timing"]["runner"] == "warm"
        assert report.status == "ok", report.data.get("exception")
        assert _layer(report, "bubblewrap")["held"]
    finally:
        session.close()


@needs_bwrap
def test_a_warm_worker_started_without_bubblewrap_sends_runs_cold_once_it_works(
    hidden, tmp_path, monkeypatch
):
    """A worker started where no bubblewrap was found runs degraded; once bubblewrap is there,
    a run through that worker would be weaker than a cold run, so it runs cold, sandboxed."""
    path, argv, targets = hidden
    options = _options(argv)
    saved = os.environ["PATH"]
    session = ReproSession()
    try:
        _without_bwrap(tmp_path, monkeypatch)
        session.prewarm_prepared(prepare(path, options), wait=True)
        degraded = session.run(path, options)
        assert degraded.data["timing"]["runner"] == "warm"
        assert not _layer(degraded, "bubblewrap")["held"]
        for target in targets:
            target.unlink(missing_ok=True)  # a degraded run may write them: that is the mode
        monkeypatch.setenv("PATH", saved)
        report = session.run(path, options)
        assert report.data["timing"]["runner"] == "cold"
        assert report.status == "ok", report.data.get("exception")
        assert _layer(report, "bubblewrap")["held"]
        for target in targets:
            assert not target.exists(), target
    finally:
        session.close()
