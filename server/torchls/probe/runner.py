"""Cold runs: a fresh sandboxed interpreter per repro (`run_repro`, `run_cold`).

In: a target file, `ReproOptions`, an optional progress callback and cancel event. Out: a
`ReproReport` (always, whatever the child did), `ReproUsageError` when the request cannot be run,
`ReproCancelled` once a cancelled run's processes are gone. The launch itself is launch.py's
`execute` (this module adds what an inspection or a comparison asks for; distributed.py the
torchrun strategy). The run's folder (scratch.py) is removed afterwards; the user's files are
only ever read, and what the run left behind is read back without trusting it.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from torchls.probe import distributed
from torchls.probe.launch import (
    KILL_GRACE_S,
    OUTPUT_HEAD,
    OUTPUT_TAIL,
    REPORT_READ_LIMIT,
    LaunchSpec,
    ProgressCallback,
    ProgressEvent,
    ReproCancelled,
    execute,
    forward_progress,
    make_report,
    notify,
)
from torchls.probe.options import ReproOptions, ReproUsageError
from torchls.probe.prepare import Prepared, prepare
from torchls.probe.report import ReproReport
from torchls.probe.scratch import RunFolder, open_regular
from torchls.records import record

# The names callers have always taken from here; they live in launch.py now.
__all__ = [
    "KILL_GRACE_S",
    "OUTPUT_HEAD",
    "OUTPUT_TAIL",
    "REPORT_READ_LIMIT",
    "Extras",
    "ProgressCallback",
    "ProgressEvent",
    "ReproCancelled",
    "forward_progress",
    "run_cold",
    "run_repro",
]


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
    nproc = prepared.resolved.options.nproc is not None
    if nproc and extras is not None:
        raise ReproUsageError("--nproc cannot be combined with --compare or inspect")
    folder = RunFolder.create(prepared.probe_package, cold=True)
    try:
        if nproc:
            data = distributed.run_in(prepared, folder, started, on_progress, cancel_event)
        else:
            data = _run_in(prepared, folder, started, on_progress, cancel_event, extras)
    finally:
        folder.remove()
    report = make_report(prepared, data, started)
    notify(on_progress, ProgressEvent("done", f"done: {report.status}"))
    return report


def _run_in(
    prepared: Prepared,
    folder: RunFolder,
    started: float,
    on_progress: ProgressCallback | None,
    cancel_event: threading.Event | None,
    extras: Extras | None = None,
) -> dict[str, Any]:
    """One single-process cold run in `folder`: the report document."""
    extras = extras or Extras()
    request: dict[str, Any] = {}
    outputs: tuple[Path, ...] = ()
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
    spec = LaunchSpec(outputs=outputs, request=request)
    data = execute(
        prepared, spec, folder, started=started, on_progress=on_progress, cancel_event=cancel_event
    )
    if extras.rewrite_to is not None:
        _copy_rewritten(data, folder.rewrite, extras.rewrite_to)
    if extras.save_initial_to is not None:
        _copy_out(folder.rewrite, extras.save_initial_to)
    return data


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


def _copy_rewritten(data: dict[str, Any], written: Path, target: Path) -> None:
    """Copy the run's rewritten checkpoint out, if the run says it verified it; the file lies
    where the run could write, so it is opened like any run file (no link, regular only)."""
    rewritten = (data.get("inspection") or {}).get("rewritten")
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
