"""The human-readable rendering of a repro report (`torchls repro --output-format text`).

In: a `ReproReport`. Out: a string a person would rather read than the JSON: status and device,
the sandbox layers that held (and loudly, the ones that did not), the first non-finite value with
its source line and a caret under the expression, the origin -> loss chain, parameters without
gradients, loss-contract violations, the findings, and a compact per-line table of shapes.

Everything in a report came from the run, so it is untrusted: source lines are shown only for
files `ProjectSources` allows (inside the project, no links, no /proc or /dev, bounded), never
for whatever path the report names, and the finished text is stripped of every control
character before it reaches a terminal or a CI log.
"""

from __future__ import annotations

import os
from typing import Any

from torchls.probe import untrusted
from torchls.probe.document import Event, Report, Sandbox, Summary
from torchls.probe.report import ReproReport
from torchls.probe.sources import ProjectSources

MAX_TABLE_ROWS = 40


def render(report: ReproReport, cwd: str | None = None) -> str:
    data = report.data
    base = cwd or os.getcwd()
    sources = ProjectSources(report.root, allow=report.allow)
    out: list[str] = []
    places = Places(base, sources)
    out += _header(data, places)
    out += _sandbox(data)
    out += _setup_error(data)
    out += _first_nonfinite(data, places, sources)
    out += _parameters(data)
    out += _contracts(data, places, sources)
    out += _exception(data, places, sources)
    out += _findings(data, places)
    out += _ranks(data, places)
    out += _table(data, places)
    out += _output(data)
    out += _written(data, places)
    out += _notes(data)
    count = len(data.get("findings") or [])
    if report.setup_error is None:
        out.append("")
        out.append("No findings." if count == 0 else f"{count} finding{'s' if count != 1 else ''}.")
    return untrusted.terminal("\n".join(out)) + "\n"


def _rel(path: str | None, base: str) -> str:
    if not path:
        return "?"
    try:
        relative = os.path.relpath(path, base)
    except ValueError:
        return path
    return path if relative.startswith("..") else relative


class Places:
    """Where a report location is, as the user reads the file: `path:line[:column]`, and in a
    notebook `path:cell N:line[:column]` with the line counted in the cell (the run's rows are
    those of its code cells read as one module)."""

    def __init__(self, base: str, sources: ProjectSources) -> None:
        self.base = base
        self.sources = sources

    def at(self, filename: Any, line: Any, column: Any = None) -> str:
        where = _rel(filename, self.base)
        cells = self.sources.cells(filename) if isinstance(line, int) else None
        if cells is not None:
            cell, line = cells.locate(line)
            where = f"{where}:cell {cell}"
        return f"{where}:{line}" + (f":{column}" if column is not None else "")


def _header(data: Report, places: Places) -> list[str]:
    target = data.get("target") or {}
    status = data.get("status", "?")
    stopped = {
        "steps": "stopped after {n} optimizer step{s}",
        "backwards": "stopped after {k} backward pass{kes} (no optimizer: a hand-written update)",
        "batches": "stopped after {b} batch{es}",
        "end": "ran to completion",
        "exit": "the script exited",
        "exception": "the code raised",
        "timeout": "stopped by the wall-clock limit",
        "cpu": "stopped by the CPU-time limit",
        "memory": "stopped by the memory limit",
        "output": "stopped by the output limit",
        "setup": "could not start",
        "crash": "the interpreter died",
        "hang": "a collective hung",
        "peer": "stopped because another rank failed",
        "rendezvous": "the ranks never started (torchrun's rendezvous)",
    }.get(str(data.get("stopped_by")), str(data.get("stopped_by")))
    progress = data.get("progress") or {}
    steps = progress.get("optimizer_steps") or 0
    batches = progress.get("batches") or 0
    backwards = progress.get("backward_calls") or 0
    stopped = stopped.format(
        n=steps,
        s="" if steps == 1 else "s",
        b=batches,
        es="" if batches == 1 else "es",
        k=backwards,
        kes="" if backwards == 1 else "es",
    )
    timing = data.get("timing") or {}
    wall = timing.get("server_wall_s")
    runner = timing.get("runner", "")
    when = f" ({runner}, {wall:.2f} s)" if isinstance(wall, (int, float)) else ""
    lines = [f"torchls repro {_rel(target.get('file'), places.base)}: {status}, {stopped}{when}"]
    device = data.get("device") or {}
    observed = ", ".join(device.get("observed") or []) or "none"
    resolved = device.get("resolved") or "unresolved"
    lines.append(
        f"device: {resolved} (requested {device.get('requested')}; tensors seen on {observed})"
    )
    for warning in device.get("warnings") or []:
        lines.append(f"  warning: {warning}")
    return lines


def _sandbox(data: Report) -> list[str]:
    sandbox: Sandbox = data.get("sandbox") or {"layers": []}
    layers = sandbox["layers"]
    held = [layer["name"] for layer in layers if layer["held"]]
    lines = [f"sandbox: {', '.join(held) or 'nothing'}"]
    for layer in layers:
        if not layer["held"]:
            lines.append(f"  NOT HELD: {layer['name']}: {layer.get('detail', '')}")
    for warning in sandbox.get("warnings") or []:
        lines.append(f"  warning: {warning}")
    return lines


def _setup_error(data: Report) -> list[str]:
    exception = data["exception"]
    if exception is None or exception["kind"] not in ("setup", "device"):
        return []
    return ["", f"error: {exception['message']}"]


def _caret(
    sources: ProjectSources, filename: str, line: int, column: int, end_column: int, note: str
) -> list[str]:
    text = untrusted.terminal(sources.line(filename, line))
    if not text:
        return [f"  {note}"]
    cells = sources.cells(filename)
    number = str(cells.locate(line)[1] if cells is not None else line)  # a notebook: cell line
    gutter = " " * len(number)
    width = max(1, end_column - column)
    return [
        f"  {number} | {text}",
        f"  {gutter} | {' ' * (column - 1)}{'^' * width} {note}".rstrip(),
    ]


def _event_by_index(data: Report, index: int | None) -> Event | None:
    for event in data["nonfinite"]["events"]:
        if event["index"] == index:
            return event
    return None


# Non-finite values that are no finding, and why (the `origin` of docs/probe-report.md).
_QUIET_ORIGINS = {
    "mask": "an infinity written as a mask",
    "cleaned": "replaced by the code before any use",
}


def _first_nonfinite(data: Report, places: Places, sources: ProjectSources) -> list[str]:
    nonfinite = data["nonfinite"]
    events = nonfinite["events"]
    if not events:
        return []
    first = next((f for f in data["findings"] if f["code"] == "TL901"), None)
    event = _event_by_index(data, nonfinite.get("first")) or events[0]
    where = f"{places.at(event['filename'], event['line'], event['column'])}"
    lines = ["", f"first non-finite value: {event['phase']}, {where}"]
    note = first["message"].split(": ", 1)[-1] if first else event["op"]
    if first is None and event["origin"] in _QUIET_ORIGINS:
        note = f"{event['op']} ({_QUIET_ORIGINS[event['origin']]}: not a finding)"
    lines += _caret(
        sources, event["filename"], event["line"], event["column"], event["end_column"], note
    )
    chain = [e for i in nonfinite["chain"] if (e := _event_by_index(data, i)) is not None]
    if len(chain) > 1:
        hops = [f"{places.at(e['filename'], e['line'])} {e['op']} ({e['origin']})" for e in chain]
        lines.append("  chain: " + " -> ".join(hops))
    for phase in ("backward", "step"):
        later = next((e for e in events if e["phase"] == phase), None)
        if later is not None:
            what = later.get("detail") or later["op"]
            lines.append(
                f"  first in {phase}: {places.at(later['filename'], later['line'])} {what} "
                f"({later['origin']})"
            )
    return lines


def _parameters(data: Report) -> list[str]:
    params = data["parameters"]
    lines = []
    for names, label in (
        (params.get("without_grad"), "parameters without gradients"),
        (params.get("zero_grad"), "parameters with all-zero gradients"),
        (params.get("not_in_optimizer"), "parameters in no optimizer"),
    ):
        if names:
            lines.append(f"{label}: {', '.join(names)}")
    return ["", *lines] if lines else []


def _contracts(data: Report, places: Places, sources: ProjectSources) -> list[str]:
    found = [f for f in data["findings"] if f["code"] == "TL903"]
    if not found:
        return []
    lines = ["", "contract violations:"]
    for item in found:
        where = f"{places.at(item['filename'], item['line'], item['column'])}"
        lines.append(f"  {where}: {item['message']}")
        lines += [
            "  " + text
            for text in _caret(
                sources, item["filename"], item["line"], item["column"], item["end_column"], ""
            )
        ]
    return lines


def _exception(data: Report, places: Places, sources: ProjectSources) -> list[str]:
    exception = data["exception"]
    if exception is None or exception["kind"] not in ("user", "limit"):
        return []
    filename, line = exception.get("filename"), exception.get("line")
    column, end_column = exception.get("column"), exception.get("end_column")
    if not filename or line is None or column is None or end_column is None:
        return []
    where = f"{places.at(filename, line, column)}"
    lines = ["", f"exception: {exception['type']} at {where}"]
    note = exception["message"].strip().splitlines()
    lines += _caret(sources, filename, line, column, end_column, note[0][:160] if note else "")
    return lines


def _findings(data: Report, places: Places) -> list[str]:
    found = data.get("findings") or []
    if not found:
        return []
    # TL903 is already shown, with its source line, under "contract violations".
    found = [item for item in found if item.get("code") != "TL903"]
    if not found:
        return []
    lines = ["", "findings:"]
    for item in found:
        where = f"{places.at(item['filename'], item['line'], item['column'])}"
        lines.append(f"  {where}: {item['code']} [{item['severity']}] {item['message']}")
        for related in item.get("related") or []:
            lines.append(
                f"      {places.at(related['filename'], related['line'])}: {related['message']}"
            )
    return lines


def _ranks(data: Report, places: Places) -> list[str]:
    """A distributed repro: the ranks, how each ended, and the stacks taken at a hang."""
    block = data.get("distributed")
    if not isinstance(block, dict) or not block.get("ranks"):
        return []
    backend = (block.get("backend") or {}).get("used") or "none (no process group)"
    note = (block.get("backend") or {}).get("note")
    lines = [
        "",
        f"ranks: {block.get('nproc')} under torchrun, backend {backend}; the lines below are "
        f"rank {block.get('shown_rank', 0)}'s" + (f" ({note})" if note else ""),
    ]
    for rank in block.get("ranks") or []:
        how = rank.get("stopped_by") or "no report"
        if not rank.get("report"):
            how = "no report" + (
                f" (exit code {rank['exit_code']})" if rank.get("exit_code") is not None else ""
            )
        steps = rank.get("optimizer_steps")
        count = f", {steps} optimizer steps" if isinstance(steps, int) else ""
        lines.append(f"  rank {rank.get('rank')}: {rank.get('status')}, {how}{count}")
    for stack in block.get("stacks") or []:
        where = stack.get("where") or {}
        at = f" at {places.at(where.get('filename'), where.get('line'))}" if where else ""
        lines.append(
            f"  rank {stack.get('rank')} at the {stack.get('reason')}: {stack.get('state')}{at}"
        )
        for frame in (stack.get("frames") or [])[-8:]:
            lines.append(
                f"      {places.at(frame.get('filename'), frame.get('line'))} "
                f"in {frame.get('function')}"
            )
    return lines


def _shape(output: Summary) -> str:
    return "[" + ", ".join(str(d) for d in output.get("shape", [])) + "]"


def _table(data: Report, places: Places) -> list[str]:
    rows = []
    for record in data["lines"]:
        for entry in record["entries"]:
            outputs: list[Summary] = entry.get("outputs") or [{}]
            first = outputs[0]
            op = entry["op"]
            if entry.get("setup") or first.get("uninitialized") or op.startswith("torch.nn.init."):
                # Building, moving, resetting or saving the model (layer constructors,
                # `model.to`, BatchNorm's running statistics, `state_dict()`): JSON only.
                continue
            finite = "NaN/Inf" if entry.get("nonfinite_count") else "yes"
            # A distributed repro: this line's values are not the same on every rank.
            ranks = record.get("ranks")
            differs = " *" if ranks is not None and ranks["differ"] else ""
            rows.append(
                (
                    f"{places.at(record['filename'], record['line'])}{differs}",
                    op,
                    _shape(first) + (f" +{len(outputs) - 1}" if len(outputs) > 1 else ""),
                    str(first.get("dtype", "")),
                    finite,
                    entry.get("module") or "",
                )
            )
    if not rows:
        return []
    shown = rows[:MAX_TABLE_ROWS]
    header = ("line", "op", "shape", "dtype", "finite", "module")
    widths = [max(len(row[i]) for row in [header, *shown]) for i in range(len(header))]
    lines = ["", "shapes:"]
    for row in [header, *shown]:
        lines.append(
            "  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        )
    if len(rows) > MAX_TABLE_ROWS:
        lines.append(f"  ... {len(rows) - MAX_TABLE_ROWS} more entries in the JSON report")
    if any(row[0].endswith(" *") for row in rows):
        lines.append("  * the values on this line differ between ranks (the JSON has theirs)")
    return lines


def _written(data: Report, places: Places) -> list[str]:
    """What the run wrote into the project's copy (thrown away, unless --keep-outputs)."""
    written = data.get("written") or {}
    files = written.get("files") or []
    removed = written.get("removed") or []
    if not files and not removed:
        return []
    kept = written.get("kept_in")
    where = f"kept in {kept}" if kept else "into the sandbox's copy; --keep-outputs DIR keeps them"
    lines = ["", f"wrote {len(files)} file{'s' if len(files) != 1 else ''} ({where}):"]
    for item in files[:20]:
        size = "link" if item.get("kind") == "link" else _bytes(int(item.get("bytes") or 0))
        lines.append(f"  {_rel(item.get('path'), places.base)}  {size}")
    if len(files) > 20 or written.get("truncated"):
        lines.append("  ... more in the JSON report")
    for path in removed[:5]:
        lines.append(f"  removed {_rel(path, places.base)} (in the copy only)")
    return lines


def _bytes(size: int) -> str:
    for unit, shift in (("MB", 20), ("kB", 10)):
        if size >= 1 << shift:
            return f"{size / (1 << shift):.1f} {unit}"
    return f"{size} B"


def _notes(data: Report) -> list[str]:
    """What the run and the host noted about the run itself (a bound that cut a data pass,
    dropped output, a probe error): one line each, the first few, as untrusted text."""
    notes = [note for note in data.get("notes") or [] if isinstance(note, str) and note.strip()]
    if not notes:
        return []
    lines = ["", "notes:"]
    lines += [f"  {untrusted.one_line(note, 300)}" for note in notes[:5]]
    if len(notes) > 5:
        lines.append(f"  ... {len(notes) - 5} more in the JSON report")
    return lines


def _output(data: Report) -> list[str]:
    output = data.get("output") or {}
    size = output.get("bytes") or 0
    if not size:
        return []
    note = " (truncated in the report)" if output.get("truncated") else ""
    lines = ["", f"output: {size} bytes{note}"]
    tail = (output.get("tail") or output.get("head") or "").rstrip().splitlines()[-5:]
    lines += [f"  | {line[:160]}" for line in tail]
    return lines
