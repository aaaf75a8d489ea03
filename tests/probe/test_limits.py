"""Runs that hit a bound end with the right status, a TL906 on the right line, and no leftovers."""

from __future__ import annotations

import sys
import threading

import pytest

from tests.probe import cases
from tests.probe.support import leftovers
from torchls.probe import ReproCancelled, ReproOptions, run_repro


def limit_finding(report):
    [finding] = [f for f in report.findings if f.code == "TL906"]
    return finding


# The timeouts leave room for `import torch` on a loaded machine: the limit covers the whole run.
def test_hang_is_stopped_with_status_timeout_on_the_hanging_line(repro):
    report, _ = repro(cases.HANG, timeout_s=5.0)
    assert report.status == "timeout"
    finding = limit_finding(report)
    assert finding.line == cases.marker_line(cases.HANG, "hang")
    assert "wall-clock" in finding.message
    assert leftovers("torchls_probe --request") == []


def test_hang_that_blocks_the_alarm_is_killed_from_outside(repro):
    report, _ = repro(cases.HANG_BLOCKING_SIGNALS, timeout_s=4.0)
    assert report.status == "timeout"
    assert "no line is known" in limit_finding(report).message
    assert leftovers("torchls_probe --request") == []


def test_memory_hog_ends_with_status_memory(repro):
    report, _ = repro(cases.MEMORY_HOG, memory_mb=1536)
    assert report.status == "memory"
    assert report.data["stopped_by"] == "memory"
    finding = limit_finding(report)
    assert finding.line == cases.marker_line(cases.MEMORY_HOG, "hog")
    assert "memory limit of 1536 MB" in finding.message


def test_stdout_flood_is_capped_at_the_printing_line(repro):
    cap = 64 << 10
    report, _ = repro(cases.FLOOD, output_cap_bytes=cap)
    assert report.status == "error"
    assert report.data["stopped_by"] == "output"
    assert limit_finding(report).line == cases.marker_line(cases.FLOOD, "flood")
    output = report.data["output"]
    assert output["bytes"] <= cap
    assert len(output["head"]) + len(output["tail"]) <= 8192


def test_flood_below_python_is_stopped_by_the_file_size_limit(repro):
    report, _ = repro(cases.FLOOD_FD, file_size_mb=4)
    assert report.data["stopped_by"] == "output"
    assert limit_finding(report).line == cases.marker_line(cases.FLOOD_FD, "flood")
    assert report.data["output"]["bytes"] <= 4 << 20


def test_segfault_is_reported_as_crashed(repro):
    report, _ = repro(cases.SEGFAULT)
    assert report.status == "crashed"
    [finding] = report.findings
    assert finding.code == "TL905" and "SIGSEGV" in finding.message


def test_cancel_ends_the_run_and_its_processes(project):
    path = project / "train.py"
    path.write_text(cases.HANG)
    cancel = threading.Event()

    def on_progress(event):
        if event.stage == "run":
            cancel.set()

    options = ReproOptions(python=sys.executable, timeout_s=60.0)
    with pytest.raises(ReproCancelled):
        run_repro(path, options, on_progress=on_progress, cancel_event=cancel)
    assert leftovers("torchls_probe --request") == []
