"""One bounded, traced run from request to report file.

In: a validated `Request` and a progress channel. Out: the report written to `request.out`
(atomically), and a process exit code: 0 when a report was written, 3 when not even that was
possible. Torch is imported here, after the device environment is prepared, so that hiding or
selecting CUDA devices takes effect; the warm worker has imported torch already and only serves
CPU runs, for which that makes no difference.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import signal
import sys
import time
import traceback
from typing import Any

from torchls_probe.attribution import Location, UserCode
from torchls_probe.bounds import ProbeLimit, ProbeStop, arm_alarm, capture_output, disarm_alarm
from torchls_probe.device import DeviceError, prepare_environment
from torchls_probe.findings import Outcome
from torchls_probe.progress import Progress
from torchls_probe.request import Request

# Seconds kept back from the wall-clock limit to write a partial report before the server kills.
_REPORT_MARGIN = 1.0

_LIMIT_TEXT = {
    "timeout": "stopped by the wall-clock limit of {timeout:g} s",
    "cpu": "stopped by the CPU-time limit",
    "output": "stopped: output exceeded the cap of {cap} bytes",
    "memory": "stopped by the memory limit of {memory} MB: {message}",
}


def run(request: Request, progress: Progress, started: float | None = None) -> int:
    started = time.monotonic() if started is None else started
    timing: dict[str, float] = {}
    outcome = Outcome()
    from torchls_probe import ranks

    # A rank of a distributed repro: its own report file, a budget counted from the launch.
    identity = ranks.adopt(request, started)
    if identity is not None:
        progress.rank = identity.rank
    if request.output_file:
        budget = capture_output(request.output_file, request.output_cap_bytes)
    else:
        budget = None
    # A segfault in the user's code (or an extension) leaves its Python stack in the output.
    faulthandler.enable()
    if request.mode != "inspect":
        from torchls_probe import terminal

        terminal.attach()
    if "torch" not in sys.modules:
        prepare_environment(request.device)
    late = identity.late_s if identity is not None else 0.0
    arm_alarm(started - late + max(0.5, request.timeout_s - _REPORT_MARGIN))
    if request.mode == "inspect":
        return _inspect(request, started)
    state: dict[str, Any] = {"identity": identity}
    try:
        _run_traced(request, progress, outcome, state, timing, started)
    except BaseException as error:
        disarm_alarm()  # first: a repeat of the alarm must not interrupt the bookkeeping
        _classify(error, request, outcome, state)
    finally:
        disarm_alarm()
        undo = state.get("undo")
        if undo is not None:
            undo()
    if budget is not None and budget.exceeded and outcome.stopped_by != "output":
        outcome.notes.append(f"output beyond {request.output_cap_bytes} bytes was dropped")
    timing["run_s"] = time.monotonic() - started - timing.get("import_s", 0.0)
    progress.emit("report", "writing report")
    return _write(request, outcome, state, timing, started)


def _inspect(request: Request, started: float) -> int:
    """`torchls inspect`: the checkpoint's record instead of a run's trace (no user code)."""
    from torchls_probe import checkpoint
    from torchls_probe.findings import finding
    from torchls_probe.report import checked, skeleton

    report = skeleton("ok", "end", request.file, [])
    report.update(mode="inspect", target={"file": request.file, "root": request.root})
    try:
        record = checkpoint.inspect(request.file)
        report["inspection"] = record
        if request.rewrite and record["weights_only"]["loads"] is False:
            try:
                record["rewritten"] = checkpoint.rewrite_plain(request.file, request.rewrite)
            except Exception as error:  # the user's own classes may be missing here
                problem = f"{type(error).__name__}: {error}"[:500]
                record["rewritten"] = {"verified": False, "changed": [], "problem": problem}
        verdict = record["weights_only"]
        if verdict["loads"] is False:
            blocking = ", ".join(f"{b['path']}: {b['global']}" for b in verdict["blocking"][:8])
            message = "torch.load(weights_only=True) refuses this checkpoint" + (
                f"; blocked by {blocking}" if blocking else f": {verdict['note']}"
            )
            report["findings"].append(finding("TL911", "error", Location(request.file, 1), message))
    except checkpoint.InspectError as error:
        report.update(status="error", exception={"kind": "input", "type": "InspectError"})
        report["exception"]["message"] = str(error)
    except BaseException as error:  # a limit, or a bug here: still a report, never a traceback
        disarm_alarm()
        report.update(status="error", exception={"kind": "input", "type": type(error).__name__})
        report["exception"]["message"] = f"the file could not be inspected: {error}"[:500]
    finally:
        disarm_alarm()
    report["timing"] = {"total_s": time.monotonic() - started}
    text = json.dumps(checked(json.loads(json.dumps(report, default=str))), allow_nan=False)
    if request.out is None:
        sys.__stdout__.write(text + "\n")
        return 0
    try:
        with open(request.out, "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError:
        return 3
    return 0


def _run_traced(
    request: Request,
    progress: Progress,
    outcome: Outcome,
    state: dict[str, Any],
    timing: dict[str, float],
    started: float,
) -> None:
    progress.emit("import", "importing torch")
    try:
        with _limits_for_the_main_thread():
            import torch  # noqa: F401
    except Exception as error:  # not BaseException: a limit striking here is still a limit
        outcome.status, outcome.stopped_by = "error", "setup"
        outcome.exception = _exception(error, None, None, kind="setup")
        outcome.exception["message"] = (
            f"torch cannot be imported by {sys.executable}: {error} "
            "(choose the interpreter that has your torch with --python)"
        )
        return
    timing["import_s"] = time.monotonic() - started

    from torchls_probe import device as devices
    from torchls_probe import environment
    from torchls_probe.hooks import Hooks
    from torchls_probe.params import Roots
    from torchls_probe.tracer import Trace, Tracer

    try:
        state["device"] = devices.resolve(request.device, request.allow_fallback)
    except DeviceError as error:
        outcome.status, outcome.stopped_by = "error", "setup"
        outcome.exception = _exception(error, None, None, kind="device")
        return
    determinism = environment.seed_everything(request.seed, request.deterministic)
    state["environment"] = environment.describe(request.command, request.root, determinism)
    files = [request.file]
    user = UserCode([request.root or os.path.dirname(request.file)], files, _torch_dirs())
    trace = Trace(user, request.max_lines, request.max_entries_per_line, request.max_events)
    roots = Roots(user)
    hooks = Hooks(trace, roots, request.steps, request.batch_cap, progress)
    hooks.initial_save, hooks.initial_load = request.initial_save, request.initial_load
    state.update(trace=trace, roots=roots, hooks=hooks, user=user)
    tracer = Tracer(trace, request.max_outputs)
    if request.cwd or request.root:
        os.chdir(request.cwd or request.root)
    state["undo"] = hooks.install()
    if state.get("identity") is not None:
        _install_distributed(request, state, trace, roots, started)
    if request.mode == "script":
        from torchls_probe.targets import run_script

        progress.emit("run", f"running {os.path.basename(request.file)}")
        with tracer:
            run_script(request.file, request.argv, request.source)
    else:
        _run_function(request, progress, tracer, state, determinism)
    outcome.stopped_by = "end"


@contextlib.contextmanager
def _limits_for_the_main_thread() -> Any:
    """Threads torch starts at import inherit a mask that blocks the limit signals, so that
    those reach the main thread only, and a script blocking them there blocks them for good
    (a blocked SIGALRM was otherwise delivered to torch's thread and still stopped it)."""
    limits = {getattr(signal, name) for name in ("SIGALRM", "SIGXCPU") if hasattr(signal, name)}
    if not limits or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, limits)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)  # a pending alarm arrives now


def _install_distributed(
    request: Request, state: dict[str, Any], trace: Any, roots: Any, started: float
) -> None:
    """A rank of a distributed repro watches its collectives, replicas and batches too."""
    from torchls_probe.distributed import Distributed

    watcher = Distributed(request, state["identity"], started)
    watcher.adjust_device(state.get("device"))
    state["distributed"] = watcher
    undo_hooks = state["undo"]
    undo_watcher = watcher.install(trace, roots, state)

    def undo() -> None:
        undo_watcher()
        undo_hooks()

    state["undo"] = undo


def _run_function(
    request: Request, progress: Progress, tracer: Any, state: dict[str, Any], determinism: Any
) -> None:
    import torch

    from torchls_probe import environment
    from torchls_probe.stats import is_finite, summary, tensors_in
    from torchls_probe.targets import call_setup, find_function, step_arguments

    step = find_function(request.step or "", request.file, "step")
    setup = find_function(request.setup, request.file, "setup") if request.setup else None
    device = torch.device(state["device"]["torch_device"])
    progress.emit("setup", "building the model and batch")
    args, kwargs = step_arguments(call_setup(setup, device, request.setup_args) if setup else None)
    # The step's randomness (dropout, sampling) must not depend on how much RNG setup used.
    environment.seed_everything(request.seed, request.deterministic)
    trace, roots = state["trace"], state["roots"]
    where = _definition(setup or step, state["user"])
    for value in [*args, *kwargs.values()]:
        if isinstance(value, torch.nn.Module) and roots.add_model(value, None):
            name = type(value).__name__
            for sub_name, sub in value.named_modules():
                trace.module_names.setdefault(id(sub), f"{name}.{sub_name}" if sub_name else name)
    for t in tensors_in((args, kwargs), 64):
        if not is_finite(t):
            what = "setup() returned" if setup else "the step got"
            trace.event("input", where, "setup", summary(t), "op", detail=f"a tensor {what}")
            break
    for index in range(request.steps):
        before = trace.steps
        with tracer:
            step(*args, **kwargs)
        if trace.steps == before:
            total = request.steps
            progress.emit("step", f"step {index + 1} of {total}", step=index + 1, total=total)


def _definition(function: Any, user: UserCode) -> Location:
    code = getattr(function, "__code__", None)
    if code is None:
        return Location("<unknown>", 1)
    return Location(user.filename(code) or code.co_filename, code.co_firstlineno)


def _torch_dirs() -> list[str]:
    import torch

    return [os.path.dirname(os.path.abspath(torch.__file__))]


def _is_memory(error: BaseException) -> bool:
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and (
        "can't allocate memory" in text or "out of memory" in text or "cannot allocate" in text
    )


def _note_data_pass(
    state: dict, where: Location | None, request: Request, outcome: Outcome
) -> None:
    """The batch bound was reached before any model ran or any optimizer was made: what the
    bound cut was a pass over the data (statistics, a vocabulary, a look at the batches), and
    the training never started. The run is complete as asked, but it showed nothing of the
    model, and the report must not let that pass for a clean training step."""
    roots = state.get("roots")
    if roots is None or roots.models or roots.optimizers:
        return
    at = ""
    if where is not None:
        shown, base = where.filename, request.cwd or request.root
        if base:  # as the text report shows paths: relative to where the script runs
            with contextlib.suppress(ValueError):
                shown = os.path.relpath(where.filename, base)
        at = f" at {shown}:{where.line}"
    outcome.notes.append(
        f"the batch bound ({request.batch_cap} batches) was reached{at} before any model ran "
        "or any optimizer was made: a pass over the data was cut short and the training never "
        "started; raise the batch bound past that pass (--batches N; without it the bound is "
        "the step count)"
    )


def _note_short_of_steps(state: dict, request: Request, outcome: Outcome) -> None:
    """The batch bound, which is the step count unless `--batches` was given, stopped a run
    that had made an optimizer before it took that many steps: the script takes several
    batches per step (gradient accumulation) or went through batches without stepping (an
    evaluation pass). The run is complete as bounded, but what was asked (N steps) and what the
    checks of an optimizer step need did not happen: say so, and how to go further."""
    hooks, trace = state.get("hooks"), state.get("trace")
    if request.batches is not None or hooks is None or trace is None:
        return
    if not hooks.optimizers_made or trace.steps >= request.steps:
        return
    evaluation = trace.batches_without_grad
    why = (
        f"{evaluation} of them taken without gradients (an evaluation pass)"
        if evaluation
        else "the script takes more than one batch per optimizer step (gradient accumulation?)"
    )
    unchecked = (
        "; no optimizer step ran, so the gradients and updates were not checked"
        if not trace.steps
        else ""
    )
    outcome.notes.append(
        f"the batch bound ({request.batch_cap} batches; without --batches it is the step count) "
        "stopped the run after "
        f"{trace.steps} of {request.steps} optimizer steps: {why}{unchecked}; pass --batches N "
        "to let it reach the step bound"
    )


def _classify(error: BaseException, request: Request, outcome: Outcome, state: dict) -> None:
    trace = state.get("trace")
    user: UserCode | None = state.get("user")
    where = user.traceback_location(error.__traceback__) if user is not None else None
    op = trace.current_op if trace is not None else None
    outcome.location = where
    watcher = state.get("distributed")
    if watcher is not None and watcher.classify(error, outcome):
        return  # another rank failed, hung or went away: not this rank's error
    if isinstance(error, ProbeStop):
        outcome.stopped_by = error.reason
        if error.reason == "batches":
            _note_data_pass(state, where, request, outcome)
            _note_short_of_steps(state, request, outcome)
        return
    from torchls_probe.targets import SetupError

    if isinstance(error, SetupError):
        outcome.status, outcome.stopped_by = "error", "setup"
        outcome.exception = _exception(error, None, None, kind="setup")
        return
    if isinstance(error, SystemExit):
        outcome.stopped_by = "exit"
        if error.code in (None, 0):
            return
        outcome.status = "error"
        outcome.exception = _exception(error, where, op, kind="user")
        return
    limit = _limit_kind(error)
    if limit is not None:
        outcome.status = {"timeout": "timeout", "cpu": "timeout", "memory": "memory"}.get(
            limit, "error"
        )
        outcome.stopped_by = limit
        outcome.limit_message = _LIMIT_TEXT[limit].format(
            timeout=request.timeout_s,
            cap=request.output_cap_bytes,
            memory=request.memory_mb,
            message=str(error).strip().splitlines()[0][:200] if str(error).strip() else "",
        )
        if limit in ("timeout", "cpu"):
            outcome.limit_message += _between_steps(state.get("trace"))
        if limit == "memory":
            outcome.exception = _exception(error, where, op, kind="limit")
        return
    outcome.status, outcome.stopped_by = "error", "exception"
    outcome.exception = _exception(error, where, op, kind="user")


def _between_steps(trace: Any) -> str:
    """Which phase used the time: code with no backward after the last step (evaluation,
    sampling, logging callbacks) is named, since raising the timeout is not the only fix."""
    if trace is None or not trace.steps or trace.last_step_at is None:
        return ""
    if trace.backward_calls > trace.backward_at_last_step:
        return ""
    spent = time.monotonic() - trace.last_step_at
    return (
        f"; the time ran out after optimizer step {trace.steps}, in {spent:.1f} s of code that "
        "ran no backward since (evaluation, sampling or logging between steps?): make that "
        "phase cheaper for the repro, run fewer --steps, or raise --timeout"
    )


def _limit_kind(error: BaseException) -> str | None:
    if isinstance(error, ProbeLimit):
        return error.kind
    if _is_memory(error):
        return "memory"
    if isinstance(error, OSError) and error.errno == 27:  # EFBIG: the file-size limit
        return "output"
    return None


def _exception(
    error: BaseException, where: Location | None, op: str | None, kind: str
) -> dict[str, Any]:
    from torchls_probe.positions import position

    info: dict[str, Any] = {
        "kind": kind,
        "type": type(error).__name__,
        "message": str(error)[:2000],
        "op": op,
    }
    if where is not None:
        info.update(position(where))
    frames = traceback.extract_tb(error.__traceback__) if kind != "setup" else []
    # The probe's own frames (and runpy's) are noise to the user: keep theirs and libraries'.
    probe_dir = os.path.dirname(os.path.abspath(__file__)) + os.sep
    kept = [
        f
        for f in frames
        if not os.path.abspath(f.filename).startswith(probe_dir) and not f.filename.startswith("<")
    ]
    info["traceback"] = [
        {"filename": f.filename, "line": f.lineno, "function": f.name} for f in kept[-20:]
    ]
    if isinstance(error, ModuleNotFoundError):
        # Where the import looked (the host tells from it whether the sandbox hid the module).
        info["search_path"] = [os.path.abspath(entry or ".") for entry in sys.path[:64]]
    return info


def _write(
    request: Request, outcome: Outcome, state: dict, timing: dict[str, float], started: float
) -> int:
    from torchls_probe import findings as finding_rules
    from torchls_probe.report import assemble, dumps

    trace = state.get("trace")
    roots = state.get("roots")
    hooks = state.get("hooks")
    device = state.get("device")
    watcher = state.get("distributed")
    if watcher is not None:
        try:
            watcher.finish(outcome)  # waits for the other ranks, then compares them
        except BaseException as error:
            outcome.notes.append(f"probe error at the end of a rank: {error!r}")
    found: list[dict[str, Any]] = []
    parameters: dict[str, list[str]] = {"without_grad": [], "zero_grad": [], "not_in_optimizer": []}
    try:
        if trace is not None and roots is not None:
            if trace.backward_calls and not roots.optimizers and hooks is not None:
                roots.check_unused_after_backward(hooks.got_grad)
            parameters = {
                "without_grad": list(roots.without_grad),
                "zero_grad": list(roots.zero_grad),
                "not_in_optimizer": list(roots.not_in_optimizer(trace.copied_from)),
            }
            if device is not None:
                from torchls_probe.device import observe

                observe(device, list(trace.observed_devices))
            environment = state.get("environment")
            if environment is not None:
                dtypes = {
                    str(p.dtype).replace("torch.", "") for m in roots.models for p in m.parameters()
                }
                environment["parameter_dtypes"] = sorted(dtypes)
        if trace is not None and roots is not None:
            divergence = hooks.divergence if hooks is not None else None
            found = finding_rules.build(trace, roots, outcome, request.file, divergence)
        elif outcome.stopped_by in ("timeout", "cpu", "memory", "output"):
            found = finding_rules.build_limit_only(outcome, request.file)
    except BaseException as error:
        outcome.notes.append(f"probe error while building findings: {error!r}")
    if trace is not None:
        outcome.notes.extend(trace.internal_errors)
    timing["total_s"] = time.monotonic() - started
    report = assemble(
        request=request,
        outcome=outcome,
        device=device,
        environment=state.get("environment"),
        trace=trace,
        findings=found,
        parameters=parameters,
        autocast=sorted(hooks.autocast) if hooks is not None else [],
        timing=timing,
    )
    if hooks is not None:
        report["training"] = hooks.divergence.to_json()
        report["training"]["activations"] = hooks.activations.to_json()
        if roots is not None:  # model order, with the parameters that never got a gradient
            names = [name for name, _, _ in roots.named_parameters()]
            report["training"]["parameter_names"] = names[:2000]
        if request.initial_load is not None:
            report["training"]["same_start"] = dict(hooks.initial_matched)
    if watcher is not None:
        watcher.amend(report)
    text = dumps(report, request.report_cap_bytes)
    if request.out is None:
        sys.__stdout__.write(text + "\n")
        return 0
    # In place, not through a rename: inside bubblewrap the server binds this one file (not its
    # folder) into the sandbox, and a mount point cannot be replaced. A report cut short by a
    # kill is invalid JSON, which the server treats as no report.
    try:
        # A rank's watchdog may have left a provisional report there: this one replaces it.
        guard = watcher.writing() if watcher is not None else contextlib.nullcontext()
        with guard, open(request.out, "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError:
        return 3
    return 0
