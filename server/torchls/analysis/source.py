"""Source text handling: decoding, parsing with recovery from syntax errors, and positions.

In: raw bytes or text of one file. Out: a `ParsedSource` with the `ast` tree of everything that
parses, the lines that had to be blanked to get there, and conversions from `ast`'s UTF-8 byte
columns to code-point columns (the unit of `Finding` positions).
"""

from __future__ import annotations

import ast
import codecs
import re
import warnings

from torchls.analysis.findings import Span
from torchls.records import field, record

MAX_RECOVERY_ATTEMPTS = 25
BOM = "\ufeff"
_CODING_RE = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")


class SourceError(Exception):
    """A file that cannot be analysed at all; the message is one line meant for the user."""


def decode_source(data: bytes) -> str:
    """Decode file bytes as Python does (BOM, PEP 263 cookie, else UTF-8); a cookie naming a
    codec this process does not know falls back to UTF-8 when the bytes are UTF-8."""
    if b"\x00" in data[:8192]:
        raise SourceError("binary file (contains NUL bytes), not Python source")
    encoding = "utf-8"
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    else:
        for line in data.split(b"\n", 2)[:2]:
            match = _CODING_RE.match(line)
            if match:
                encoding = match.group(1).decode("ascii")
                break
    try:
        return data.decode(encoding)
    except LookupError:
        # A codec that a `.pth` registers at start-up (future_fstrings, say: a source rewriter
        # whose input is UTF-8) is unknown to this process; the text is still UTF-8.
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise SourceError(f"unknown source encoding {encoding!r}") from None
    except UnicodeDecodeError as error:
        raise SourceError(
            f"not valid {encoding} at byte {error.start}; save the file as UTF-8"
        ) from None


@record(frozen=True)
class SyntaxProblem:
    """The first syntax error of a file: where, and Python's message."""

    row: int
    column: int
    message: str


@record(frozen=True)
class Reparsed:
    """How a parse relates to the earlier one it reused statements of (an editor's last
    version): the first `kept_before` and last `kept_after` top-level statements are the
    earlier tree's own nodes (those after the edit shifted by `delta` rows); rows
    `old_region[0]..old_region[1]` of the earlier text (1-based, inclusive) were parsed again.
    What an incremental analysis needs to know which earlier findings still stand."""

    previous_tree: ast.Module
    kept_before: int
    kept_after: int
    delta: int
    old_region: tuple[int, int]


@record
class ParsedSource:
    """A file's text, its lines and its syntax tree (with the rows blanked to get past syntax
    errors)."""

    text: str
    lines: list[str]
    tree: ast.Module
    blanked_rows: set[int] = field(default_factory=set)
    syntax_errors: list[SyntaxProblem] = field(default_factory=list)
    # The syntax index of `tree` (see `queries/index.py`), once some facts have built it: it
    # depends on the tree alone, so other facts over this same parse reuse it.
    index: object | None = field(default=None, repr=False, compare=False)
    # Set by `reparse` when statements of an earlier parse were reused (see `Reparsed`).
    reparsed: Reparsed | None = field(default=None, repr=False, compare=False)

    def column(self, row: int, utf8_offset: int) -> int:
        """Code-point column of a UTF-8 byte offset on 1-based `row`."""
        if row < 1 or row > len(self.lines):
            return utf8_offset
        line = self.lines[row - 1]
        if line.isascii():
            return utf8_offset
        if row == 1 and utf8_offset and line.startswith(BOM):
            utf8_offset += len(BOM.encode("utf-8")) - 1  # parsed as a one-byte form feed
        return len(line.encode("utf-8")[:utf8_offset].decode("utf-8", errors="ignore"))

    def span(self, node: ast.AST, end_node: ast.AST | None = None) -> Span:
        last = end_node or node
        row, end_row = node.lineno, last.end_lineno or node.lineno
        return Span.of(
            row,
            self.column(row, node.col_offset),
            end_row,
            self.column(end_row, last.end_col_offset or 0),
        )

    def segment(self, node: ast.AST) -> str:
        """The exact source text of `node` (kept verbatim so fixes preserve formatting)."""
        span = self.span(node)
        return self.text_of(span)

    def text_of(self, span: Span) -> str:
        start, end = span.start, span.end
        if start.row == end.row:
            return self.lines[start.row - 1][start.column : end.column]
        parts = [self.lines[start.row - 1][start.column :]]
        parts.extend(self.lines[start.row : end.row - 1])
        parts.append(self.lines[end.row - 1][: end.column])
        return "\n".join(parts)

    def indent_of(self, row: int) -> str:
        line = self.lines[row - 1]
        return line[: len(line) - len(line.lstrip())]


def split_lines(text: str) -> list[str]:
    """Lines without terminators, split the way `ast` counts rows."""
    return re.split(r"\r\n|\r|\n", text)


def _blank(line: str, opens_block: bool) -> str:
    indent = line[: len(line) - len(line.lstrip())]
    # Keep the indentation so the lines around it stay valid; a block opener needs a body.
    return indent + ("if True:" if opens_block else "pass")


def _quiet_parse(text: str) -> ast.Module:
    """`ast.parse` without Python's SyntaxWarnings about the user's code (`0x1for`, invalid
    escapes): they would leak to stderr, and under a warnings-as-errors filter abort parsing."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.parse(text, type_comments=False)


def parse_source(text: str) -> ParsedSource:
    """Parse `text`; on a syntax error blank the offending line and retry, so one half-typed
    line does not hide the findings for the rest of the file."""
    lines = split_lines(text)
    working = list(lines)
    blanked: set[int] = set()
    problems: list[SyntaxProblem] = []
    if working and working[0].startswith(BOM):
        # An editor buffer may keep the byte-order mark, which Python accepts only in bytes.
        # A form feed has the same length and is ignored at the start of a line.
        working[0] = "\f" + working[0][1:]
    nul_rows = enumerate(working, start=1) if "\x00" in text else ()
    for row, line in nul_rows:
        # Python refuses a whole text with a NUL anywhere (and says neither where nor why
        # in a way we can recover from); blank those lines alone.
        if "\x00" in line:
            if not problems:
                problems.append(SyntaxProblem(row, line.index("\x00"), "NUL character in source"))
            working[row - 1] = _blank(line.replace("\x00", ""), line.rstrip().endswith(":"))
            blanked.add(row)
    for _ in range(MAX_RECOVERY_ATTEMPTS):
        try:
            # Untouched `\n`-separated lines parse as the text itself (no copy of the file).
            plain = not blanked and "\r" not in text and working == lines
            tree = _quiet_parse(text if plain else "\n".join(working))
            return ParsedSource(text, lines, tree, blanked, problems)
        except RecursionError:
            raise SourceError("nesting too deep for Python's parser") from None
        except (SyntaxError, ValueError, MemoryError) as error:
            row = getattr(error, "lineno", None) or 1
            row = max(1, min(row, len(working)))
            if not problems:
                message = getattr(error, "msg", str(error))
                problems.append(SyntaxProblem(row, (getattr(error, "offset", 1) or 1) - 1, message))
            row = _next_row_to_blank(working, row, blanked)
            if row is None:
                break
            following = next(
                (line for line in working[row:] if line.strip()),
                "",
            )
            current = working[row - 1]
            indent = len(current) - len(current.lstrip())
            opens_block = current.rstrip().endswith(":") or (
                len(following) - len(following.lstrip()) > indent
            )
            working[row - 1] = _blank(current, opens_block)
            blanked.add(row)
    # Nothing parsed: analyse an empty module rather than fail, and report why.
    if not problems:
        problems.append(SyntaxProblem(1, 0, "could not parse the file"))
    return ParsedSource(text, lines, ast.Module(body=[], type_ignores=[]), blanked, problems)


def _next_row_to_blank(working: list[str], row: int, blanked: set[int]) -> int | None:
    # A blanked line can still be reported (e.g. an unclosed bracket above it); move down.
    while row in blanked and row < len(working):
        row += 1
    if row in blanked:
        return None
    return row


def _statement_rows(stmt: ast.stmt) -> tuple[int, int]:
    first = min([stmt.lineno, *(d.lineno for d in getattr(stmt, "decorator_list", ()))])
    return first, stmt.end_lineno or stmt.lineno


def reparse(previous: ParsedSource | None, text: str) -> ParsedSource:
    """Parse `text`, reusing the unchanged top-level statements of `previous`.

    An editor sends the whole document after each keystroke, but only a statement or two
    changed. Only the changed region (whole top-level statements) is parsed again; statements
    after it keep their trees, shifted by the number of lines added or removed. Anything
    unusual (syntax errors before or after, a region that does not parse on its own) falls
    back to a full `parse_source`, so the result is always the same as parsing from scratch.
    """
    if previous is None or previous.syntax_errors or previous.blanked_rows:
        return parse_source(text)
    lines = split_lines(text)
    old_lines = previous.lines
    if lines == old_lines:
        count = len(previous.tree.body)
        unchanged = Reparsed(previous.tree, count, 0, 0, (1, 0))
        return ParsedSource(text, lines, previous.tree, reparsed=unchanged)
    limit = min(len(lines), len(old_lines))
    prefix = 0
    while prefix < limit and lines[prefix] == old_lines[prefix]:
        prefix += 1
    suffix = 0
    while (
        suffix < limit - prefix
        and lines[len(lines) - 1 - suffix] == old_lines[len(old_lines) - 1 - suffix]
    ):
        suffix += 1
    delta = len(lines) - len(old_lines)
    first_changed = prefix + 1  # 1-based row of the first changed line (old and new)
    last_changed_old = len(old_lines) - suffix  # last changed row in the old text
    before: list[ast.stmt] = []
    after: list[ast.stmt] = []
    for stmt in previous.tree.body:
        start, end = _statement_rows(stmt)
        if end < first_changed:
            before.append(stmt)
        elif start > last_changed_old:
            after.append(stmt)
    region_start = (_statement_rows(before[-1])[1] + 1) if before else 1
    region_end = (_statement_rows(after[0])[0] - 1 + delta) if after else len(lines)
    region = "\n".join(lines[region_start - 1 : region_end])
    try:
        middle = _quiet_parse(region)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return parse_source(text)
    if region_start > 1:
        ast.increment_lineno(middle, region_start - 1)
    if delta:
        for stmt in after:
            ast.increment_lineno(stmt, delta)
    tree = ast.Module(body=[*before, *middle.body, *after], type_ignores=[])
    old_region = (region_start, region_end - delta)
    edit = Reparsed(previous.tree, len(before), len(after), delta, old_region)
    return ParsedSource(text, lines, tree, reparsed=edit)
