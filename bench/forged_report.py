"""Benchmark: what a forged repro report costs the host, against an honest one, in the same run.

A run can replace its report with anything up to the size the host reads (16 MB). Two forgeries:
`forged` is the largest report that still follows the report schema (every list at its bound:
200 findings of 20 related locations, 100 events, 1000 lines of 16 entries, 1000 warnings; every
location naming `/dev/zero`, `/proc/self/environ`, a 50 MB file inside the project, or one of
thousands of distinct project files; each message a long string of Markdown and escapes), fed
through what the host does with a report: parse and check it against the schema, render the
CLI's text report, build the editor's per-file result (the reads of source lines), then answer
hovers on a traced line. `oversized` breaks the schema (past every bound, 16 MB): the host only
parses and refuses it. Prints, for each: peak Python memory (tracemalloc), wall time of each
phase (`load_ms` is `json.loads` alone, the floor of `parse_ms`) and hover latency p50/p95,
with the ratios to the honest report. No assertions.
Usage: python bench/forged_report.py [--hovers 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from torchls.lsp import repro_hover
from torchls.lsp.repro_state import build_result
from torchls.probe.report import ReproReport, parse_probe_report, synthesize
from torchls.probe.runner import REPORT_READ_LIMIT
from torchls.probe.text import render

HOSTILE = "![x](https://evil.example/?k=1) \x1b]52;c;eA==\x07 **b** | [c](command:x) " * 8


def _document(**fields: Any) -> dict[str, Any]:
    """A report that follows the schema, with `fields` replaced."""
    base = synthesize(
        status="ok", file="/x.py", message="m", code="TL904", stopped_by="end", request={}
    )
    return {**base, **fields}


def _position(filename: str, line: int) -> dict[str, Any]:
    return {"filename": filename, "line": line, "column": 1, "end_line": line, "end_column": 4}


def _entry(op: str) -> dict[str, Any]:
    summary = {"shape": [8, 4], "dtype": "torch.float32", "device": "cpu", "finite": True}
    summary.update(min=-1.0, max=1.0, mean=0.0)
    return {"op": op, "column": 5, "end_column": 12, "count": 1, "outputs": [summary]}


def honest(target: Path) -> str:
    lines = [
        {"filename": str(target), "line": row, "entries": [_entry("torch.relu")]}
        for row in range(1, 40)
    ]
    finding = {"code": "TL904", "severity": "information", "message": "a warning", "related": []}
    data = _document(findings=[{**finding, **_position(str(target), 3)}], lines=lines)
    return json.dumps(data)


def forged(target: Path, project: Path) -> str:
    """The largest forgery the schema lets through."""
    names = ["/dev/zero", "/proc/self/environ", str(project / "huge.py"), str(target)]
    names += [str(project / f"mod_{i}.py") for i in range(5000)]
    related = [{**_position(names[i % len(names)], 1), "message": HOSTILE} for i in range(20)]
    findings = [
        {
            "code": "TL901",
            "severity": "error",
            "message": HOSTILE,
            "related": related,
            **_position(name, 1),
        }
        for name in names[:200]
    ]
    events = [
        {"index": i, "phase": "forward", "origin": "op", "op": HOSTILE, **_position(n, 1)}
        for i, n in enumerate(names[:100])
    ]
    lines = [
        {"filename": str(target), "line": 1 + row % 40, "entries": [_entry(HOSTILE)] * 16}
        for row in range(1000)
    ]
    warning = {"category": "UserWarning", "message": HOSTILE}
    data = _document(
        status="error",
        findings=findings,
        nonfinite={"events": events, "first": 0, "chain": list(range(len(events))), "dropped": 0},
        lines=lines,
        exception={"kind": "user", "type": HOSTILE, "message": HOSTILE, **_position(names[0], 2)},
        warnings=[warning] * 1000,
    )
    text = json.dumps(data)
    while len(text) > REPORT_READ_LIMIT:  # the host reads no more: halve the lines
        del data["lines"][len(data["lines"]) // 2 :]
        text = json.dumps(data)
    return text


def oversized(target: Path, project: Path) -> str:
    """Past every bound of the schema, up to what the host reads: refused whole."""
    names = ["/dev/zero", "/proc/self/environ", str(project / "huge.py"), str(target)]
    names += [str(project / f"mod_{i}.py") for i in range(5000)]
    related = [{**_position(names[i % len(names)], 1), "message": HOSTILE} for i in range(20)]
    findings = [
        {
            "code": "TL901",
            "severity": "error",
            "message": HOSTILE,
            "related": related,
            **_position(name, 1),
        }
        for name in names
    ]
    events = [
        {"index": i, "phase": "forward", "origin": "op", "op": HOSTILE, **_position(n, 1)}
        for i, n in enumerate(names)
    ]
    lines = [
        {"filename": str(target), "line": 1 + row % 40, "entries": [_entry(HOSTILE)] * 32}
        for row in range(2_000)
    ]
    data = {
        "status": "error",
        "findings": findings,
        "nonfinite": {"events": events, "first": 0, "chain": list(range(len(events)))},
        "lines": lines,
        "exception": {
            "kind": "user",
            "type": HOSTILE,
            "message": HOSTILE,
            **_position(names[0], 2),
        },
        "warnings": [HOSTILE] * 10_000,
    }
    text = json.dumps(data)
    while len(text) > REPORT_READ_LIMIT:  # the host reads no more: halve the largest list
        lists = [data["findings"], data["nonfinite"]["events"], data["lines"], data["warnings"]]
        largest = max(lists, key=lambda items: len(json.dumps(items)))
        del largest[len(largest) // 2 :]
        text = json.dumps(data)
    return text


def measure(
    text: str, honest_text: str, target: Path, project: Path, hovers: int
) -> dict[str, float]:
    parse_probe_report(honest_text)  # the schema and its validator are loaded once per process
    before = time.perf_counter()
    json.loads(text)
    loaded = time.perf_counter()
    tracemalloc.start()
    started = time.perf_counter()
    data, _ = parse_probe_report(text)
    parsed = time.perf_counter()
    if data is None:  # refused by the schema: nothing else runs
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return {
            "peak_mb": peak / 2**20,
            "load_ms": (loaded - before) * 1000,
            "parse_ms": (parsed - started) * 1000,
            "render_ms": 0.0,
            "result_ms": 0.0,
            "hover_p50_ms": 0.0,
            "hover_p95_ms": 0.0,
            "report_mb": len(text) / 2**20,
        }
    render(ReproReport(data, root=str(project), allow=(str(target),)), cwd=str(project))
    rendered = time.perf_counter()
    result = build_result(target.as_uri(), 1, data, {}, root=project)
    built = time.perf_counter()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    trace = next(iter(result.files.values()))
    mapping = trace.line_map(None, "\n".join(trace.baseline))
    times = []
    for _ in range(hovers):
        begin = time.perf_counter()
        repro_hover.line_markdown(result, trace, mapping, 3, stale=False)
        times.append((time.perf_counter() - begin) * 1000)
    times.sort()
    return {
        "peak_mb": peak / 2**20,
        "load_ms": (loaded - before) * 1000,
        "parse_ms": (parsed - started) * 1000,
        "render_ms": (rendered - parsed) * 1000,
        "result_ms": (built - rendered) * 1000,
        "hover_p50_ms": statistics.median(times),
        "hover_p95_ms": times[int(len(times) * 0.95) - 1],
        "report_mb": len(text) / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hovers", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        project = Path(folder)
        target = project / "train.py"
        target.write_text("".join(f"y{i} = torch.relu(x)\n" for i in range(40)))
        with open(project / "huge.py", "wb") as handle:
            handle.truncate(50 << 20)
        for i in range(0, 5000, 50):  # some of the named files exist
            (project / f"mod_{i}.py").write_text("x = 1\n")
        plain = honest(target)
        base = measure(plain, plain, target, project, args.hovers)
        bad = measure(forged(target, project), plain, target, project, args.hovers)
        huge = measure(oversized(target, project), plain, target, project, args.hovers)
    print(f"{'':14} {'honest':>10} {'forged':>10} {'ratio':>8} {'oversized':>10} {'ratio':>8}")
    for key in base:
        one = bad[key] / base[key] if base[key] else float("nan")
        two = huge[key] / base[key] if base[key] else float("nan")
        print(
            f"{key:14} {base[key]:10.2f} {bad[key]:10.2f} {one:8.1f}x {huge[key]:10.2f} {two:8.1f}x"
        )


if __name__ == "__main__":
    main()
