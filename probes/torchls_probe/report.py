"""The probe's JSON report: assembled, size-capped and written as strict JSON.

In: the request, how the run ended, the trace and the parameter checks. Out: a dict following
docs/probe-report.md, serialised without NaN literals. Only `timing` varies between two runs of
the same code; everything else is in first-seen or sorted order with rounded floats. Over the
byte cap, tensor detail is shed first (one output per entry, then finite-only lines from the end),
findings and events never; `truncated` says so.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from torchls_probe import SCHEMA_VERSION, __version__, schema
from torchls_probe.attribution import Location
from torchls_probe.findings import ORIGINS, Outcome, chain, is_mask
from torchls_probe.positions import columns, position, source_line
from torchls_probe.records import Event

if TYPE_CHECKING:  # torch-free at import, like findings.py
    from torchls_probe.tracer import Trace


def assemble(
    *,
    request: Any,
    outcome: Outcome,
    device: dict[str, Any] | None,
    environment: dict[str, Any] | None,
    trace: Trace | None,
    findings: list[dict[str, Any]],
    parameters: dict[str, list[str]],
    autocast: list[str],
    timing: dict[str, float],
) -> dict[str, Any]:
    report: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "probe_version": __version__,
        "status": outcome.status,
        "stopped_by": outcome.stopped_by,
        "mode": request.mode,
        "target": {
            "file": request.file,
            "root": request.root,
            "step": request.step,
            "setup": request.setup,
        },
        "bounds": {
            "steps": request.steps,
            "batches": request.batch_cap,
            "timeout_s": request.timeout_s,
            "memory_mb": request.memory_mb,
            "output_cap_bytes": request.output_cap_bytes,
        },
        "progress": {
            "optimizer_steps": trace.steps if trace else 0,
            "batches": trace.batches if trace else 0,
            "backward_calls": trace.backward_calls if trace else 0,
        },
        "device": device or {"requested": request.device, "resolved": None, "observed": []},
        "environment": environment,
        "findings": findings,
        "nonfinite": _nonfinite(trace),
        "parameters": parameters,
        "autocast": autocast,
        "warnings": _warnings(trace),
        "exception": outcome.exception,
        "notes": outcome.notes,
        "lines": _lines(trace),
        "dropped_lines": trace.lines.dropped_lines if trace else 0,
        "truncated": False,
        "timing": {k: round(v, 4) for k, v in timing.items()},
    }
    if environment is not None and autocast:
        environment["autocast"] = autocast
    return report


def _event_json(event: Event) -> dict[str, Any]:
    item: dict[str, Any] = {
        "index": event.index,
        "phase": event.phase,
        "origin": event.origin,
        "op": event.op,
        "module": event.module,
        "detail": event.detail or None,
        "optimizer_steps_before": event.step,
        "sources": event.sources,
    }
    item.update(position(event.location))
    item["summary"] = event.summary
    return item


def _nonfinite(trace: Trace | None) -> dict[str, Any]:
    if trace is None or not trace.events.items:
        return {"events": [], "dropped": trace.events.dropped if trace else 0, "chain": []}
    events = trace.events.items
    # Masks (infinities written on purpose) are listed, but are neither "first" nor an origin.
    real = [e for e in events if not is_mask(e)] or events
    first = real[0]
    origin = next((e for e in real if e.origin in ORIGINS), first)
    return {
        "events": [_event_json(e) for e in events],
        "dropped": trace.events.dropped,
        "first": first.index,
        "chain": [e.index for e in chain(events, origin)],
    }


def _warnings(trace: Trace | None) -> list[dict[str, Any]]:
    if trace is None:
        return []
    found = []
    for warning in trace.warnings:
        loc: Location | None = warning["location"]
        item: dict[str, Any] = {"category": warning["category"], "message": warning["message"]}
        item.update(
            position(loc) if loc is not None else {"filename": None, "line": None, "column": None}
        )
        found.append(item)
    return found


def _lines(trace: Trace | None) -> list[dict[str, Any]]:
    if trace is None:
        return []
    found = []
    for (filename, line), record in sorted(trace.lines.lines.items()):
        entries = []
        for entry in record.entries.values():
            column, end_column = columns(Location(filename, line, entry.col, line, entry.end_col))
            entries.append(
                {
                    "op": entry.op,
                    "column": column,
                    "end_column": end_column,
                    "module": entry.module,
                    "phase": entry.phase,
                    "count": entry.count,
                    "nonfinite_count": entry.nonfinite_count,
                    "outputs": entry.outputs,
                    "grad": entry.grad,
                    "setup": entry.setup,
                }
            )
        found.append(
            {
                "filename": filename,
                "line": line,
                "source": source_line(filename, line).strip()[:200],
                "entries": entries,
                "dropped_entries": record.dropped_entries,
            }
        )
    return found


def strict(value: Any) -> Any:
    """Replace NaN/Inf floats anywhere in `value` with None (strict JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


def dumps(report: dict[str, Any], cap: int) -> str:
    """Strict, compact JSON no larger than `cap` bytes where shedding tensor detail allows,
    checked against report.schema.json first: a report that breaks it (a bug of the probe) is
    replaced by one that says so, since the server refuses such a report whole."""
    report = checked(strict(report))
    text = _encode(report)
    if len(text.encode("utf-8")) <= cap:
        return text
    report["truncated"] = True
    for line in report["lines"]:
        for entry in line["entries"]:
            entry["outputs"] = entry["outputs"][:1]
    text = _encode(report)
    # Drop finite-only lines from the end first, then any line, until it fits. Sizes are
    # estimated per line (its own encoding plus a comma) so this stays linear.
    total = len(text.encode("utf-8"))
    for keep_nonfinite in (True, False):
        lines = report["lines"]
        for index in range(len(lines) - 1, -1, -1):
            if total <= cap:
                break
            line = lines[index]
            if keep_nonfinite and any(e["nonfinite_count"] for e in line["entries"]):
                continue
            total -= len(_encode(line).encode("utf-8")) + 1
            del lines[index]
            report["dropped_lines"] += 1
    return _encode(report)


def checked(report: dict[str, Any]) -> dict[str, Any]:
    """`report` cut to the schema's bounds (`schema.fit`), or when it still breaks
    report.schema.json (a bug of the probe) a report that says so: the server would refuse the
    whole of it."""
    report = schema.fit(report)
    broken = schema.problems(report)
    return _schema_broken(report, broken) if broken else report


def _schema_broken(report: dict[str, Any], broken: list[str]) -> dict[str, Any]:
    target = report.get("target")
    named = target.get("file") if isinstance(target, dict) else None
    file = named if isinstance(named, str) else "?"
    message = (
        "internal error of torchls_probe: its report broke the report schema "
        f"({'; '.join(broken)}); the run's own findings are lost, please report this"
    )
    found = [_line_one("TL905", "probe-error", "error", file, message[:4000])]
    return skeleton("error", "exception", file, found)


def _line_one(code: str, name: str, severity: str, file: str, message: str) -> dict[str, Any]:
    return {
        "code": code,
        "name": name,
        "severity": severity,
        "filename": file,
        "line": 1,
        "column": 1,
        "end_line": 1,
        "end_column": 1,
        "message": message,
        "related": [],
    }


def skeleton(
    status: str, stopped_by: str, file: str, findings: list[dict[str, Any]]
) -> dict[str, Any]:
    """The smallest report the schema takes: what is known when nothing else can be trusted
    (the trace was mid-update, or the assembled report broke the schema)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "probe_version": __version__,
        "status": status,
        "stopped_by": stopped_by,
        "mode": "script",
        "target": {"file": file},
        "bounds": {},
        "progress": {"optimizer_steps": None, "batches": None, "backward_calls": None},
        "device": {"requested": None, "resolved": None, "observed": []},
        "environment": None,
        "findings": findings,
        "nonfinite": {"events": [], "dropped": 0, "chain": []},
        "parameters": {"without_grad": [], "zero_grad": [], "not_in_optimizer": []},
        "autocast": [],
        "warnings": [],
        "exception": None,
        "notes": [],
        "lines": [],
        "dropped_lines": 0,
        "truncated": False,
        "timing": {},
    }


def _encode(report: dict[str, Any]) -> str:
    return json.dumps(report, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
