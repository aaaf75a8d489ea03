"""One launch pipeline for every repro: cold, distributed (torchrun) and warm runs.

Why: the three kinds of run used to repeat the same sequence, each with its own copy of the
sandbox's fourteen arguments. The sequence is here once (`execute`): limits, the probe's
request, the project's view, the sealed run folder, the sandbox plan, start and follow, read
back, the finished document and the files the run wrote. What differs is a `Strategy`: the
cold one supervises the child process; the distributed one (distributed.py) adds the ranks'
report files, the torchrun launcher, the rank progress and the merge; the warm one (warm.py)
starts and follows the run over the worker's channel instead.

In: a prepared run, a `LaunchSpec` (what to run), a run folder and a strategy. Out: the
report document as a dict, everything the server adds already in it; the caller makes the
`ReproReport` from it last (`make_report`), after its own timing.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchls.notebook import script_json
from torchls.probe import causes, untrusted
from torchls.probe.prepare import Prepared
from torchls.probe.process import Ended, supervise
from torchls.probe.report import ReproReport, as_report, load_probe_report, synthesize
from torchls.probe.sandbox import (
    Layer,
    Limits,
    PlanInputs,
    SandboxPlan,
    bwrap_decision,
    limits_for,
    plan,
    protections_line,
)
from torchls.probe.scratch import RunFolder, Unreadable, read_head_tail
from torchls.probe.view import ProjectView
from torchls.records import field, record, replace

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


@record(frozen=True)
class LaunchSpec:
    """What one launch runs. `command`: the argv after the sandbox's prefix (empty: the probe
    in the user's interpreter, reading the run folder's request); `outputs`: files besides the
    report and output that the run may write (they exist before it starts); `request`: fields
    added to the probe's request; `max_processes`: the process budget (None: the options');
    `loopback`: the run talks to itself over the network; `tree`: the child starts processes
    of its own that must be stopped with it; `runner`: "cold" or "warm", as the report's timing
    names it; `worker`: the warm worker's own launch (no rlimits of its own, a results folder,
    namespaces it makes itself); `start_message`: the progress line at the start."""

    command: tuple[str, ...] = ()
    outputs: tuple[Path, ...] = ()
    request: dict[str, Any] = field(default_factory=dict)
    max_processes: int | None = None
    loopback: bool = False
    tree: bool = False
    runner: str = "cold"
    worker: bool = False
    start_message: str = "starting interpreter"


@record(frozen=True)
class Left:
    """What a run left for the server: the probe's report, or why there is none, and the
    user's output (`bytes`, `head`, `tail`, `truncated`, and a `note` when unreadable)."""

    report: dict[str, Any] | None
    problem: str | None
    output: dict[str, Any]


@record
class Run:
    """One launch under way, as the strategy's steps see it."""

    prepared: Prepared
    spec: LaunchSpec
    folder: RunFolder
    request: dict[str, Any]
    view: ProjectView
    sandbox: SandboxPlan
    limits: Limits
    started: float
    on_progress: ProgressCallback | None = None
    cancel_event: threading.Event | None = None


class Strategy:
    """How a run is staged, started and followed, read back and described; by default a cold
    run of one supervised process. Subclasses change the steps that differ, never the order."""

    def request(self, prepared: Prepared, folder: RunFolder) -> dict[str, Any]:
        return prepared.request(folder.report, folder.output)

    def stage(
        self, prepared: Prepared, folder: RunFolder, spec: LaunchSpec, request: dict[str, Any]
    ) -> tuple[ProjectView, SandboxPlan]:
        return stage(prepared, folder, spec, request)

    def start(self, run: Run) -> Ended:
        """Start the run and follow it to its end."""
        r = run.prepared.resolved
        view, prepared = run.view, run.prepared
        command = run.spec.command or probe_command(prepared, run.folder)
        argv = [*run.sandbox.argv_prefix, *command]
        ended = supervise(
            argv,
            env=run.sandbox.env,
            cwd=view.copy_of(prepared.cwd) if view.linked else prepared.root,
            preexec=run.sandbox.preexec,
            deadline=run.started + r.timeout_s + KILL_GRACE_S,
            cancel=run.cancel_event,
            on_message=lambda message: self.on_message(message, run.on_progress),
            stderr_path=run.folder.stderr,
            cgroup=run.sandbox.cgroup,
            watch=disk_watch(view, run.limits.file_size_mb),
            tree=run.spec.tree,
        )
        if run.sandbox.argv_prefix and ended.returncode is not None and ended.returncode > 128:
            # bubblewrap reports a child killed by signal N as exit status 128 + N.
            ended = replace(ended, returncode=128 - ended.returncode)
        return ended

    def on_message(self, message: dict[str, Any], on_progress: ProgressCallback | None) -> None:
        forward_progress(message, on_progress)

    def collect(self, run: Run, ended: Ended) -> Left:
        return collect(run.folder)

    def layers(self, run: Run, ended: Ended) -> list[Layer]:
        return [*run.sandbox.layers, wall_clock_layer(run.prepared.resolved.timeout_s)]

    def close(self, run: Run) -> None:
        run.sandbox.close()


def execute(
    prepared: Prepared,
    spec: LaunchSpec,
    folder: RunFolder,
    strategy: Strategy | None = None,
    *,
    started: float,
    on_progress: ProgressCallback | None = None,
    cancel_event: threading.Event | None = None,
) -> dict[str, Any]:
    """The whole launch sequence, once: the report document with the sandbox, output, timing,
    written files, notes, notebook target and causes in it (no `ReproReport` yet)."""
    strategy = strategy or Strategy()
    limits = run_limits(prepared, spec)
    request = strategy.request(prepared, folder)
    request.update(spec.request)
    view, sandbox = strategy.stage(prepared, folder, spec, request)
    run = Run(prepared, spec, folder, request, view, sandbox, limits, started)
    run.on_progress, run.cancel_event = on_progress, cancel_event
    try:
        notify(on_progress, ProgressEvent("start", spec.start_message))
        ended = strategy.start(run)
        if ended.killed_for == "cancel":
            raise ReproCancelled("the repro was cancelled")
        left = strategy.collect(run, ended)
        layers = strategy.layers(run, ended)
        data = finish(prepared, request, left, ended, layers, sandbox.warnings, spec.runner)
        record_writes(data, prepared, view)
        return data
    finally:
        strategy.close(run)


def run_limits(prepared: Prepared, spec: LaunchSpec) -> Limits:
    """The rlimits of one launch. The warm worker has none of its own (each child sets its
    run's); its private tmpfs are sized like a cold run's, and emptied after each run."""
    r = prepared.resolved
    processes = spec.max_processes or r.options.max_processes
    if spec.worker:
        return Limits(0, 0, 0, processes, tmpfs_mb=r.options.file_size_mb, shm_mb=r.memory_mb)
    return limits_for(r.memory_mb, r.timeout_s, r.options.file_size_mb, processes, r.device)


def stage(
    prepared: Prepared, folder: RunFolder, spec: LaunchSpec, request: dict[str, Any] | None
) -> tuple[ProjectView, SandboxPlan]:
    """The project's view, the sealed folder (with `request`, or none for the warm worker) and
    the sandbox plan of one launch: every kind of run, the warm worker's own start included."""
    view = open_view(prepared, folder.root / "view")
    if request is not None and view.linked:
        # No mount namespace: the run starts in the copy of its folder instead.
        request["cwd"] = str(view.copy_of(prepared.cwd))
    folder.seal(request)
    return view, plan(plan_inputs(prepared, folder, view, spec))


def plan_inputs(
    prepared: Prepared, folder: RunFolder, view: ProjectView, spec: LaunchSpec
) -> PlanInputs:
    """What the sandbox confines for this launch, from the run, its folder, view and spec."""
    options = prepared.resolved.options
    return PlanInputs(
        python=prepared.python,
        probe_dir=folder.probe,
        scratch=folder.home,
        cwd=prepared.root,
        limits=run_limits(prepared, spec),
        mode=options.sandbox,
        read_paths=tuple(prepared.read_paths),
        extra_env=options.pass_env,
        outputs=() if spec.worker else (folder.report, folder.output, *spec.outputs),
        results=folder.results if spec.worker else None,
        own_namespaces=spec.worker,
        project=view,
        network=options.network,
        loopback=spec.loopback,
    )


def probe_command(
    prepared: Prepared, folder: RunFolder, launcher: tuple[str, ...] = ()
) -> list[str]:
    """The probe in the user's interpreter (behind `launcher`'s arguments, torchrun's) reading
    the run folder's request and writing its progress to stdout."""
    return [
        str(prepared.python),
        *launcher,
        "-m",
        "torchls_probe",
        "--request",
        str(folder.request_file),
        "--progress",
        "stdout",
    ]


def make_report(prepared: Prepared, data: dict[str, Any], started: float) -> ReproReport:
    """The run's `ReproReport`, made once from the finished document, with the server's wall
    time since `started`."""
    timing = dict(data.get("timing") or {})
    timing["server_wall_s"] = round(time.monotonic() - started, 4)
    data["timing"] = timing
    report, broken = as_report(data)
    if report is None:  # the server's own part broke the schema: a bug here, said as one
        report, _ = as_report(
            synthesize(
                status="error",
                file=str(prepared.file),
                code="TL905",
                stopped_by="setup",
                message="internal error of torchls: the finished report broke the report "
                f"schema ({'; '.join(broken)}); please report this",
                request=prepared.request(None, None),
            )
        )
        assert report is not None
    return ReproReport(report, root=str(prepared.root), allow=(str(prepared.file),))


def not_started(prepared: Prepared, data: dict[str, Any]) -> dict[str, Any]:
    """The finished document of a run refused before it started (`data` says why)."""
    request = {**prepared.request(None, None), "output_cap_bytes": 1 << 20}
    left = Left(data, None, {"bytes": 0, "head": "", "tail": "", "truncated": False})
    return finish(prepared, request, left, Ended(None, None, 0.0, ""), [], [], "cold")


def collect(folder: RunFolder) -> Left:
    """Read back a cold run's report and output; both lie where the run could write (without
    bubblewrap, anything; with it, their contents), so neither is trusted to be a small file."""
    data, problem = load_probe_report(folder.report, REPORT_READ_LIMIT)
    return Left(data, problem, read_output(folder.output))


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


def record_writes(data: dict[str, Any], prepared: Prepared, project: ProjectView) -> None:
    """The files the run wrote into the project's copy (`written`), kept if asked, the
    preparation's notes, the notebook target and the sandbox's part in a failure
    (`causes.explain`), all into the report document `data`."""
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
    data["written"] = written
    data.setdefault("notes", []).extend(prepared.notes)
    if prepared.notebook is not None and isinstance(data.get("target"), dict):
        data["target"]["notebook"] = script_json(prepared.notebook)
    causes.explain(data, prepared, project)


def finish(
    prepared: Prepared,
    request: dict[str, Any],
    left: Left,
    ended: Ended,
    layers: list[Layer],
    warnings: list[str],
    runner: str,
) -> dict[str, Any]:
    """The report document: the probe's (or a synthesised one) plus sandbox, output and
    timing."""
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
    return final


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


def read_output(path: Path) -> dict[str, Any]:
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
