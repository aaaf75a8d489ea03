"""Small builders for the text edits that rules attach as fixes.

In: `Facts` and nodes. Out: `Edit`s that touch as little text as possible, so the user's
formatting survives.
"""

from __future__ import annotations

import ast

from torchls.analysis.facts import Facts
from torchls.analysis.findings import Edit, Position, Span


def replace_node(facts: Facts, node: ast.AST, content: str) -> Edit:
    return Edit(facts.source.span(node), content)


def insert_at(row: int, column: int, content: str) -> Edit:
    position = Position(row, column)
    return Edit(Span(position, position), content)


def insert_line_before(facts: Facts, stmt: ast.stmt, line: str) -> Edit:
    """Insert `line` (without indentation) as a new line before `stmt`, indented like it."""
    indent = facts.source.indent_of(stmt.lineno)
    return insert_at(stmt.lineno, 0, f"{indent}{line}\n")


def insert_line_after(facts: Facts, stmt: ast.stmt, line: str) -> Edit:
    """Insert `line` after the last row of `stmt`, indented like `stmt`."""
    indent = facts.source.indent_of(stmt.lineno)
    end_row = stmt.end_lineno or stmt.lineno
    end_column = len(facts.source.lines[end_row - 1])
    return insert_at(end_row, end_column, f"\n{indent}{line}")


def delete_statement_line(facts: Facts, stmt: ast.stmt) -> Edit | None:
    """Delete the whole line(s) of `stmt` when nothing else shares them."""
    lines = facts.source.lines
    start, end = stmt.lineno, stmt.end_lineno or stmt.lineno
    before = lines[start - 1][: facts.source.column(start, stmt.col_offset)]
    after = lines[end - 1][facts.source.column(end, stmt.end_col_offset or 0) :]
    if before.strip() or (after.strip() and not after.strip().startswith("#")):
        return None
    if end < len(lines):
        return Edit(Span(Position(start, 0), Position(end + 1, 0)), "")
    return Edit(Span(Position(start, 0), Position(end, len(lines[end - 1]))), "")
