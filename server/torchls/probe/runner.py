"""Cold runs: a fresh sandboxed interpreter per repro (`run_repro`), and the shared finishing.

In: a target file, `ReproOptions`, an optional progress callback and cancel event. Out: a
`ReproReport` (always, whatever the child did), `ReproUsageError` when the request cannot be run,
`ReproCancelled` once a cancelled run's processes are gone. The run's folder (scratch.py) is
removed afterwards; the user's files are only ever read, and what the run left behind is read
back without trusting it (no link followed, no FIFO opened, bounded sizes).
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchls.notebook import script_json
from torchls.probe import causes, untrusted
from torchls.probe.options import ReproOptions, ReproUsageError
from torchls.probe.prepare import Prepared, prepare
from torchls.probe.process import Ended, supervise
from torchls.probe.report import ReproReport, load_probe_report, synthesize
from torchls.probe.sandbox import Layer, limits_for, plan, protections_line
from torchls.probe.scratch import RunFolder, Unreadable, open_regular, read_head_tail
from torchls.probe.view import ProjectView
from torchls.records import record, replace

# Beyond the probe's own alarm: time to write a partial report before the hard kill.
KILL_GRACE_S = 3.0
OUTPUT_HEAD = 4096
OUTPUT_TAIL = 4096
REPORT_READ_LIMIT = 16 << 20


class ReproCancelled(Exception):
    """The run was cancelled; every process it started is gone."""


@record(frozen=True)
class ProgressEvent:
    """`stage`: start, import, run, setup, step, report or done; `message` is for people."""

    stage: str
    message: str
    step: int | None = None
    total: int | None = None


ProgressCallback = Callable[[ProgressEvent], None]


def run_repro(
    path: str | Path,
    options: ReproOptions | None = None,
    *,
    on_progress: ProgressCallback | None = None,
    cancel_event: threading.Event | None = None,
) -> ReproReport:
    """Run one bounded repro of `path` in a fresh sandboxed interpreter and return its report."""
    prepared = prepare(path, options)
    return run_cold(prepared, on_progress, cancel_event)


def run_cold(
    prepared: Prepared,
    on_progress: ProgressCallback | None,
    cancel_event: threading.Event | None,
    extras: Extras | None = None,
) -> ReproReport:
    """One cold run (with `extras`: an inspection, or one side of a comparison)."""
    started = time.monotonic()
    distributed = prepared.resolved.options.nproc is not None
    if distributed and extras is not None:
        raise ReproUsageError("--nproc cannot be combined with --compare or inspect")
    folder = RunFolder.create(prepared.probe_package, cold=True)
    try:
        if distributed:
            from torchls.probe.distributed import run_in

            report = run_in(prepared, folder, started, on_progress, cancel_event)
        else:
            report = _run_in(prepared, folder, started, on_progress, cancel_event, extras)
    finally:
        folder.remove()
    report.data["timing"]["server_wall_s"] = round(time.monotonic() - started, 4)
    notify(on_progress, ProgressEvent("done", f"done: {report.status}"))
    return report


def _run_in(
    prepared: Prepared,
    folder: RunFolder,
    started: float,
    on_progress: ProgressCallback | None,
    cancel_event: threading.Event | None,
    extras: Extras | None = None,
) -> ReproReport:
    r = prepared.resolved
    extras = extras or Extras()
    limits = limits_for(
        r.memory_mb, r.timeout_s, r.options.file_size_mb, r.options.max_processes, r.device
    )
    request = prepared.request(folder.report, folder.output)
    outputs: tuple[Path, ...] = (folder.report, folder.output)
    if extras.mode is not None:
        request["mode"] = extras.mode
    if extras.rewrite_to is not None or extras.save_initial_to is not None:
        # One more file the run may write, bound like the report: the rewritten checkpoint,
        # or the models' initial weights for the other side of a comparison.
        os.close(os.open(folder.rewrite, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        key = "rewrite" if extras.rewrite_to is not None else "initial_save"
        request[key] = str(folder.rewrite)
        outputs += (folder.rewrite,)
    if extras.load_initial_from is not None:
        # Read by the run from the probe's read-only folder, like its request.
        staged = folder.probe / "initial.pt"
        shutil.copyfile(extras.load_initial_from, staged)
        request["initial_load"] = str(staged)
    if extras.seed is not None:
        request["seed"] = extras.seed
    project = open_view(prepared, folder.root / "view")
    if project.linked:
        # No mount namespace: the run starts in the copy of its folder instead.
        request["cwd"] = str(project.copy_of(prepared.cwd))
    folder.seal(request)
    launch = plan(
        python=prepared.python,
        probe_dir=folder.probe,
        scratch=folder.home,
        cwd=prepared.root,
        read_paths=list(prepared.read_paths),
        limits=limits,
        mode=r.options.sandbox,
        extra_env=r.options.pass_env,
        outputs=outputs,
        project=project,
        network=r.options.network,
    )
    try:
        argv = [
            *launch.argv_prefix,
            str(prepared.python),
            "-m",
            "torchls_probe",
            "--request",
            str(folder.request_file),
            "--progress",
            "stdout",
        ]
        notify(on_progress, ProgressEvent("start", "starting interpreter"))
        ended = supervise(
            argv,
            env=launch.env,
            cwd=project.copy_of(prepared.cwd) if project.linked else prepared.root,
            preexec=launch.preexec,
            deadline=started + r.timeout_s + KILL_GRACE_S,
            cancel=cancel_event,
            on_message=lambda message: forward_progress(message, on_progress),
            stderr_path=folder.stderr,
            cgroup=launch.cgroup,
            watch=disk_watch(project, limits.file_size_mb),
        )
        if ended.killed_for == "cancel":
            raise ReproCancelled("the repro was cancelled")
        if launch.argv_prefix and ended.returncode is not None and ended.returncode > 128:
            # bubblewrap reports a child killed by signal N as exit status 128 + N.
            ended = replace(ended, returncode=128 - ended.returncode)
        layers = [*launch.layers, wall_clock_layer(r.timeout_s)]
        left = collect(folder)
        report = finish(prepared, request, left, ended, layers, launch.warnings, "cold")
        record_writes(report, prepared, project)
        if extras.rewrite_to is not None:
            _copy_rewritten(report, folder.rewrite, extras.rewrite_to)
        if extras.save_initial_to is not None:
            _copy_out(folder.rewrite, extras.save_initial_to)
        return report
    finally:
        launch.close()


@record(frozen=True)
class Extras:
    """What a cold run does beyond a plain repro: `mode` "inspect" reads the file as a
    checkpoint (`rewrite_to`: and writes its plain-data copy there); `save_initial_to` keeps the
    models' weights at their first call, `load_initial_from` starts them from such a file (the
    two sides of `--compare`); `seed` replaces the options' seed (`--repeat`)."""

    mode: str | None = None
    rewrite_to: Path | None = None
    save_initial_to: Path | None = None
    load_initial_from: Path | None = None
    seed: int | None = None


def _copy_out(written: Path, target: Path) -> bool:
    """Copy a file the run wrote (opened as untrusted: no link, regular only) to `target`."""
    try:
        source = open_regular(written)
    except OSError:
        return False
    try:
        with open(target, "wb") as out:
            while chunk := os.read(source, 1 << 20):
                out.write(chunk)
        return True
    except OSError:
        return False
    finally:
        os.close(source)


def _copy_rewritten(report: ReproReport, written: Path, target: Path) -> None:
    """Copy the run's rewritten checkpoint out, if the run says it verified it; the file lies
    where the run could write, so it is opened like any run file (no link, regular only)."""
    rewritten = (report.data.get("inspection") or {}).get("rewritten")
    if not isinstance(rewritten, dict) or rewritten.get("verified") is not True:
        return
    try:
        source = open_regular(written)
    except OSError as error:
        rewritten.update(verified=False, problem=f"the rewritten file is unusable: {error}")
        return
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL  # never over an existing file
        with os.fdopen(os.open(target, flags, 0o644), "wb") as out:
            while chunk := os.read(source, 1 << 20):
                out.write(chunk)
        rewritten["path"] = str(target)
    except OSError as error:
        rewritten.update(verified=False, problem=f"{target} could not be written: {error}")
    finally:
        os.close(source)


@record(frozen=True)
class Left:
    """What a run left for the server: the probe's report, or why there is none, and the
    user's output (`bytes`, `head`, `tail`, `truncated`, and a `note` when unreadable)."""

    report: dict[str, Any] | None
    problem: str | None
    output: dict[str, Any]


def collect(folder: RunFolder) -> Left:
    """Read back a cold run's report and output; both lie where the run could write (without
    bubblewrap, anything; with it, their contents), so neither is trusted to be a small file."""
    data, problem = load_probe_report(folder.report, REPORT_READ_LIMIT)
    return Left(data, problem, _output(folder.output))


def notify(callback: ProgressCallback | None, event: ProgressEvent) -> None:
    if callback is not None:
        callback(event)


def forward_progress(message: dict[str, Any], callback: ProgressCallback | None) -> None:
    if message.get("event") != "progress" or callback is None:
        return
    step, total = message.get("step"), message.get("total")
    # The run writes these lines: they reach a terminal and the editor's progress UI.
    callback(
        ProgressEvent(
            stage=untrusted.one_line(message.get("stage", ""), 40),
            message=untrusted.one_line(message.get("message", ""), 200),
            step=step if isinstance(step, int) else None,
            total=total if isinstance(total, int) else None,
        )
    )


def wall_clock_layer(timeout_s: float) -> Layer:
    return Layer("wall_clock", True, f"killed {KILL_GRACE_S:g} s after the {timeout_s:g} s limit")


def open_view(prepared: Prepared, base: Path) -> ProjectView:
    """The run's copy of the project root, its folder and the extra writable folders."""
    from torchls.probe.sandbox import bwrap_decision

    # Decided before anything is copied: a bubblewrap that is installed but fails refuses the
    # run here (`SandboxRefused`), so no run ever starts with a weaker plan than asked for.
    found = bwrap_decision(prepared.resolved.options.sandbox)
    return ProjectView.create(prepared.copied, base, linked=found.state != "works")


def disk_watch(project: ProjectView, budget_mb: int) -> Callable[[], str | None]:
    """A check the supervisor runs every second: the copies may grow by the file-size limit
    (what a private tmpfs of the sandbox holds), no more; they are on the host's disk."""
    start = project.usage(1 << 62)
    limit = start + (max(budget_mb, 1) << 20)

    def check() -> str | None:
        return "disk" if project.usage(limit) > limit else None

    return check


def record_writes(report: ReproReport, prepared: Prepared, project: ProjectView) -> None:
    """The files the run wrote into the project's copy (`written`), kept if asked, and the
    sandbox's part in a failure (`causes.explain`)."""
    changes = project.changes()
    written: dict[str, Any] = {
        "folders": [str(s.original) for s in project.sources],
        "files": [item.to_json() for item in changes.written],
        "removed": changes.removed,
        "bytes": changes.total_bytes,
        "truncated": changes.truncated,
        "kept_in": None,
        "left_out": {
            str(s.original / relative): why
            for s in project.sources
            for relative, why in list(s.excluded.items())[:50]
        },
    }
    keep = prepared.resolved.options.keep_outputs
    if keep and changes.written:
        target = Path(keep).expanduser().absolute()
        problems = project.keep(changes, target)
        written["kept_in"] = str(target)
        if problems:
            written["keep_problems"] = problems[:20]
    report.data["written"] = written
    report.data.setdefault("notes", []).extend(prepared.notes)
    if prepared.notebook is not None and isinstance(report.data.get("target"), dict):
        report.data["target"]["notebook"] = script_json(prepared.notebook)
    causes.explain(report, prepared, project)


def finish(
    prepared: Prepared,
    request: dict[str, Any],
    left: Left,
    ended: Ended,
    layers: list[Layer],
    warnings: list[str],
    runner: str,
) -> ReproReport:
    """The final report: the probe's (or a synthesised one) plus sandbox, output and timing."""
    data = left.report
    if data is None:
        data = _without_report(prepared, request, ended, left.problem)
    elif ended.killed_for == "deadline":
        data.setdefault("notes", []).append("the process was killed at the deadline")
    output = dict(left.output)
    if output["bytes"] > request["output_cap_bytes"] and "note" not in output:
        output["note"] = "output past the cap bypassed Python (a C library or os.write)"
    layer_json = [layer.to_json() for layer in layers]
    sandbox = {
        "layers": layer_json,
        "degraded": [layer.name for layer in layers if not layer.held],
        "warnings": warnings,
        # The report's first line when fewer than every protection held (None: all held).
        "summary": protections_line(layer_json),
    }
    final: dict[str, Any] = {}
    for key, value in data.items():
        final[key] = value
        if key == "environment":
            final["sandbox"] = sandbox
        if key == "exception":
            final["output"] = output
    final.setdefault("sandbox", sandbox)
    final.setdefault("output", output)
    timing = dict(final.get("timing") or {})
    timing.update(runner=runner, child_wall_s=round(ended.wall_s, 4))
    final["timing"] = timing
    return ReproReport(final, root=str(prepared.root), allow=(str(prepared.file),))


def _without_report(
    prepared: Prepared, request: dict[str, Any], ended: Ended, problem: str | None
) -> dict[str, Any]:
    file = str(prepared.file)
    timeout = request["timeout_s"]
    if ended.killed_for == "disk":
        return synthesize(
            status="error",
            file=file,
            code="TL906",
            stopped_by="disk",
            message="stopped: the run wrote more into the project's copy than the file-size "
            f"limit of {prepared.resolved.options.file_size_mb} MB allows in all",
            request=request,
        )
    if ended.killed_for == "deadline":
        return synthesize(
            status="timeout",
            file=file,
            code="TL906",
            stopped_by="timeout",
            message=f"stopped by the wall-clock limit of {timeout:g} s; the code never returned "
            "to Python (stuck in a C extension?), so no line is known",
            request=request,
        )
    code = ended.returncode
    stderr = ended.stderr.strip().splitlines()
    last = stderr[-1] if stderr else ""
    if code is not None and code < 0:
        name = _signal_name(-code)
        if -code == signal.SIGXCPU:
            return synthesize(
                status="timeout",
                file=file,
                code="TL906",
                stopped_by="cpu",
                message="stopped by the CPU-time limit",
                request=request,
            )
        why = (
            " (the out-of-memory killer or the CPU-time limit?)" if -code == signal.SIGKILL else ""
        )
        message = f"the interpreter was killed by {name}{why} before it wrote a report"
    elif problem is not None:
        message = f"the probe exited with status {code} and its report was refused: {problem}"
    else:
        message = f"the probe exited with status {code} without a report: {last or 'no output'}"
    data = synthesize(
        status="crashed",
        file=file,
        code="TL905",
        stopped_by="crash",
        message=message,
        request=request,
    )
    if problem is not None:
        data["notes"].append(f"report refused: {problem}")
    data["notes"].append(f"stderr: {ended.stderr[-2000:]}" if ended.stderr else "stderr: empty")
    return data


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _output(path: Path) -> dict[str, Any]:
    """The user's stdout+stderr: total size, and the head and tail as text."""
    try:
        size, head, tail = read_head_tail(path, OUTPUT_HEAD, OUTPUT_TAIL)
    except Unreadable as error:
        return {"bytes": 0, "head": "", "tail": "", "truncated": False, "note": error.strerror}
    except OSError:
        return {"bytes": 0, "head": "", "tail": "", "truncated": False}
    return {
        "bytes": size,
        "head": head.decode("utf-8", "replace"),
        "tail": tail.decode("utf-8", "replace"),
        "truncated": size > OUTPUT_HEAD + OUTPUT_TAIL,
    }
