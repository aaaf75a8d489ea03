"""Hover with the repro's trace: the tensors a line produced, or the value behind a name.

In: a hover position, the document snapshot and the newest repro result for the file. Out:
compact Markdown (or None when the run traced nothing there):

- on a name whose value the run traced (the name being assigned, or a later use of it): that
  value's row: expression, shape, dtype, device, finite, min/max/mean and the gradient that
  reached it in the first backward;
- otherwise on a traced line: a table of every tensor the line produced;
- where non-finite values appeared on the line: whether they were born there (origin: made
  from finite inputs) or arrived (propagated), and the path from the first origin to the loss;
- on a line edited since the run: the old trace under a "stale" warning;
- after a distributed repro: rank 0's trace, and on a line whose values differ between ranks
  a mark with the other ranks' values.

Every string taken from the run's report (op and module names, dtypes, devices, phases, file
names) is untrusted: it goes through `untrusted.markdown` or `untrusted.code`, so a module
named like an image link renders as text and fetches nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pygls.uris import to_fs_path

from torchls.lsp.repro_lookup import ValueSpan, value_at
from torchls.lsp.repro_state import FileTrace, LineMap, ReproResult, real_path
from torchls.lsp.server import Snapshot, TorchLanguageServer
from torchls.probe import untrusted
from torchls.probe.document import Entry, Event, LineRecord, Summary

MAX_EXPRESSION = 40
MAX_EVENTS = 3
HEADER = "| expression | shape | dtype | device | finite | min / max / mean | grad |"
RULE = "|---|---|---|---|---|---|---|"
STALE = (
    "⚠ **Stale:** this line was edited after the repro ran; the trace below is of the old "
    "text. Run the repro again to refresh it."
)


# -- formatting -----------------------------------------------------------------------------------


def _number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "—"
    return f"{value:.4g}"


def _cell(text: object) -> str:
    """Run data as literal text, safe inside a Markdown table cell."""
    return untrusted.markdown(text)


def _code(text: object, limit: int = MAX_EXPRESSION) -> str:
    """Run data (or the user's own line) as a code span, cut to `limit` characters."""
    return untrusted.code(text, limit)


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _shape(summary: Summary) -> str:
    shape = summary.get("shape")
    if not isinstance(shape, list):
        return "—"
    return "scalar" if not shape else "[" + ", ".join(str(_int(d, -1)) for d in shape) + "]"


def nonfinite_counts(summary: Summary) -> str:
    counts = summary.get("nonfinite") or {}
    found = (
        (counts.get("nan"), "NaN"),
        (counts.get("posinf"), "+inf"),
        (counts.get("neginf"), "-inf"),
    )
    parts = [f"{count} {label}" for count, label in found if count]
    total = counts.get("numel")
    return ", ".join(parts) + (f" of {total}" if total else "")


def _finite(summary: Summary) -> str:
    if summary.get("uninitialized"):
        return "uninitialized"
    finite = summary.get("finite")
    if finite is None:
        return "—"
    return "✓" if finite else f"✗ {nonfinite_counts(summary)}"


def _stats(summary: Summary) -> str:
    """min / max / mean; where the tensor holds infinities or NaN, those are the extremes (the
    report's figures cover the finite values only, which alone would read as a normal range)."""
    if "min" not in summary:
        return "—"
    counts = summary.get("nonfinite") or {}
    low = "-inf" if counts.get("neginf") else _number(summary.get("min"))
    high = "+inf" if counts.get("posinf") else _number(summary.get("max"))
    mean = "nan" if counts.get("nan") or (low == "-inf" and high == "+inf") else None
    if mean is None:
        mean = low if low == "-inf" else high if high == "+inf" else _number(summary.get("mean"))
    return " / ".join((low, high, mean))


def _grad(grad: Summary | None) -> str:
    if grad is None:
        return "—"
    if grad.get("finite") is False:
        return f"✗ {nonfinite_counts(grad)}"
    return f"✓ mean {_number(grad.get('mean'))}"


def _expression(entry: Entry, line: str) -> str:
    column, end = _int(entry.get("column"), 1) - 1, _int(entry.get("end_column"), 1) - 1
    text = line[column:end] if 0 <= column < end <= len(line) else ""
    op = str(entry.get("op") or "")
    label = _code(text or op)
    if entry.get("module"):
        label += f" · {_cell(entry['module'])}"
    if text and op and op.rsplit(".", 1)[-1].strip("_") not in text:
        label += f" · {_cell(op)}"
    if _int(entry.get("count"), 1) > 1:
        label += f" x{_int(entry.get('count'))}"
    if entry.get("phase") not in (None, "forward"):
        label += f" ({_cell(entry['phase'])})"
    return label


def entry_row(entry: Entry, line: str, index: int | None = None) -> str:
    """One table row; `index` picks the output a name was unpacked from (`a, b = f(x)`)."""
    outputs = entry.get("outputs") or [{}]
    pick = index if index is not None and 0 <= index < len(outputs) else 0
    first = outputs[pick] if isinstance(outputs[pick], dict) else {}
    expression = _expression(entry, line)
    if index is not None and pick == index and len(outputs) > 1:
        expression += f" [output {index}]"
    elif len(outputs) > 1:
        expression += f" (+{len(outputs) - 1} outputs)"
    cells = [
        expression,
        _shape(first),
        _cell(first.get("dtype") or "—"),
        _cell(first.get("device") or "—"),
        _finite(first),
        _stats(first),
        _grad(entry.get("grad")),
    ]
    return "| " + " | ".join(cells) + " |"


def _run_summary(result: ReproResult) -> str:
    data = result.data
    steps = (data.get("progress") or {}).get("optimizer_steps")
    device = (data.get("device") or {}).get("resolved") or (data.get("device") or {}).get(
        "requested"
    )
    parts = []
    if isinstance(steps, int):
        parts.append(f"{steps} step{'s' if steps != 1 else ''}")
    if device:
        parts.append(f"on {_cell(device)}")
    ranks = data.get("distributed")
    if isinstance(ranks, dict) and isinstance(ranks.get("nproc"), int):
        parts.append(f"· rank {_int(ranks.get('shown_rank'))} of {_int(ranks.get('nproc'))}")
    return " ".join(parts)


def ranks_section(record: LineRecord, line: str) -> list[str]:
    """A distributed repro's line whose values differ between ranks: the others' values."""
    marks = record.get("ranks")
    if not isinstance(marks, dict) or not marks.get("differ"):
        return []
    rows = []
    for item in (marks.get("values") or [])[:4]:
        if not isinstance(item, dict):
            continue
        for entry in (item.get("entries") or [])[:4]:
            if isinstance(entry, dict):
                rows.append(
                    entry_row(entry, line).replace("| ", f"| rank {_int(item.get('rank'))}: ", 1)
                )
    if not rows:
        return []
    return [
        "≠ **The values on this line differ between ranks** (above: the shown rank's):",
        "\n".join([HEADER, RULE, *rows]),
    ]


# -- non-finite values --------------------------------------------------------------------------


def _where(event: Event, trace: FileTrace, mapping: LineMap) -> str:
    """Where an event is now: "line N" in this file (marked when edited), else file:line."""
    row = _int(event.get("line"))
    filename = event.get("filename")
    if isinstance(filename, str) and real_path(filename) != trace.path:
        return f"{_cell(filename.rsplit('/', 1)[-1])}:{row}"
    current = mapping.new_row(row)
    return f"line {current}" if current is not None else f"line {row} (edited)"


def _when(event: Event) -> str:
    """The phase and the optimizer step it belonged to, e.g. "forward, step 1"."""
    phase = _cell(event.get("phase") or "?")
    before = event.get("optimizer_steps_before")
    return f"{phase}, step {_int(before) + 1}" if isinstance(before, int) else phase


def _event_text(event: Event, result: ReproResult, trace: FileTrace, mapping: LineMap) -> str:
    op = _code(event.get("op") or "?", 200)
    counts = nonfinite_counts(event.get("summary") or {})
    if event.get("origin") == "mask":
        return (
            f"**Mask** ({_when(event)}): {op} wrote {counts} here on purpose; an infinity "
            "used as a mask is not a finding unless it reaches the loss."
        )
    if event.get("origin") == "cleaned":
        return (
            f"**Cleaned up** ({_when(event)}): {op} produced {counts} here, and the code replaced "
            "them before anything else used them (`x[x == inf] = 0`, `nan_to_num`); not a finding."
        )
    if event.get("origin") == "masked":
        return (
            f"**Origin** ({_when(event)}): {op} produced {counts} here from an input masked "
            "with an infinity (every position of a row masked?)."
        )
    if event.get("origin") == "op":
        title = "First non-finite value of the run" if event is result.first_event else "Origin"
        return f"**{title}** ({_when(event)}): {op} produced {counts} here from finite inputs."
    sources = [s for i in event.get("sources") or [] if (s := result.event(i)) is not None]
    came = ", ".join(f"{_where(s, trace, mapping)} {_code(s.get('op'), 200)}" for s in sources)
    if came:
        cause = f"its input came non-finite from {came}"
    elif event.get("phase") == "backward":
        cause = "the gradient flowing into it was already non-finite"
    elif event.get("phase") == "step":
        cause = "the parameter or its gradient was already non-finite"
    else:
        cause = "an input was already non-finite"
    return f"**Propagated** ({_when(event)}): {op} gave {counts}; {cause}."


def nonfinite_section(
    result: ReproResult, trace: FileTrace, mapping: LineMap, old_row: int, column: int | None
) -> list[str]:
    """What non-finite values did on this line (or at this column), and the path to the loss."""
    events = [
        e
        for e in trace.events
        if _int(e.get("line")) == old_row and (column is None or _int(e.get("column")) == column)
    ]
    if not events:
        return []
    lines = [_event_text(e, result, trace, mapping) for e in events[:MAX_EVENTS]]
    if len(events) > MAX_EVENTS:
        more = len(events) - MAX_EVENTS
        lines.append(f"…and {more} more non-finite event{'s' if more > 1 else ''} here.")
    chain = result.chain
    if len(chain) > 1 and any(e is link for e in events for link in chain):
        steps = []
        for position, event in enumerate(chain):
            label = "origin" if position == 0 else ("loss" if event.get("phase") == "loss" else "")
            text = f"{_where(event, trace, mapping)} {_code(event.get('op'), 200)}"
            steps.append(f"{text} ({label})" if label else text)
        lines.append("Path to the loss: " + " → ".join(steps))
    return lines


# -- the two hovers -------------------------------------------------------------------------------


def line_markdown(
    result: ReproResult, trace: FileTrace, mapping: LineMap, old_row: int, stale: bool
) -> str | None:
    """The table of tensors produced on baseline row `old_row`."""
    record = trace.lines.get(old_row)
    events = nonfinite_section(result, trace, mapping, old_row, None)
    if record is None and not events:
        return None
    line = trace.baseline_line(old_row)
    summary = _run_summary(result)
    parts = [f"**Repro trace** · line {old_row} of the run" + (f" · {summary}" if summary else "")]
    if stale:
        parts.append(STALE)
    if record is not None and record.get("entries"):
        rows = [entry_row(entry, line) for entry in record["entries"]]
        dropped = _int(record.get("dropped_entries"))
        table = "\n".join([HEADER, RULE, *rows])
        if dropped:
            table += f"\n\n…and {dropped} more operations on this line."
        parts.append(table)
        parts.extend(ranks_section(record, line))
    parts.extend(events)
    return "\n\n".join(parts)


def pick_entries(
    entries: list[Entry], column: int, end_column: int | None, exact: bool = False
) -> list[Entry]:
    """The traced ops that computed the whole expression at [column, end_column) (0-based code
    points): every exact match (a module constructor makes several tensors), else (unless
    `exact`) the widest op inside it, the latest among equals (entries are in first-seen
    order, outer ops last)."""
    exact_matches, inside = [], []
    for position, entry in enumerate(entries):
        start, end = _int(entry.get("column"), 1) - 1, _int(entry.get("end_column"), 1) - 1
        if start == column and (end_column is None or end == end_column):
            exact_matches.append(entry)
        elif start >= column and (end_column is None or end <= end_column):
            inside.append((end - start, position, entry))
    if exact_matches:
        return exact_matches
    if exact:
        return []
    return [max(inside, key=lambda item: item[:2])[2]] if inside else []


def value_markdown(
    result: ReproResult, trace: FileTrace, mapping: LineMap, value: ValueSpan
) -> str | None:
    """The trace of the value `value.name` holds, or None when the run did not trace it. A
    call of a function of this file ran its ops on the function's own lines: then the traced
    value one of its `return`s gave back is shown (ops inside the call's parentheses computed
    its arguments, not its result)."""
    own = _traced_value(result, trace, mapping, value, None, exact=bool(value.returned))
    if own is not None:
        return own
    for returned in value.returned:
        text = _traced_value(result, trace, mapping, returned, value)
        if text is not None:
            return text
    return None


def _traced_value(
    result: ReproResult,
    trace: FileTrace,
    mapping: LineMap,
    value: ValueSpan,
    call: ValueSpan | None,
    exact: bool = False,
) -> str | None:
    located = mapping.old_row(value.row)
    if located is None:
        return None
    old_row, stale = located
    record = trace.lines.get(old_row)
    if record is None:
        return None
    if stale:
        return line_markdown(result, trace, mapping, old_row, stale=True)
    end_column = value.end_column if value.end_row == value.row else None
    entries = pick_entries(record.get("entries") or [], value.column, end_column, exact)
    if not entries:
        return None
    line = trace.baseline_line(old_row)
    element = f" (element {value.index} of the result)" if value.index is not None else ""
    current = mapping.new_row(old_row) or old_row
    summary = _run_summary(result)
    via = f" · returned by {_code(call.callee)}" if call is not None else ""
    title = f"**`{value.name}`**{element}{via} · repro trace of line {current}"
    parts = [
        title + (f" · {summary}" if summary else ""),
        "\n".join([HEADER, RULE, *(entry_row(entry, line, value.index) for entry in entries)]),
    ]
    parts.extend(ranks_section(record, line))
    column = _int(entries[-1].get("column"))
    parts.extend(nonfinite_section(result, trace, mapping, old_row, column))
    return "\n\n".join(parts)


def _on_identifier(line: str, column: int) -> bool:
    return any(
        0 <= c < len(line) and (line[c].isalnum() or line[c] == "_") for c in (column, column - 1)
    )


async def repro_hover(
    server: TorchLanguageServer, snapshot: Snapshot, row: int, column: int
) -> str | None:
    """The repro hover at (row, column) of `snapshot` (1-based row, code-point column)."""
    path = to_fs_path(snapshot.uri)
    found = server.repro_store.newest_for(path)
    if found is None:
        return None
    result, trace = found
    mapping = trace.line_map(snapshot.version, snapshot.source)
    line = server.line_index(snapshot.source).line(row)
    if _on_identifier(line, column):
        loop = asyncio.get_running_loop()
        value = await loop.run_in_executor(
            server.analysis_pool,
            value_at,
            server.parsed_by_uri,
            snapshot.uri,
            snapshot.source,
            path or snapshot.uri,
            row,
            column,
        )
        # The store may have changed while the lookup queued (a re-run, a clear).
        now = server.repro_store.newest_for(path)
        if value is not None and now is not None and now[0] is result:
            markdown = value_markdown(result, trace, mapping, value)
            if markdown is not None:
                return markdown
    located = mapping.old_row(row)
    if located is None:
        return None
    old_row, stale = located
    return line_markdown(result, trace, mapping, old_row, stale)
