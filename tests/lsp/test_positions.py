"""Unit tests for the position conversions and the minimal fix-all edit (no server needed)."""

from __future__ import annotations

import pytest
from lsprotocol import types

from torchls.analysis.findings import Span
from torchls.lsp.code_actions import minimal_edit
from torchls.lsp.positions import LineIndex, to_codepoints, to_units
from torchls.lsp.server import LspTextDocument

from .support import apply_edit

LINE = 'print("🔥é"); loss = f(x)'


@pytest.mark.parametrize(
    ("encoding", "expected"),
    [("utf-16", 1 + 7 + 2 + 1), ("utf-8", 1 + 7 + 4 + 2), ("utf-32", 1 + 7 + 1 + 1)],
)
def test_columns_after_non_ascii_follow_the_encoding(encoding, expected):
    column = LINE.index('")') + 0  # the closing quote, after the emoji and the accent
    assert to_units(LINE, column, encoding) == expected - 1
    assert to_codepoints(LINE, expected - 1, encoding) == column


@pytest.mark.parametrize("encoding", ["utf-16", "utf-8"])
def test_a_column_inside_a_character_rounds_down(encoding):
    emoji = LINE.index("🔥")
    inside = to_units(LINE, emoji, encoding) + 1
    assert to_codepoints(LINE, inside, encoding) == emoji


def test_columns_past_the_end_clamp():
    assert to_codepoints("abc", 99, "utf-16") == 3
    assert to_units("abc", 99, "utf-16") == 3


def test_line_index_counts_every_lsp_line_terminator():
    index = LineIndex("a\r\nb\rc\nd😀", "utf-16")
    assert index.lines == ["a", "b", "c", "d😀"]
    assert index.position(4, 2) == types.Position(3, 3)
    assert index.from_position(types.Position(3, 3)) == (4, 2)
    assert index.position_at_offset(index.text.index("c")) == types.Position(2, 0)
    # Each row starts just past its terminator, whichever of the three it is.
    assert [index.offset_of(row, 0) for row in (1, 2, 3, 4)] == [0, 3, 5, 7]
    assert index.position_at_offset(2) == types.Position(0, 1)  # inside "\r\n": line end
    # Past the end of the text: the end of the last line.
    assert index.from_position(types.Position(10, 0)) == (4, 2)
    assert index.range(Span.of(1, 0, 4, 1)) == types.Range(
        types.Position(0, 0), types.Position(3, 1)
    )


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_minimal_edit_touches_only_what_changed(newline):
    old = newline.join(["import torch", 'x = "🔥"; y = f(probs)', "z = 1", ""])
    new = old.replace("f(probs)", "f(logits)")
    edit = minimal_edit(LineIndex(old, "utf-16"), new)
    assert edit.range.start.line == edit.range.end.line == 1
    assert apply_edit(old.replace("\r\n", "\n"), edit, "utf-16") == new.replace("\r\n", "\n")


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("x = 1\r\ny = 2", "x = 1\rz\r\ny = 2"),  # the common prefix ends inside a \r\n
        ("a\r\nb", "a\nb"),  # the common suffix starts inside a \r\n
        ("a = 1\r\nb = 2\r\n", "a = 1\r\nb = 2\r\n\r\nc = 3\r\n"),
    ],
)
def test_minimal_edit_never_splits_a_crlf(old, new):
    index = LineIndex(old, "utf-16")
    edit = minimal_edit(index, new)
    start = index.offset_of(*index.from_position(edit.range.start))
    end = index.offset_of(*index.from_position(edit.range.end))
    assert index.position_at_offset(start) == edit.range.start
    assert old[:start] + edit.new_text + old[end:] == new


@pytest.mark.parametrize(
    ("text", "lines"),
    [
        ("a\x0cb\r\nc\rd\u2028e\n", ("a\x0cb\r\n", "c\r", "d\u2028e\n")),
        ("x\n\ny", ("x\n", "\n", "y")),
        ("", ()),
    ],
)
def test_documents_break_lines_only_where_lsp_does(text, lines):
    assert LspTextDocument("file:///t.py", text, 1).lines == lines
