"""Helpers shared by the probe tests: finding codes, sandbox layers, leftover processes, and
one run cold or warm."""

from __future__ import annotations

import os
from pathlib import Path

from torchls.probe import ReproOptions, ReproReport, ReproSession
from torchls.probe.prepare import prepare
from torchls.probe.sandbox import bwrap_works


def bwrap_usable() -> bool:
    return bwrap_works()[0]


def leftovers(marker: str) -> list[int]:
    """Live (non-zombie) processes whose command line contains `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read().decode("utf-8", "replace")
            with open(f"/proc/{entry}/stat", encoding="utf-8") as handle:
                state = handle.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmdline and state != "Z":
            found.append(int(entry))
    return found


def codes(report: ReproReport) -> list[str]:
    return [finding.code for finding in report.findings]


def layer(report: ReproReport, name: str) -> dict[str, object]:
    for item in report.data["sandbox"]["layers"]:
        if item["name"] == name:
            return item
    raise AssertionError(f"no sandbox layer {name!r}")


def run_as(runner: str, path: Path, options: ReproOptions) -> ReproReport:
    """One run of `path` through a fresh session: "cold", or "warm" (the worker started first,
    so the run is served by it)."""
    session = ReproSession(warm=runner == "warm")
    try:
        if runner == "warm":
            session.prewarm_prepared(prepare(path, options), wait=True)
        return session.run(path, options)
    finally:
        session.close()
