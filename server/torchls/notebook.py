"""Jupyter notebooks as one Python module, and the way back to cells and notebook bytes.

Why: a notebook's code cells run top to bottom in one namespace, so the analysis reads them as
one module (a model defined in cell 2 and trained in cell 5 is one training script). The CLI,
the language server and the repro all need the same three things, so they live here once:

- `read_notebook(data)`: an nbformat 4 file's bytes in, a `NotebookSource` out: the code cells
  joined in order with a separator line between cells, every IPython line (`%magic`,
  `!shell`, `x = !cmd`, `obj?`) and the body of a non-Python cell magic (`%%bash`) replaced
  by a `pass` placeholder of the same indentation, so rows keep their meaning and the module
  still parses; plus the `CellMap` that turns a row of that text into (cell, row in the cell).
  `NotebookError` says why a file is not a notebook we can read.
- `notebook_from_cells(texts)`: the same module from cell texts the editor sends.
- `write_back(data, notebook, new_text)`: the analysis's fixed text split back into cells (the
  placeholders turned back into the IPython lines they stand for) and the notebook's bytes with
  only the changed cells' `source` values replaced, everything else (outputs, metadata,
  formatting) byte-identical. `None` when the text can no longer be split into the same cells.

Cells are numbered from 1 over all cells of the notebook, markdown and raw ones included: the
number a person counts when scrolling, and `cells[N - 1]` in the JSON.
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Sequence
from typing import Any

from torchls.analysis.findings import Edit, Finding, Position, Span
from torchls.records import record, replace

# A comment line no cell writes itself; findings never point at it (it holds no code).
SEPARATOR = "# --- torchls: next notebook cell ---"
_PLACEHOLDER = re.compile(r"^(?P<indent>[ \t]*)pass  # torchls: ipython line (?P<line>\d+)$")
# Cell magics whose body is Python that IPython runs in the notebook's namespace.
PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun", "debug", "memit"})
# `files = !ls`, `out = %sx ls`: an assignment from a shell command or a line magic.
_ASSIGNED_MAGIC = re.compile(
    r"^[ \t]*[A-Za-z_][\w.]*(?:[ \t]*,[ \t]*[A-Za-z_][\w.]*)*[ \t]*=[ \t]*[!%]"
)
# `model?`, `??model`, `torch.nn.Linear??`: IPython's help.
_HELP = re.compile(r"^[ \t]*(?:\?{1,2}[\w.]+|[\w.]+\?{1,2})[ \t]*$")


class NotebookError(Exception):
    """The file is not an nbformat 4 notebook we can read; the message says why."""


@record(frozen=True)
class CellMap:
    """Where each code cell's lines are in the module text. `numbers[i]` is the cell's number
    (1-based over all cells), `starts[i]` the 1-based module row of its first line."""

    numbers: tuple[int, ...] = ()
    starts: tuple[int, ...] = ()
    lengths: tuple[int, ...] = ()

    def locate(self, row: int) -> tuple[int, int]:
        """(cell number, 1-based row in that cell) of a 1-based module row. A row on a
        separator belongs to the cell before it, as its last line plus one."""
        if not self.starts:
            return (1, row)
        at = max(bisect.bisect_right(self.starts, row) - 1, 0)
        return (self.numbers[at], row - self.starts[at] + 1)

    def module_row(self, cell: int, row: int) -> int | None:
        """The module row of `row` (1-based) of cell number `cell`; None if no such cell."""
        try:
            at = self.numbers.index(cell)
        except ValueError:
            return None
        return self.starts[at] + row - 1


@record(frozen=True)
class CodeCell:
    """One code cell: its number, its place in the JSON `cells` list, its text as written, and
    the IPython lines the module text holds placeholders for (0-based line in the cell, text)."""

    number: int
    index: int
    source: str
    ipython: tuple[tuple[int, str], ...] = ()


@record(frozen=True)
class NotebookSource:
    """A notebook read as one module. `language` is the kernel's ('python' when unsaid);
    a notebook in another language has no cells here and is not analysed."""

    text: str
    cells: tuple[CodeCell, ...]
    map: CellMap
    language: str = "python"


def read_notebook(data: bytes) -> NotebookSource:
    """The notebook in `data` (nbformat 4 JSON) as one module; raises `NotebookError`."""
    document = _load(data)
    language = _language(document)
    cells = document["cells"]
    if language != "python":
        return NotebookSource("", (), CellMap(), language)
    texts: list[tuple[int, int, str]] = []
    for index, cell in enumerate(cells):
        if not isinstance(cell, dict):
            raise NotebookError(f"not a notebook: cell {index + 1} is not a JSON object")
        if cell.get("cell_type") != "code":
            continue
        texts.append((index + 1, index, _source_text(cell.get("source", ""), index)))
    return _assemble(texts, language)


def notebook_from_cells(
    texts: Sequence[str], numbers: Sequence[int] | None = None
) -> NotebookSource:
    """The module of a notebook whose code cells hold `texts`, in order (as an editor sends
    them); `numbers` are the cells' numbers (default 1, 2, ...)."""
    if numbers is None:
        numbers = range(1, len(texts) + 1)
    return _assemble([(n, n - 1, t) for n, t in zip(numbers, texts, strict=True)], "python")


def write_back(data: bytes, notebook: NotebookSource, new_text: str) -> bytes | None:
    """`data` (the notebook `notebook` was read from) with each code cell's source replaced by
    its part of `new_text`, nothing else touched; None when `new_text` does not split into the
    same cells (a separator was removed or added), so nothing is written."""
    sources = split_cells(notebook, new_text)
    if sources is None:
        return None
    changed = {
        cell.index: source
        for cell, source in zip(notebook.cells, sources, strict=True)
        if source != cell.source
    }
    if not changed:
        return data
    text = data.decode("utf-8-sig")
    bom = data.startswith(b"\xef\xbb\xbf")
    spans = _source_spans(text)
    ascii_only = "\\u" in text and all(ord(char) < 128 for char in text)
    pieces = []
    last = 0
    for index in sorted(changed):
        start, end = spans[index]
        pieces.append(text[last:start])
        pieces.append(_render_source(text, start, end, changed[index], ascii_only))
        last = end
    pieces.append(text[last:])
    out = "".join(pieces).encode("utf-8")
    return b"\xef\xbb\xbf" + out if bom else out


def split_cells(notebook: NotebookSource, new_text: str) -> list[str] | None:
    """Each code cell's source in `new_text` (module text, maybe fixed), IPython lines put
    back; None when the text no longer has one part per cell."""
    lines = new_text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    parts: list[list[str]] = [[]]
    for line in lines:
        if line == SEPARATOR:
            parts.append([])
        else:
            parts[-1].append(line)
    if len(parts) != max(len(notebook.cells), 1):
        return None
    if not notebook.cells:
        return []
    sources = []
    for cell, part in zip(notebook.cells, parts, strict=True):
        originals = dict(cell.ipython)
        restored = []
        for line in part:
            match = _PLACEHOLDER.match(line)
            if match is not None and int(match["line"]) in originals:
                restored.append(originals[int(match["line"])])
            else:
                restored.append(line)
        source = "\n".join(restored)
        if restored and cell.source.endswith("\n"):
            source += "\n"
        sources.append(source)
    return sources


# --- reading ------------------------------------------------------------------------------------


def _load(data: bytes) -> dict[str, Any]:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise NotebookError(f"not a notebook: not UTF-8 text ({error.reason})") from None
    if not text.strip():
        raise NotebookError("not a notebook: the file is empty")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise NotebookError(
            f"not a notebook: invalid JSON at line {error.lineno} column {error.colno} "
            f"({error.msg})"
        ) from None
    if not isinstance(document, dict):
        raise NotebookError("not a notebook: the JSON is not an object")
    major = document.get("nbformat")
    if "worksheets" in document or (isinstance(major, int) and major < 4):
        raise NotebookError(
            f"nbformat {major} notebooks are not supported (nbformat 4 is; "
            "`jupyter nbconvert --to notebook` upgrades one)"
        )
    if not isinstance(document.get("cells"), list):
        raise NotebookError("not a notebook: no 'cells' list")
    return document


def _language(document: dict[str, Any]) -> str:
    metadata = document.get("metadata")
    if not isinstance(metadata, dict):
        return "python"
    for key, field_name in (("language_info", "name"), ("kernelspec", "language")):
        table = metadata.get(key)
        if isinstance(table, dict) and isinstance(table.get(field_name), str):
            return table[field_name].strip().lower() or "python"
    return "python"


def _source_text(source: object, index: int) -> str:
    if isinstance(source, str):
        return source
    if isinstance(source, list) and all(isinstance(part, str) for part in source):
        return "".join(source)
    raise NotebookError(f"not a notebook: cell {index + 1}'s source is not text")


def _assemble(texts: Sequence[tuple[int, int, str]], language: str) -> NotebookSource:
    out: list[str] = []
    cells: list[CodeCell] = []
    numbers, starts, lengths = [], [], []
    for position, (number, index, source) in enumerate(texts):
        if position:
            out.append(SEPARATOR)
        lines = source.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        blanked, ipython = _blank_ipython(lines)
        numbers.append(number)
        starts.append(len(out) + 1)
        lengths.append(len(blanked))
        out.extend(blanked)
        cells.append(CodeCell(number, index, source, tuple(ipython)))
    text = "\n".join(out) + ("\n" if out else "")
    return NotebookSource(
        text, tuple(cells), CellMap(tuple(numbers), tuple(starts), tuple(lengths)), language
    )


def _blank_ipython(lines: list[str]) -> tuple[list[str], list[tuple[int, str]]]:
    """The cell's lines with each IPython-only line replaced by an indented `pass`
    placeholder, and the (line, original) pairs that were replaced."""
    out = list(lines)
    replaced: list[tuple[int, str]] = []

    def blank(at: int, indent: str | None = None) -> None:
        line = lines[at]
        if indent is None:
            indent = line[: len(line) - len(line.lstrip(" \t"))]
        out[at] = f"{indent}pass  # torchls: ipython line {at}"
        replaced.append((at, line))

    first_code = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first_code is not None and lines[first_code].lstrip().startswith("%%"):
        magic = lines[first_code].lstrip()[2:].split(maxsplit=1)
        blank(first_code)
        if not magic or magic[0] not in PYTHON_CELL_MAGICS:
            # The body is another language: its indentation means nothing to Python.
            for at in range(first_code + 1, len(lines)):
                blank(at, "")
            return out, replaced
    done = {at for at, _ in replaced}
    command_indent: str | None = None  # set while a `\`-continued IPython line goes on
    python = _Continuation()
    for at, line in enumerate(lines):
        if at in done:
            continue
        stripped = line.lstrip(" \t")
        if command_indent is None and python.open:
            # Inside brackets, a triple-quoted string or after a `\`: `% (x,)` or `!` here
            # is the rest of a Python expression, not an IPython command.
            python.feed(line)
            continue
        if command_indent is not None:
            # `!pip install a \` goes on to the next line, which is part of the command too,
            # whatever its indentation.
            blank(at, command_indent)
        elif (
            stripped.startswith(("%", "!"))
            or _ASSIGNED_MAGIC.match(line) is not None
            or _HELP.match(line) is not None
        ):
            command_indent = line[: len(line) - len(stripped)]
            blank(at)
        else:
            python.feed(line)
            continue
        if not line.rstrip().endswith("\\"):
            command_indent = None
    return out, replaced


class _Continuation:
    """Whether the Python lines read so far leave a logical line open: a bracket not yet
    closed, a triple-quoted string not yet ended, or a trailing backslash. A rough scanner
    (no tokenize: a cell that mixes IPython lines does not tokenize), enough to tell a
    continuation line from the start of a new one."""

    def __init__(self) -> None:
        self.depth = 0
        self.quote: str | None = None  # the triple quote of an open string
        self.backslash = False

    @property
    def open(self) -> bool:
        return self.depth > 0 or self.quote is not None or self.backslash

    def feed(self, line: str) -> None:
        at, size = 0, len(line)
        while at < size:
            if self.quote is not None:
                end = line.find(self.quote, at)
                while end > 0 and _escaped(line, end):
                    end = line.find(self.quote, end + 1)
                if end < 0:
                    break
                self.quote, at = None, end + 3
                continue
            char = line[at]
            if char == "#":
                break
            if char in "\"'":
                if line.startswith(char * 3, at):
                    self.quote, at = char * 3, at + 3
                    continue
                end = at + 1
                while end < size and (line[end] != char or _escaped(line, end)):
                    end += 1
                at = end + 1
                continue
            if char in "([{":
                self.depth += 1
            elif char in ")]}":
                self.depth = max(0, self.depth - 1)
            at += 1
        code = line.split("#", 1)[0] if self.quote is None else ""
        self.backslash = self.quote is None and code.rstrip().endswith("\\")


def _escaped(line: str, at: int) -> bool:
    """Whether the character at `at` follows an odd number of backslashes."""
    count = 0
    while at - count - 1 >= 0 and line[at - count - 1] == "\\":
        count += 1
    return count % 2 == 1


# --- writing back -------------------------------------------------------------------------------


def _render_source(text: str, start: int, end: int, source: str, ascii_only: bool) -> str:
    """`source` as JSON in the shape the original value had: a string, or a list of lines
    laid out with the original's white space."""
    original = text[start:end]
    if not original.startswith("["):
        return json.dumps(source, ensure_ascii=ascii_only)
    lines = re.findall(r"[^\n]*\n|[^\n]+$", source)
    inner = original[1:-1]
    if inner.strip():
        lead = inner[: len(inner) - len(inner.lstrip())]
        close = inner[len(inner.rstrip()) :]
    else:
        key_line_start = text.rfind("\n", 0, start) + 1
        key_indent = text[key_line_start:start]
        key_indent = key_indent[: len(key_indent) - len(key_indent.lstrip())]
        lead, close = "\n" + key_indent + " ", "\n" + key_indent
    if not lines:
        return "[]"
    items = ("," + lead).join(json.dumps(line, ensure_ascii=ascii_only) for line in lines)
    return "[" + lead + items + close + "]"


_WHITE = re.compile(r"[ \t\n\r]*")
_SCALAR = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false|null")


def _source_spans(text: str) -> dict[int, tuple[int, int]]:
    """{index in `cells`: (start, end)} of each cell's `source` value in the JSON text (which
    `json.loads` accepted already)."""
    spans: dict[int, tuple[int, int]] = {}
    position = _skip(text, 0)
    for key, value_start in _members(text, position):
        if key != "cells":
            continue
        for index, cell_start in enumerate(_elements(text, value_start)):
            if text[cell_start] != "{":
                continue
            for cell_key, start in _members(text, cell_start):
                if cell_key == "source":
                    spans[index] = (start, _value_end(text, start))
    return spans


def _skip(text: str, position: int) -> int:
    match = _WHITE.match(text, position)
    return match.end() if match else position


def _members(text: str, position: int) -> list[tuple[str, int]]:
    """(key, value start) of each member of the object starting at `position`."""
    members = []
    position = _skip(text, position + 1)
    while text[position] != "}":
        key, position = json.decoder.scanstring(text, position + 1)
        position = _skip(text, position)
        position = _skip(text, position + 1)  # the colon
        members.append((key, position))
        position = _skip(text, _value_end(text, position))
        if text[position] == ",":
            position = _skip(text, position + 1)
    return members


def _elements(text: str, position: int) -> list[int]:
    starts = []
    position = _skip(text, position + 1)
    while text[position] != "]":
        starts.append(position)
        position = _skip(text, _value_end(text, position))
        if text[position] == ",":
            position = _skip(text, position + 1)
    return starts


def _value_end(text: str, position: int) -> int:
    first = text[position]
    if first == '"':
        return json.decoder.scanstring(text, position + 1)[1]
    if first == "{":
        members = _members(text, position)
        end = _value_end(text, members[-1][1]) if members else position + 1
        return _skip(text, end) + 1
    if first == "[":
        elements = _elements(text, position)
        end = _value_end(text, elements[-1]) if elements else _skip(text, position + 1)
        return _skip(text, end) + 1
    match = _SCALAR.match(text, position)
    if match is None:
        raise NotebookError("not a notebook: JSON the reader did not expect")
    return match.end()


# --- findings in cells --------------------------------------------------------------------------

# "line 12" in a message, not in quoted code and not a line of another file ("data.py, line 3").
_LINE_MENTION = re.compile(r"(?<!\.py, )\bline (\d+)\b")


def relabel_lines(message: str, cells: CellMap) -> str:
    """`message` with each mention of a module row ("on line 12") said as the cell's line
    ("on line 3 of cell 4"); quoted code (between backticks) is left as it is."""
    parts = message.split("`")
    for at in range(0, len(parts), 2):  # the even parts are outside backticks
        parts[at] = _LINE_MENTION.sub(lambda match: _cell_line(int(match[1]), cells), parts[at])
    return "`".join(parts)


def _cell_line(row: int, cells: CellMap) -> str:
    cell, line = cells.locate(row)
    return f"line {line} of cell {cell}"


def cell_position(position: Position, cells: CellMap) -> tuple[int, Position]:
    """(cell number, the position with its row counted in that cell)."""
    cell, row = cells.locate(position.row)
    return cell, Position(row, position.column)


def cell_span(span: Span, cells: CellMap) -> tuple[int, Span]:
    """(cell number of the start, the span with rows counted in that cell)."""
    cell, start = cell_position(span.start, cells)
    first = cells.module_row(cell, 1) or 1
    return cell, Span(start, Position(span.end.row - first + 1, span.end.column))


def cell_finding(finding: Finding, cells: CellMap) -> tuple[int, Finding]:
    """The finding as a person reads it in a notebook: its cell, rows counted in that cell
    (fix edits each in their own cell: see `cell_span`), line mentions relabelled."""
    cell, span = cell_span(finding.span, cells)
    fix = finding.fix
    if fix is not None:
        edits = tuple(Edit(cell_span(edit.span, cells)[1], edit.content) for edit in fix.edits)
        fix = replace(fix, edits=edits)
    return cell, replace(finding, span=span, fix=fix, message=relabel_lines(finding.message, cells))


# --- the repro's script -------------------------------------------------------------------------


@record(frozen=True)
class ReproScript:
    """What a repro of a notebook runs: its code cells up to and including `through` (the
    first cell that trains, or the last cell when none does: `found_loop`), as one script
    whose rows are the module text's rows."""

    text: str
    notebook: NotebookSource
    through: int
    found_loop: bool


def script_json(script: ReproScript) -> dict[str, Any]:
    """How a repro report says where a notebook's rows are (its `target.notebook`): each code
    cell that ran with the report row of its first line and its line count, and the last."""
    cells = script.notebook.map
    ran = [
        {"cell": number, "first_line": start, "lines": length}
        for number, start, length in zip(cells.numbers, cells.starts, cells.lengths, strict=True)
        if number <= script.through
    ]
    return {"cells": ran, "through": script.through, "found_loop": script.found_loop}


def repro_script(data: bytes, filename: str) -> ReproScript:
    """The script a bounded repro of the notebook in `data` runs; raises `NotebookError` for
    a file that is not a notebook or has no Python code cell."""
    notebook = read_notebook(data)
    if not notebook.cells:
        what = "is not a Python notebook" if notebook.language != "python" else "has no code cell"
        raise NotebookError(f"the notebook {what}: nothing to run")
    loop_row = _first_training_row(notebook.text, filename)
    cells = notebook.map
    through = cells.locate(loop_row)[0] if loop_row is not None else cells.numbers[-1]
    at = cells.numbers.index(through)
    last_row = cells.starts[at] + cells.lengths[at] - 1
    lines = notebook.text.split("\n")[: max(last_row, 0)]
    text = "\n".join(lines) + ("\n" if lines else "")
    return ReproScript(text, notebook, through, loop_row is not None)


def _first_training_row(text: str, filename: str) -> int | None:
    """The row of the first top-level statement that trains: reaches `backward()` itself or
    through the functions it calls (a loop, or `train(model)` defined in an earlier cell), as
    the rules mean it."""
    # Here, not at the top: only a repro of a notebook needs the facts of its text.
    import ast

    from torchls.analysis.facts import build_facts
    from torchls.analysis.source import SourceError, parse_source

    try:
        parsed = parse_source(text)
    except SourceError:
        return None
    facts = build_facts(parsed, filename)
    definitions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    for statement in parsed.tree.body:
        if not isinstance(statement, definitions) and facts.node_reaches(
            statement, facts.is_backward
        ):
            return statement.lineno
    return None
