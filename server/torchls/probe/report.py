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
from typing import Any, cast

from torchls.probe import report_schema, untrusted
from torchls.probe.document import Finding, LineRecord, Report
from torchls.probe.scratch import Unreadable, read_regular
from torchls.records import record

SCHEMA_VERSION = 2
STATUSES = ("ok", "error", "timeout", "memory", "crashed")
SEVERITIES = ("error", "warning", "information")

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
    def from_json(cls, item: Finding) -> ProbeFinding:
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
    """`data` is the report document, typed by `document.Report` and checked against the schema
    when it was made (`make_report`); `root` (the project folder the host chose) and `allow`
    (files the host itself named, such as the target) say which files may be read to show
    source lines. Neither comes from the run."""

    data: Report
    root: str | None = None
    allow: tuple[str, ...] = ()

    @property
    def status(self) -> str:
        return self.data["status"]

    @property
    def findings(self) -> list[ProbeFinding]:
        return [ProbeFinding.from_json(item) for item in self.data["findings"]]

    @property
    def setup_error(self) -> str | None:
        """Why the repro could not run at all (no torch, device unavailable, bad target)."""
        exception = self.data["exception"]
        if exception is not None and exception["kind"] in ("setup", "device"):
            return exception["message"] or exception["type"]
        return None

    @property
    def lines(self) -> list[LineRecord]:
        return list(self.data["lines"])

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


def as_report(data: dict[str, Any]) -> tuple[Report | None, list[str]]:
    """`data` typed as a `Report` when it follows the schema, else (None, the problems)."""
    broken = report_schema.problems(data)
    return (None, broken) if broken else (cast(Report, data), [])


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
    """The report in `text`, or (None, why not); empty or None means no report at all.

    A report comes from the run, so it may be forged: one that breaks report.schema.json
    anywhere (an unknown field, a wrong type, a position out of range, a list past its bound)
    is refused whole, before any consumer walks it, and the reason names the first problems.
    """
    if not text:
        return None, None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None, "report.json is not valid JSON (cut short, or not written by the probe)"
    if not isinstance(data, dict):
        return None, "report.json is not a JSON object"
    broken = report_schema.problems(data)
    if broken:
        shown = untrusted.one_line("; ".join(broken), 600)
        return None, f"report.json breaks the report schema (version {SCHEMA_VERSION}): {shown}"
    return data, None


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
