"""What the user is told when a repro cannot run, or ran into a limit: the cause and the fix.

In: the probe's usage errors, its report, and which interpreter the server chose (and why).
Out: one sentence each, naming the editor setting to change (`torchls.probe.*`) rather than the
CLI flag the probe's own messages mention. Pure functions over strings and report JSON.

Every piece taken from the report (exception text, status, device, codes) is run data: it goes
through `untrusted.notification`, so a message cannot carry a link or a command into the
client's notification.
"""

from __future__ import annotations

import re
from typing import Any

from lsprotocol import types

from torchls.probe.untrusted import notification as _plain

PYTHON_SETTING = "torchls.probe.python"
SANDBOX_SETTING = "torchls.probe.sandbox"
BY_REQUEST = "disabled by request (--sandbox none)"  # the probe's word for the mode `none`
BWRAP_LAYERS = {"bubblewrap", "filesystem", "pid_namespace", "network"}
UNTRUSTED = (
    "torchls: this workspace is not trusted, so the repro (which runs your training code) is "
    "disabled. Trust the workspace (VS Code: Manage Workspace Trust) to use it."
)


def _name(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def usage_failure(message: str, python: str, python_source: str) -> str:
    """A `ReproUsageError` from the probe, rephrased for the editor."""
    if message.startswith("--python "):
        return (
            f"torchls: the repro could not start: {python} ({python_source}) is not an "
            f"executable interpreter. Set `{PYTHON_SETTING}` to the Python that has your torch."
        )
    if message.startswith("file not found"):
        return "torchls: the repro runs the file saved on disk, and there is none: save it first."
    if message.startswith("sandbox refused"):
        # The editor takes no flags: its opt-out is the user's setting, the CLI's the flag.
        message = message.replace(
            "with --sandbox none",
            f'with the setting `{SANDBOX_SETTING}: "none"` (or `torchls repro --sandbox none '
            "FILE` in a terminal)",
        )
        return f"torchls: the repro was refused: {message}."
    if "bubblewrap" in message:
        message = message.replace("--sandbox bwrap", f'`{SANDBOX_SETTING}: "bwrap"`')
        return f"torchls: the repro could not start: {message}. Install bubblewrap."
    message = re.sub(r"--(steps|timeout|memory|device)\b", r"torchls.probe.\1", message)
    return f"torchls: the repro could not start: {message}"


def setup_failure(data: dict[str, Any], python: str, python_source: str) -> str:
    """A report whose run never started the user's code (`exception.kind` setup or device)."""
    exception = data.get("exception") or {}
    message = _plain(exception.get("message") or exception.get("type") or "unknown error")
    if exception.get("kind") == "device":
        return (
            f"torchls: the repro could not start: {message}. Set `torchls.probe.device` to "
            "`cpu` (or `auto`), or pick the interpreter whose torch sees the device with "
            f"`{PYTHON_SETTING}`."
        )
    if "torch cannot be imported" in message:
        reason = message.split(": ", 1)[1] if ": " in message else message
        reason = re.sub(r"\s*\(choose the interpreter.*\)$", "", reason)
        return (
            f"torchls: the repro could not start: torch cannot be imported by {python} "
            f"({python_source}): {reason}. Set `{PYTHON_SETTING}` to the interpreter that has "
            "your torch (for example your project's .venv/bin/python)."
        )
    return f"torchls: the repro could not start: {message}"


def limit_problem(data: dict[str, Any], file: str) -> str | None:
    """The limit that stopped a run, with the setting that raises it; None if none did."""
    bounds = data.get("bounds") or {}
    stopped_by = data.get("stopped_by")
    timeout, memory = bounds.get("timeout_s"), bounds.get("memory_mb")
    name = _name(file)
    if stopped_by == "timeout":
        return (
            f"torchls: the repro of {name} was stopped by the wall-clock limit of {timeout:g} s. "
            "Raise `torchls.probe.timeout`, or run fewer steps (`torchls.probe.steps`)."
            if isinstance(timeout, int | float)
            else f"torchls: the repro of {name} was stopped by the wall-clock limit."
        )
    if stopped_by == "cpu":
        return (
            f"torchls: the repro of {name} was stopped by its CPU-time limit (derived from "
            "`torchls.probe.timeout`). Raise the timeout or run fewer steps."
        )
    if stopped_by == "memory" or data.get("status") == "memory":
        return (
            f"torchls: the repro of {name} was stopped by the memory limit of {memory} MB. "
            "Raise `torchls.probe.memory`, or use a smaller batch or model for the repro."
        )
    if stopped_by == "output":
        return (
            f"torchls: the repro of {name} was stopped because the script printed more than "
            "the output cap. Print less during training steps."
        )
    progress = data.get("progress") or {}
    if (
        stopped_by == "batches"
        and not progress.get("optimizer_steps")
        and not progress.get("backward_calls")
        and any(str(note).startswith("the batch bound") for note in data.get("notes") or [])
    ):
        return (
            f"torchls: the repro of {name} reached its batch bound in a pass over the data, "
            "before any model ran: the training never started. Raise `torchls.probe.steps` "
            "(the batch bound follows it) past that pass."
        )
    if data.get("status") == "crashed":
        findings = data.get("findings") or []
        detail = _plain(findings[0].get("message")) if findings else "the interpreter died"
        return f"torchls: the repro of {name} crashed: {detail}. See the torchls log for stderr."
    return None


def sandbox_problem(data: dict[str, Any]) -> str | None:
    """Which protections were active when fewer than the full set held (the report's
    `sandbox.summary` first), and how to get the rest; None when every layer held."""
    sandbox = data.get("sandbox") or {}
    degraded = [_plain(name, 40) for name in sandbox.get("degraded") or []]
    if not degraded:
        return None
    fix = (
        " Install bubblewrap (e.g. `apt install bubblewrap`) for file-system, network and "
        "process isolation."
        if BWRAP_LAYERS.intersection(degraded)
        else ""
    )
    summary = sandbox.get("summary")
    if isinstance(summary, str) and BY_REQUEST in summary:
        # The user's own setting turned bubblewrap off: installing it changes nothing.
        summary = summary.replace(BY_REQUEST, f'{SANDBOX_SETTING} is "none"')
        fix = f' Set `{SANDBOX_SETTING}` to "auto" to run sandboxed again.'
    if isinstance(summary, str) and summary:
        return f"torchls: the repro ran with weaker isolation: {_plain(summary, 1000)}." + fix
    return (
        f"torchls: the repro ran with weaker isolation: {', '.join(degraded)} did not hold." + fix
    )


def sandbox_cause(data: dict[str, Any]) -> str:
    """What made a run's sandbox weaker, the same for a cold run and the warm worker: the
    bubblewrap layer's state when it did not hold, else the layers that did not."""
    sandbox = data.get("sandbox") or {}
    layers = [layer for layer in sandbox.get("layers") or [] if isinstance(layer, dict)]
    bwrap = next((layer for layer in layers if layer.get("name") == "bubblewrap"), None)
    if bwrap is not None and not bwrap.get("held"):
        return f"bubblewrap: {bwrap.get('detail')}"
    return "layers: " + ", ".join(sorted(str(name) for name in sandbox.get("degraded") or []))


def summary(data: dict[str, Any], file: str) -> str:
    """One line for the progress end and the log: what ran, where, how long, what it found."""
    progress = data.get("progress") or {}
    device = (data.get("device") or {}).get("resolved") or (data.get("device") or {}).get(
        "requested"
    )
    timing = data.get("timing") or {}
    steps = progress.get("optimizer_steps")
    parts = [f"repro of {_name(file)}: {_plain(data.get('status', '?'), 20)}"]
    if isinstance(steps, int):
        parts.append(f"{steps} step{'s' if steps != 1 else ''}")
    if device:
        parts.append(f"on {_plain(device, 40)}")
    wall = timing.get("server_wall_s")
    if isinstance(wall, int | float):
        parts.append(f"{wall:.2f} s ({_plain(timing.get('runner', '?'), 20)})")
    codes = [_plain(f.get("code"), 8) for f in data.get("findings") or []]
    found = ", ".join(f"{code} x{codes.count(code)}" for code in sorted(set(codes)))
    parts.append(found or "no runtime problems found")
    return " · ".join(parts)


def exception_problem(data: dict[str, Any], file: str) -> str | None:
    """The user's code raised: say where (the TL905 diagnostic carries the rest)."""
    exception = data.get("exception") or {}
    if exception.get("kind") != "user":
        return None
    where = f" (line {exception['line']})" if isinstance(exception.get("line"), int) else ""
    return (
        f"torchls: the repro of {_name(file)} raised "
        f"{_plain(exception.get('type', 'an exception'), 100)}{where}: "
        f"{_plain(exception.get('message', ''))}"
    )


def report_messages(data: dict[str, Any], file: str) -> list[tuple[types.MessageType, str]]:
    """What the user should be told about a finished run beyond its diagnostics (the sandbox's
    missing layers aside: `sandbox_problem`, said once per session rather than every run)."""
    messages: list[tuple[types.MessageType, str]] = []
    # A limit explains the run's end better than the exception the limit raised.
    problem = limit_problem(data, file) or exception_problem(data, file)
    if problem is not None:
        messages.append((types.MessageType.Warning, problem))
    if not data.get("findings"):
        messages.append((types.MessageType.Info, f"torchls: {summary(data, file)}."))
    return messages
