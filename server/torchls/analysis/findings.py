"""The value types the analysis hands out: findings, fixes and text edits.

Positions are 1-based rows and 0-based columns counted in Unicode code points, the unit a Python
`str` indexes by. Output layers convert: JSON adds 1 to columns, the LSP layer converts to UTF-16.
"""

from __future__ import annotations

from typing import Literal

from torchls.records import field, record

Severity = Literal["error", "warning", "information"]
Applicability = Literal["safe", "unsafe"]


@record(frozen=True, order=True)
class Position:
    """A 1-based row and a 0-based column in code points."""

    row: int
    column: int


@record(frozen=True)
class Span:
    """The text from `start` to `end` (exclusive)."""

    start: Position
    end: Position

    @classmethod
    def of(cls, row: int, column: int, end_row: int, end_column: int) -> Span:
        return cls(Position(row, column), Position(end_row, end_column))


@record(frozen=True)
class Edit:
    """Replace the text between `span.start` and `span.end` with `content`."""

    span: Span
    content: str


@record(frozen=True)
class Fix:
    """Edits that repair a finding, safe or unsafe to apply without review."""

    applicability: Applicability
    message: str
    edits: tuple[Edit, ...]


@record(frozen=True)
class Related:
    """A second location that explains a finding (where the softmax was applied, say)."""

    span: Span
    message: str
    filename: str | None = None


@record(frozen=True)
class Finding:
    """One problem a rule reported: where, what, how bad, and how to fix it if known."""

    code: str
    message: str
    severity: Severity
    span: Span
    fix: Fix | None = None
    related: tuple[Related, ...] = field(default=())
