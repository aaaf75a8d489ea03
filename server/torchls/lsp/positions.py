"""Position conversion between the analysis and the LSP client.

The analysis counts 1-based rows and 0-based columns in Unicode code points (what a Python `str`
indexes by). LSP counts 0-based lines and columns in the negotiated position encoding: UTF-16
code units by default, UTF-8 bytes or UTF-32 code points when the client prefers them. In: a
document's text and the encoding; out: `lsprotocol` positions and ranges, and back.
"""

from __future__ import annotations

import re
from functools import cached_property

from lsprotocol import types

from torchls.analysis.findings import Span
from torchls.analysis.source import split_lines

UTF8 = "utf-8"
UTF16 = "utf-16"
UTF32 = "utf-32"
_TERMINATOR = re.compile(r"\r\n|\r|\n")  # the order `split_lines` splits by


def encoding_of(workspace: object) -> str:
    """The position encoding negotiated for a pygls workspace, as a plain string."""
    encoding = getattr(workspace, "position_encoding", None)
    return str(encoding.value if hasattr(encoding, "value") else encoding or UTF16)


def _units_of_char(char: str, encoding: str) -> int:
    code = ord(char)
    if encoding == UTF16:
        return 2 if code > 0xFFFF else 1
    if encoding == UTF8:
        if code < 0x80:
            return 1
        if code < 0x800:
            return 2
        return 3 if code < 0x10000 else 4
    return 1


def units_of(text: str, encoding: str = UTF16) -> int:
    """Length of `text` in the encoding's code units."""
    if encoding == UTF32 or text.isascii():
        return len(text)
    if encoding == UTF16:
        return len(text) + sum(1 for char in text if ord(char) > 0xFFFF)
    return len(text.encode("utf-8", errors="surrogatepass"))


def to_units(line: str, column: int, encoding: str = UTF16) -> int:
    """Code-point `column` on `line` as a client column (clamped to the line's end)."""
    column = max(0, min(column, len(line)))
    return units_of(line[:column], encoding)


def to_codepoints(line: str, units: int, encoding: str = UTF16) -> int:
    """Client column `units` on `line` as a code-point column.

    A column that falls inside one character (half a surrogate pair, the middle of a UTF-8
    sequence) rounds down to that character's start; one past the end clamps to the end.
    """
    if units <= 0:
        return 0
    if encoding == UTF32 or line.isascii():
        return min(units, len(line))
    consumed = 0
    for index, char in enumerate(line):
        consumed += _units_of_char(char, encoding)
        if consumed > units:
            return index
        if consumed == units:
            return index + 1
    return len(line)


class LineIndex:
    """One document's lines, split exactly as the analysis and LSP count them (\\n, \\r\\n, \\r).

    Built once per document version and reused for every finding of that version.
    """

    def __init__(self, text: str, encoding: str = UTF16) -> None:
        self.text = text
        self.encoding = encoding
        self.lines = split_lines(text)

    @cached_property
    def _starts(self) -> list[int]:
        # Row n starts just past the (n-1)th terminator; split_lines yields one more line than
        # there are terminators, so the two lists line up. Only offsets need it (publishing
        # diagnostics does not), and the regex finds the terminators at C speed.
        return [0, *(match.end() for match in _TERMINATOR.finditer(self.text))]

    def line(self, row: int) -> str:
        """The text of 1-based `row` without its terminator ('' past the end)."""
        if 1 <= row <= len(self.lines):
            return self.lines[row - 1]
        return ""

    def position(self, row: int, column: int) -> types.Position:
        """Analysis (1-based row, code-point column) → LSP position."""
        if row > len(self.lines):
            last = len(self.lines)
            return types.Position(last - 1, units_of(self.lines[-1], self.encoding))
        row = max(row, 1)
        return types.Position(row - 1, to_units(self.lines[row - 1], column, self.encoding))

    def range(self, span: Span) -> types.Range:
        return types.Range(
            self.position(span.start.row, span.start.column),
            self.position(span.end.row, span.end.column),
        )

    def from_position(self, position: types.Position) -> tuple[int, int]:
        """LSP position → analysis (1-based row, code-point column), clamped into the text."""
        if position.line >= len(self.lines):
            return len(self.lines), len(self.lines[-1])
        line = self.lines[position.line]
        return position.line + 1, to_codepoints(line, position.character, self.encoding)

    def offset_of(self, row: int, column: int) -> int:
        """Analysis position → offset into `text`."""
        row = max(1, min(row, len(self.lines)))
        return self._starts[row - 1] + max(0, min(column, len(self.lines[row - 1])))

    def position_at_offset(self, offset: int) -> types.Position:
        """Offset into `text` → LSP position (inside a terminator → that line's end)."""
        offset = max(0, min(offset, len(self.text)))
        low, high = 0, len(self._starts) - 1
        while low < high:
            middle = (low + high + 1) // 2
            if self._starts[middle] <= offset:
                low = middle
            else:
                high = middle - 1
        return self.position(low + 1, offset - self._starts[low])
