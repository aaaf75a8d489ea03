"""Notebook cells ↔ the one module the analysis reads: positions, diagnostics and edits.

Why: an editor shows a notebook as one text document per cell (LSP 3.17 notebook sync), while
the analysis reads the notebook's code cells as one module (`torchls.notebook`): a model
defined in cell 2 and trained in cell 5 is one training script. Every feature that talks to
the client in cell coordinates (diagnostics, code actions, hover) goes through this module,
so the mapping lives once.

In: a pygls `NotebookDocument` and its cells' text documents; positions, ranges, diagnostics
and text edits in module coordinates (0-based LSP lines of the module text). Out: a
`NotebookText` (the module, its `NotebookSource` and the code cells' URIs, aligned with the
cell map), ranges and diagnostics per cell URI, and edits per cell URI.

Module lines and cell lines hold the same characters (only IPython lines differ, and no
finding points at those), so columns carry over unchanged in every position encoding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from lsprotocol import types

from torchls.notebook import NotebookSource, notebook_from_cells, relabel_lines
from torchls.records import record

PYTHON_LANGUAGES = frozenset({"python", "python3", "ipython", ""})
"""Cell language ids that hold Python: VS Code says `python`; other clients have said
`python3`, `ipython` or nothing."""


@record(frozen=True)
class NotebookText:
    """An open notebook read as one module: `source.text` is what the analysis reads, and
    `uris[i]` is the text document of code cell `source.cells[i]` (numbered over all cells)."""

    source: NotebookSource
    uris: tuple[str, ...]
    versions: tuple[int | None, ...]

    @property
    def text(self) -> str:
        return self.source.text

    def cell_index(self, uri: str) -> int | None:
        """The position of code cell `uri` among the code cells, or None."""
        try:
            return self.uris.index(uri)
        except ValueError:
            return None

    def first_line(self, at: int) -> int:
        """The 0-based module line of code cell number `at`'s first line."""
        return self.source.map.starts[at] - 1

    def length(self, at: int) -> int:
        return self.source.map.lengths[at]

    # -- cell → module ---------------------------------------------------------------------------

    def to_module_position(self, uri: str, position: types.Position) -> types.Position | None:
        at = self.cell_index(uri)
        if at is None:
            return None
        return types.Position(position.line + self.first_line(at), position.character)

    def to_module_range(self, uri: str, range_: types.Range) -> types.Range | None:
        start = self.to_module_position(uri, range_.start)
        end = self.to_module_position(uri, range_.end)
        if start is None or end is None:
            return None
        return types.Range(start, end)

    # -- module → cell ---------------------------------------------------------------------------

    def locate_line(self, line: int) -> int:
        """The code cell (position among code cells) holding module line `line` (0-based); a
        separator line belongs to the cell before it."""
        cells = self.source.map
        cell_number = cells.locate(line + 1)[0]
        return cells.numbers.index(cell_number) if cells.numbers else 0

    def to_cell_range(self, range_: types.Range) -> tuple[str, types.Range] | None:
        """(cell URI, the range in that cell) for a module range, cut at the end of the cell
        its start is in; None for a notebook without code cells."""
        if not self.uris:
            return None
        at = self.locate_line(range_.start.line)
        first, length = self.first_line(at), self.length(at)
        start = types.Position(range_.start.line - first, range_.start.character)
        if start.line >= length:  # on the separator after the cell: its end
            start = types.Position(length, 0)
        end = types.Position(range_.end.line - first, range_.end.character)
        if end.line >= length:
            end = types.Position(length, 0)
        if (end.line, end.character) < (start.line, start.character):
            end = start
        return self.uris[at], types.Range(start, end)

    def to_cell_edit(self, edit: types.TextEdit) -> tuple[str, types.TextEdit] | None:
        """An edit of the module as an edit of one cell; None when it crosses into another
        cell (it would have to change the separator between them)."""
        if not self.uris:
            return None
        at = self.locate_line(edit.range.start.line)
        first, length = self.first_line(at), self.length(at)
        start = edit.range.start.line - first
        end = edit.range.end.line - first
        if start >= length or end > length or (end == length and edit.range.end.character):
            return None
        if "\n" in edit.new_text and end == length:
            return None  # would end the cell with a line the module text cannot hold
        return self.uris[at], types.TextEdit(
            range=types.Range(
                types.Position(start, edit.range.start.character),
                types.Position(end, edit.range.end.character),
            ),
            new_text=edit.new_text,
        )

    def split_diagnostics(
        self, notebook_uri: str, diagnostics: Sequence[types.Diagnostic]
    ) -> dict[str, list[types.Diagnostic]]:
        """Module diagnostics (the notebook's) as lists per code cell URI, every code cell
        present (an empty list clears it); messages say cell lines, related locations in the
        notebook point at their cells."""
        split: dict[str, list[types.Diagnostic]] = {uri: [] for uri in self.uris}
        for diagnostic in diagnostics:
            placed = self.to_cell_range(diagnostic.range)
            if placed is None:
                continue
            uri, range_ = placed
            split[uri].append(self._in_cell(notebook_uri, diagnostic, range_))
        return split

    def _in_cell(
        self, notebook_uri: str, diagnostic: types.Diagnostic, range_: types.Range
    ) -> types.Diagnostic:
        related = None
        if diagnostic.related_information:
            related = [
                self._related_in_cell(notebook_uri, item) for item in diagnostic.related_information
            ]
        data = diagnostic.data
        if isinstance(data, dict) and isinstance(data.get("noqaLine"), int):
            data = {**data, "noqaLine": range_.start.line}
        return types.Diagnostic(
            range=range_,
            message=relabel_lines(diagnostic.message, self.source.map),
            severity=diagnostic.severity,
            code=diagnostic.code,
            code_description=diagnostic.code_description,
            source=diagnostic.source,
            tags=diagnostic.tags,
            related_information=related,
            data=data,
        )

    def _related_in_cell(
        self, notebook_uri: str, item: types.DiagnosticRelatedInformation
    ) -> types.DiagnosticRelatedInformation:
        if item.location.uri != notebook_uri:
            return item  # another file: already right
        placed = self.to_cell_range(item.location.range)
        if placed is None:
            return item
        uri, range_ = placed
        return types.DiagnosticRelatedInformation(
            location=types.Location(uri=uri, range=range_),
            message=relabel_lines(item.message, self.source.map),
        )


def notebook_text(
    notebook: types.NotebookDocument,
    text_of: Callable[[str], tuple[str, int | None, str | None] | None],
) -> NotebookText:
    """The module of an open notebook: its Python code cells in order, numbered over all its
    cells (markdown ones included, as a person counts them). `text_of(uri)` gives a cell's
    text, version and language id as the workspace holds them (None: no such document; the
    cell is left out)."""
    texts: list[str] = []
    numbers: list[int] = []
    uris: list[str] = []
    versions: list[int | None] = []
    for number, cell in enumerate(notebook.cells, start=1):
        if cell.kind != types.NotebookCellKind.Code:
            continue
        held = text_of(cell.document)
        if held is None:
            continue
        text, version, language = held
        if (language or "").lower() not in PYTHON_LANGUAGES:
            continue  # a SQL or R cell in a Python notebook is not Python
        uris.append(cell.document)
        texts.append(text)
        numbers.append(number)
        versions.append(version)
    return NotebookText(notebook_from_cells(texts, numbers), tuple(uris), tuple(versions))
