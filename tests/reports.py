"""Probe reports for tests that feed the server report data without running the probe.

Why: the server refuses a report that breaks `report.schema.json` as a whole, so a test's
hand-made report must be complete; this starts from the report the server itself writes for a
run that wrote none (every required field, valid types) and replaces the fields a test is about.
In: the fields to replace. Out: a report dict that follows the schema when those fields do.
"""

from __future__ import annotations

from typing import Any

from torchls.probe.report import synthesize


def schema_report(**fields: Any) -> dict[str, Any]:
    """A schema-valid report with `fields` replaced (`findings=[...]`, `lines=[...]`)."""
    base = synthesize(
        status="ok", file="/x.py", message="m", code="TL905", stopped_by="end", request={}
    )
    return {**base, **fields}
