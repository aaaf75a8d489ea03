"""The server's view of a probe report: typed accessors, and reports for runs that wrote none.

In: the probe's JSON (schema in docs/probe-report.md) plus what only the server knows (sandbox
layers, captured output, wall time, a kill). Out: `ReproReport`, whose `data` is the final JSON
document and whose `findings` are `ProbeFinding`s ready to be turned into diagnostics. When the
child died without a report (killed at the deadline, a segfault, the OOM killer), a report with
the right status and a TL905/TL906 finding is synthesised, so callers always get one shape.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from torchls.probe.scratch import Unreadable, read_regular
from torchls.records import record

SCHEMA_VERSION = 2
STATUSES = ("ok", "error", "timeout", "memory", "crashed")
SEVERITIES = ("error", "warning", "information")

# What the host takes from a report at most. The probe itself stays far below these (20
# non-finite events, 8 entries per line); a report past them was not written by the probe, and
# the excess is dropped so that no consumer (text report, diagnostics, hover) does unbounded work.
MAX_FINDINGS = 200
MAX_RELATED = 20
MAX_EVENTS = 100
MAX_LINE_RECORDS = 5000
MAX_ENTRIES = 16
MAX_OUTPUTS = 4
MAX_LIST = 1000  # warnings, notes, parameter names, traceback frames, chain indices
MAX_TEXT = 4000  # one message or name
_UNSAFE_IN_JSON = re.compile("[\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


@record(frozen=True)
class RelatedLocation:
    filename: str
    line: int
    column: int
    end_line: int
    end_column: int
    message: str


@record(frozen=True)
class ProbeFinding:
    """One TL9xx finding. Lines and columns are 1-based; columns count code points and
    `end_column` is one past the last character (as in `torchls check` JSON)."""

    code: str
    name: str
    severity: str
    filename: str
    line: int
    column: int
    end_line: int
    end_column: int
    message: str
    related: tuple[RelatedLocation, ...] = ()

    @classmethod
    def from_json(cls, item: dict[str, Any]) -> ProbeFinding:
        related = tuple(
            RelatedLocation(
                r["filename"], r["line"], r["column"], r["end_line"], r["end_column"], r["message"]
            )
            for r in item.get("related") or []
        )
        return cls(
            code=item["code"],
            name=item.get("name", ""),
            severity=item["severity"],
            filename=item["filename"],
            line=item["line"],
            column=item["column"],
            end_line=item["end_line"],
            end_column=item["end_column"],
            message=item["message"],
            related=related,
        )


@record
class ReproReport:
    """`data` is the report document; `root` (the project folder the host chose) and `allow`
    (files the host itself named, such as the target) say which files may be read to show
    source lines. Neither comes from the run."""

    data: dict[str, Any]
    root: str | None = None
    allow: tuple[str, ...] = ()

    @property
    def status(self) -> str:
        return str(self.data.get("status", "crashed"))

    @property
    def findings(self) -> list[ProbeFinding]:
        return [ProbeFinding.from_json(item) for item in self.data.get("findings") or []]

    @property
    def setup_error(self) -> str | None:
        """Why the repro could not run at all (no torch, device unavailable, bad target)."""
        exception = self.data.get("exception") or {}
        if exception.get("kind") in ("setup", "device"):
            return str(exception.get("message") or exception.get("type"))
        return None

    @property
    def lines(self) -> list[dict[str, Any]]:
        return list(self.data.get("lines") or [])

    def to_json(self, indent: int | None = 2) -> str:
        text = json.dumps(self.data, indent=indent, allow_nan=False, ensure_ascii=False)
        # JSON escapes C0 controls itself; C1 and bidirectional controls (which a terminal
        # showing the JSON would act on) are escaped here, so the document stays the same.
        return _UNSAFE_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)

    def without_timing(self) -> dict[str, Any]:
        """The report minus the fields that legitimately differ between identical runs."""
        copy = json.loads(json.dumps(self.data))
        copy.pop("timing", None)
        return copy


def read_probe_report(path: Path, limit: int) -> dict[str, Any] | None:
    """The probe's report, or None when it is missing, refused, oversized or not an object."""
    return load_probe_report(path, limit)[0]


def load_probe_report(path: Path, limit: int) -> tuple[dict[str, Any] | None, str | None]:
    """(the report, None), or (None, why it cannot be used); (None, None) when the probe wrote
    nothing. The file lies in a folder the run's code can write: it is read with `read_regular`
    (no link followed, no FIFO opened, at most `limit` bytes)."""
    try:
        text = read_regular(path, limit)
    except Unreadable as error:
        return None, str(error.strerror)
    except FileNotFoundError:
        return None, None
    except OSError as error:
        return None, f"{path.name} cannot be read: {error.strerror}"
    return parse_probe_report(text)


def parse_probe_report(text: bytes | str | None) -> tuple[dict[str, Any] | None, str | None]:
    """The report in `text`, or (None, why not); empty or None means no report at all."""
    if not text:
        return None, None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None, "report.json is not valid JSON (cut short, or not written by the probe)"
    if not isinstance(data, dict):
        return None, "report.json is not a JSON object"
    return bounded(data), None


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 31


def _position(item: dict[str, Any]) -> bool:
    return isinstance(item.get("filename"), str) and all(
        _int(item.get(key)) for key in ("line", "column", "end_line", "end_column")
    )


def _text(value: Any) -> str:
    return value[:MAX_TEXT] if isinstance(value, str) else ""


def _finding(item: Any) -> dict[str, Any] | None:
    if not isinstance(item, dict) or not _position(item):
        return None
    code = item.get("code")
    if not (isinstance(code, str) and len(code) == 5 and code.startswith("TL")):
        return None
    if item.get("severity") not in SEVERITIES:
        return None
    related = [
        {**r, "filename": r["filename"][:MAX_TEXT], "message": _text(r.get("message"))}
        for r in (item.get("related") if isinstance(item.get("related"), list) else [])
        if isinstance(r, dict) and _position(r)
    ][:MAX_RELATED]
    return {
        **item,
        "name": _text(item.get("name")),
        "filename": item["filename"][:MAX_TEXT],
        "message": _text(item.get("message")),
        "related": related,
    }


def _list(value: Any, limit: int = MAX_LIST) -> list[Any]:
    return value[:limit] if isinstance(value, list) else []


def bounded(data: dict[str, Any]) -> dict[str, Any]:
    """`data` with every list the host walks capped and every finding well-formed.

    A report comes from the run, so it may be forged: malformed findings are dropped (a
    consumer indexing `finding["line"]` must not crash), and lists are cut at the limits above.
    """
    data = dict(data)
    data["findings"] = [
        found for item in _list(data.get("findings"), MAX_FINDINGS) if (found := _finding(item))
    ]
    nonfinite = data.get("nonfinite")
    if isinstance(nonfinite, dict):
        events = [
            {**event, **{key: _text(event.get(key)) for key in ("phase", "op", "origin")}}
            for event in _list(nonfinite.get("events"), MAX_EVENTS)
            if isinstance(event, dict) and _position(event)
        ]
        chain = [i for i in _list(nonfinite.get("chain")) if _int(i)]
        data["nonfinite"] = {**nonfinite, "events": events, "chain": chain}
    records = []
    for line_record in _list(data.get("lines"), MAX_LINE_RECORDS):
        if not isinstance(line_record, dict) or not isinstance(line_record.get("filename"), str):
            continue
        if not _int(line_record.get("line")):
            continue
        entries = [
            {**entry, "outputs": _list(entry.get("outputs"), MAX_OUTPUTS)}
            for entry in _list(line_record.get("entries"), MAX_ENTRIES)
            if isinstance(entry, dict)
        ]
        records.append(
            {**line_record, "source": _text(line_record.get("source")), "entries": entries}
        )
    data["lines"] = records
    for key in ("warnings", "notes", "autocast"):
        if key in data:
            data[key] = _list(data.get(key))
    parameters = data.get("parameters")
    if isinstance(parameters, dict):
        data["parameters"] = {
            key: [_text(name) for name in _list(value) if isinstance(name, str)]
            if isinstance(value, list)
            else value
            for key, value in parameters.items()
        }
    exception = data.get("exception")
    if isinstance(exception, dict):
        exception = {
            **exception,
            "type": _text(exception.get("type")) or "Exception",
            "message": _text(exception.get("message")),
            "traceback": _list(exception.get("traceback"), 100),
        }
        if not _position(exception):
            exception.pop("filename", None)  # no position that consumers could index
        data["exception"] = exception
    elif exception is not None:
        data["exception"] = None
    return data


def synthesize(
    *, status: str, file: str, message: str, code: str, stopped_by: str, request: dict[str, Any]
) -> dict[str, Any]:
    """A report for a child that ended without writing one."""
    severity = "warning" if code == "TL906" else "error"
    name = "probe-limit" if code == "TL906" else "probe-error"
    return {
        "schema_version": SCHEMA_VERSION,
        "probe_version": None,
        "status": status,
        "stopped_by": stopped_by,
        "mode": request.get("mode", "script"),
        "target": {
            "file": file,
            "root": request.get("root"),
            "step": request.get("step"),
            "setup": request.get("setup"),
        },
        "bounds": {
            "steps": request.get("steps"),
            "batches": request.get("batches") or request.get("steps"),
            "timeout_s": request.get("timeout_s"),
            "memory_mb": request.get("memory_mb"),
            "output_cap_bytes": request.get("output_cap_bytes"),
        },
        "progress": {"optimizer_steps": None, "batches": None, "backward_calls": None},
        "device": {"requested": request.get("device"), "resolved": None, "observed": []},
        "environment": None,
        "findings": [
            {
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
        ],
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
