"""What the tracer remembers: per-line entries and non-finite events, with hard caps.

In: locations, op names and tensor summaries from the tracer. Out: plain objects that
`report.py` turns into JSON. Caps keep a long loop from growing the report: a line keeps at most
`max_entries` distinct (op, columns, output shapes) entries and only counts repeats; further
distinct entries and lines are counted as dropped. Everything is kept in first-seen order so that
two runs of the same code produce the same report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torchls_probe.attribution import Location


@dataclass
class Entry:
    op: str
    col: int | None
    end_col: int | None
    module: str | None
    phase: str
    outputs: list[dict[str, Any]]
    count: int = 1
    nonfinite_count: int = 0
    grad: dict[str, Any] | None = None
    setup: bool = False  # ran under a torch.nn method that builds, moves or saves a model


@dataclass
class LineRecord:
    filename: str
    line: int
    entries: dict[tuple[Any, ...], Entry] = field(default_factory=dict)
    dropped_entries: int = 0


class LineTable:
    def __init__(self, max_lines: int, max_entries: int) -> None:
        self.max_lines = max_lines
        self.max_entries = max_entries
        self.lines: dict[tuple[str, int], LineRecord] = {}
        self.dropped_lines = 0

    def find(self, loc: Location, key: tuple[Any, ...]) -> Entry | None:
        record = self.lines.get(loc.key())
        return record.entries.get(key) if record is not None else None

    def room(self, loc: Location) -> bool:
        """Whether `add` would store a new entry at `loc`; when not, the drop is counted here
        (as `add` would count it), so that a capped line costs no summary."""
        record = self.lines.get(loc.key())
        if record is None:
            if len(self.lines) >= self.max_lines:
                self.dropped_lines += 1
                return False
            return True
        if len(record.entries) >= self.max_entries:
            record.dropped_entries += 1
            return False
        return True

    def add(self, loc: Location, key: tuple[Any, ...], entry: Entry) -> Entry | None:
        """Store a new entry; None when a cap dropped it (the drop is counted)."""
        record = self.lines.get(loc.key())
        if record is None:
            if len(self.lines) >= self.max_lines:
                self.dropped_lines += 1
                return None
            record = self.lines[loc.key()] = LineRecord(loc.filename, loc.line)
        if len(record.entries) >= self.max_entries:
            record.dropped_entries += 1
            return None
        record.entries[key] = entry
        return entry


@dataclass
class Event:
    """The first non-finite value seen at one (line, op, phase)."""

    index: int
    phase: str
    origin: str  # "op": produced here from finite inputs; "propagated": an input was non-finite
    location: Location
    op: str
    module: str | None
    summary: dict[str, Any] | None
    sources: list[int] = field(default_factory=list)
    step: int = 0
    detail: str = ""
    # The origin before it became "cleaned" (the code replaced the value before any use), kept
    # so that a later use of a still-living value can take that back.
    uncleaned: str = ""


class Events:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.items: list[Event] = []
        self.dropped = 0
        self._seen: dict[tuple[Any, ...], Event | None] = {}

    def known(self, loc: Location, op: str, phase: str) -> bool:
        """Whether an event at (line, op, phase) was seen already (`add` would not store it)."""
        return (loc.key(), op, phase) in self._seen

    def add(self, event: Event) -> Event | None:
        """Store `event`; a repeat returns the stored one, a capped one returns None."""
        key = (event.location.key(), event.op, event.phase)
        if key in self._seen:
            return self._seen[key]
        if len(self.items) >= self.limit:
            self.dropped += 1
            self._seen[key] = None
            return None
        event.index = len(self.items)
        self.items.append(event)
        self._seen[key] = event
        return event

    def relabel(self, line_key: tuple[str, int], old: str, new: str) -> None:
        """The line that produced the loss: its forward events become `loss` events."""
        for event in self.items:
            if event.location.key() == line_key and event.phase == old:
                event.phase = new
