"""`torchls inspect CHECKPOINT`: does a checkpoint load under `weights_only=True`, what is in it,
what blocks it, and what is missing to resume training.

In: the parsed `inspect` arguments. Out: a text or JSON report on stdout and an exit status:
0 it loads with `weights_only=True` (or `--rewrite-plain` wrote a verified copy that does), 1 it
does not (a TL911 finding, with the globals that block it and where they sit), 2 bad input (no
such file, a folder, a FIFO or device, not a checkpoint, a truncated or corrupted file) with a
one-line message and never a traceback.

The file is untrusted: it is never unpickled here. The probe reads it in the sandbox with the
user's torch (`torchls_probe.checkpoint`: every global a stand-in, no storage read), so a
hostile pickle is listed, not run, and a 20 GB file costs its pickle, not its tensors.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

from torchls.config import DEFAULT_MEMORY_MB

EXIT_LOADS = 0
EXIT_BLOCKED = 1
EXIT_ERROR = 2
TIMEOUT_S = 120.0


def add_parser(commands: argparse._SubParsersAction) -> None:
    inspect = commands.add_parser(
        "inspect",
        help="inspect a checkpoint: weights_only, structure, what blocks it, what is missing",
        description="Read CHECKPOINT in the sandbox, without running code from it, and report "
        "whether torch.load(weights_only=True) takes it, the globals that block it and where "
        "they sit, its tensors, and the training state it holds. Exit status: 0 it loads with "
        "weights_only=True, 1 it does not (TL911), 2 bad input.",
    )
    inspect.add_argument(
        "checkpoint", metavar="CHECKPOINT", help="a torch.save or safetensors file"
    )
    inspect.add_argument("--python", help="interpreter with your torch (default: the project venv)")
    inspect.add_argument("--output-format", choices=("text", "json"), default="text")
    inspect.add_argument(
        "--rewrite-plain",
        metavar="OUT",
        help="for a file you trust: load it fully (in the sandbox), turn Namespace, dataclass "
        "and simple objects into dicts, save the copy to OUT and check it loads with "
        "weights_only=True",
    )
    inspect.add_argument(
        "--sandbox", choices=("auto", "bwrap", "none"), default="auto", help="as for repro"
    )
    inspect.set_defaults(handler=run)


def _refuse(message: str) -> int:
    print(f"torchls: error: {message}", file=sys.stderr)
    return EXIT_ERROR


def check_input(path: str) -> str | None:
    """Why `path` cannot be inspected at all, or None (checked before any sandbox starts)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return f"{path}: no such file"
    except OSError as error:
        return f"{path}: {error.strerror}"
    if stat.S_ISDIR(mode):
        return (
            f"{path} is a folder: give the checkpoint file (for a sharded checkpoint, its "
            "*.index.json)"
        )
    if not stat.S_ISREG(mode):
        return f"{path} is not a regular file (a FIFO, socket or device): nothing was read"
    return None


def inspect_data(
    path: str, python: str | None, sandbox: str = "auto", rewrite_to: Path | None = None
) -> dict[str, Any]:
    """The probe's report (its `inspection` record, findings, sandbox) for the checkpoint at
    absolute `path`, read in the sandbox: the one way in for the CLI and the editor's
    `torchls.inspectCheckpoint`. Raises `ReproUsageError` when the probe cannot start."""
    from torchls.probe import ReproOptions
    from torchls.probe.prepare import prepare
    from torchls.probe.runner import Extras, run_cold

    # The copy is written inside the sandbox under its file-size limit: room for the file.
    size_mb = os.path.getsize(path) >> 20
    file_size_mb = max(256, 2 * size_mb + 64) if rewrite_to is not None else 256
    options = ReproOptions(
        python=python,
        root=os.path.dirname(path),
        timeout_s=TIMEOUT_S,
        memory_mb=DEFAULT_MEMORY_MB,
        sandbox=sandbox,
        device="cpu",
        file_size_mb=file_size_mb,
    )
    extras = Extras(mode="inspect", rewrite_to=rewrite_to)
    return dict(run_cold(prepare(path, options), None, None, extras).data)


def run(args: argparse.Namespace) -> int:
    from torchls.probe import ReproUsageError, untrusted

    problem = check_input(args.checkpoint)
    if problem is not None:
        return _refuse(problem)
    path = os.path.abspath(args.checkpoint)
    rewrite_to = None
    if args.rewrite_plain:
        rewrite_to = Path(args.rewrite_plain).absolute()
        if os.path.lexists(rewrite_to):
            return _refuse(f"{args.rewrite_plain} exists: remove it or choose another name")
        if not rewrite_to.parent.is_dir():
            return _refuse(f"{rewrite_to.parent} is not a folder")
    try:
        data = inspect_data(path, args.python, args.sandbox, rewrite_to)
    except ReproUsageError as error:
        return _refuse(str(error))
    exception = data.get("exception") or {}
    record = data.get("inspection")
    if not isinstance(record, dict):
        why = exception.get("message") or _first_finding(data) or "the probe wrote no report"
        return _refuse(f"{args.checkpoint}: {untrusted.one_line(why)}")
    if args.output_format == "json":
        out = {"file": path, **record, "findings": data.get("findings") or []}
        out["sandbox"] = data.get("sandbox")
        sys.stdout.write(json.dumps(out, indent=2, default=str) + "\n")
    else:
        sys.stdout.write(untrusted.terminal(render(path, record, args.checkpoint)))
    rewritten = record.get("rewritten")
    if isinstance(rewritten, dict):
        return EXIT_LOADS if rewritten.get("verified") and rewritten.get("path") else EXIT_BLOCKED
    return EXIT_LOADS if record["weights_only"].get("loads") is not False else EXIT_BLOCKED


def _first_finding(data: dict[str, Any]) -> str | None:
    findings = data.get("findings") or []
    return str(findings[0].get("message")) if findings else None


def human_size(count: Any) -> str:
    """A byte count as people read it ("1.5 MB"); "?" when it is not a count."""
    return _size(count)


def _size(count: Any) -> str:
    if not isinstance(count, int):
        return "?"
    value = float(count)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1024 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"


def render(path: str, record: dict[str, Any], shown: str) -> str:
    """The text report a person reads."""
    verdict = record.get("weights_only") or {}
    loads = verdict.get("loads")
    lines = [f"torchls inspect {shown}: {record.get('format')} checkpoint"]
    if loads is True:
        lines.append("weights_only=True: loads")
    elif loads is False:
        lines.append(f"weights_only=True: REFUSED (TL911) - {verdict.get('note')}")
    else:
        lines.append(f"weights_only=True: {verdict.get('note')}")
    for item in verdict.get("blocking") or []:
        lines.append(f"  {item.get('path')}: {item.get('global')}")
        lines.append(f"    fix: {item.get('fix')}")
        lines.append(f"    {item.get('allow')}")
    totals = record.get("totals") or {}
    lines.append(
        f"tensors: {totals.get('tensors')}, {_size(totals.get('bytes'))}"
        + (
            f", {totals['parameters']:,} values"
            if isinstance(totals.get("parameters"), int)
            else ""
        )
    )
    for key, entry in (record.get("per_entry") or {}).items():
        lines.append(f"  {key}: {entry['tensors']} tensors, {_size(entry['bytes'])}")
    saved_on = record.get("saved_on") or []
    if saved_on:
        note = (
            " (load with map_location=... on a machine without it)"
            if record.get("map_location_needed")
            else ""
        )
        lines.append(f"saved from: {', '.join(saved_on)}{note}")
    state = record.get("training_state") or {}
    held = [name for name in ("model", "scheduler", "scaler", "rng") if state.get(name)]
    optimizer = state.get("optimizer")
    if optimizer:
        held.append(f"optimizer (lr {', '.join(f'{lr:g}' for lr in optimizer.get('lr') or [])})")
    lines.append(f"training state: {', '.join(held) or 'none found'}")
    for key, value in (state.get("counters") or {}).items():
        lines.append(f"  {key}: {value}")
    for missing in record.get("missing") or []:
        lines.append(f"missing: {missing}")
    rewritten = record.get("rewritten")
    if isinstance(rewritten, dict):
        if rewritten.get("verified") and rewritten.get("path"):
            lines.append(
                f"rewritten: {rewritten['path']} loads with weights_only=True "
                f"({rewritten.get('tensors')} tensors, all equal to the original)"
            )
        else:
            lines.append(f"rewrite failed: {rewritten.get('problem')}")
        for change in rewritten.get("changed") or []:
            lines.append(f"  {change}")
    # Tensors, objects and the first two levels; the rest (optimizer internals) is in the JSON.
    tree = [
        node
        for node in record.get("tree") or []
        if node.get("kind") in ("tensor", "object") or str(node.get("path")).count("[") <= 2
    ]
    if tree:
        lines.append("structure:")
        for node in tree[:60]:
            lines.append(f"  {node.get('path')}: {_describe(node)}")
        if len(tree) > 60:
            lines.append(f"  ... {len(tree) - 60} more entries (--output-format json)")
    return "\n".join(lines) + "\n"


def _describe(node: dict[str, Any]) -> str:
    kind = node.get("kind")
    if kind == "tensor":
        shape = "[" + ", ".join(str(d) for d in node.get("shape") or []) + "]"
        where = f"{node.get('dtype')} on {node.get('device')}"
        return f"tensor {shape} {where}, {_size(node.get('bytes'))}"
    if kind == "object":
        fields = node.get("fields")
        return f"{node.get('global')}" + (f" {fields}" if fields else "")
    if kind in ("dict", "list", "tuple"):
        count = node.get("keys", node.get("items"))
        return f"{kind} of {count}"
    if "value" in node:
        return f"{kind} {node['value']!r}"
    return str(kind)
