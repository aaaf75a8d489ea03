"""A notebook as an LSP client holds it: open, edit, insert a cell, close, read diagnostics.

In: cell lists [(cell_type, source)] (as `tests.notebook_samples` writes them). Out: the
`notebookDocument/*` notifications VS Code sends (one text document per cell, cell URIs in
VS Code's `vscode-notebook-cell:` shape) and the diagnostics the server gives each cell.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from lsprotocol import types
from pygls.uris import from_fs_path

from tests.notebook_samples import notebook_bytes

from .support import RecordingClient


@dataclass
class Notebook:
    """The test's copy of an open notebook: cells as (kind, cell URI, text, version)."""

    uri: str
    path: Path
    cells: list[list] = field(default_factory=list)
    version: int = 1

    def cell_uri(self, number: int) -> str:
        return self.cells[number - 1][1]

    def text(self, number: int) -> str:
        return self.cells[number - 1][2]


def _cell_uri(path: Path, number: int) -> str:
    # The shape VS Code gives cell documents: the notebook's path and a fragment per cell.
    return f"vscode-notebook-cell:{path.as_posix()}#W{number}sZmlsZQ%3D%3D"


def _lsp_cell(kind: str, uri: str) -> types.NotebookCell:
    cell_kind = types.NotebookCellKind.Code if kind == "code" else types.NotebookCellKind.Markup
    return types.NotebookCell(kind=cell_kind, document=uri)


def _item(kind: str, uri: str, text: str) -> types.TextDocumentItem:
    language = "python" if kind == "code" else "markdown"
    return types.TextDocumentItem(uri=uri, language_id=language, version=1, text=text)


def open_notebook(
    client: RecordingClient, path: Path, cells: list[tuple[str, str]], saved: bool = False
) -> Notebook:
    """Open a notebook of `cells` in the editor. On disk: the same notebook with `saved`
    (what a repro runs), else `{}` (the analysis must read the editor's cells, never the file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(notebook_bytes(cells) if saved else b"{}")
    notebook = Notebook(from_fs_path(str(path)) or "", path)
    for number, (kind, text) in enumerate(cells, start=1):
        notebook.cells.append([kind, _cell_uri(path, number), text, 1])
    client.notebook_document_did_open(
        types.DidOpenNotebookDocumentParams(
            notebook_document=types.NotebookDocument(
                uri=notebook.uri,
                notebook_type="jupyter-notebook",
                version=1,
                cells=[_lsp_cell(kind, uri) for kind, uri, _, _ in notebook.cells],
            ),
            cell_text_documents=[_item(kind, uri, text) for kind, uri, text, _ in notebook.cells],
        )
    )
    return notebook


def edit_cell(client: RecordingClient, notebook: Notebook, number: int, text: str) -> None:
    cell = notebook.cells[number - 1]
    cell[2], cell[3] = text, cell[3] + 1
    notebook.version += 1
    client.notebook_document_did_change(
        types.DidChangeNotebookDocumentParams(
            notebook_document=types.VersionedNotebookDocumentIdentifier(
                version=notebook.version, uri=notebook.uri
            ),
            change=types.NotebookDocumentChangeEvent(
                cells=types.NotebookDocumentCellChanges(
                    text_content=[
                        types.NotebookDocumentCellContentChanges(
                            document=types.VersionedTextDocumentIdentifier(
                                uri=cell[1], version=cell[3]
                            ),
                            changes=[types.TextDocumentContentChangeWholeDocument(text=text)],
                        )
                    ]
                )
            ),
        )
    )


def insert_cell(client: RecordingClient, notebook: Notebook, at: int, kind: str, text: str) -> str:
    """Insert a cell before position `at` (0-based); its URI."""
    uri = _cell_uri(notebook.path, 100 + len(notebook.cells))
    notebook.cells.insert(at, [kind, uri, text, 1])
    notebook.version += 1
    client.notebook_document_did_change(
        types.DidChangeNotebookDocumentParams(
            notebook_document=types.VersionedNotebookDocumentIdentifier(
                version=notebook.version, uri=notebook.uri
            ),
            change=types.NotebookDocumentChangeEvent(
                cells=types.NotebookDocumentCellChanges(
                    structure=types.NotebookDocumentCellChangeStructure(
                        array=types.NotebookCellArrayChange(
                            start=at, delete_count=0, cells=[_lsp_cell(kind, uri)]
                        ),
                        did_open=[_item(kind, uri, text)],
                    )
                )
            ),
        )
    )
    return uri


def close_notebook(client: RecordingClient, notebook: Notebook) -> None:
    client.notebook_document_did_close(
        types.DidCloseNotebookDocumentParams(
            notebook_document=types.NotebookDocumentIdentifier(uri=notebook.uri),
            cell_text_documents=[
                types.TextDocumentIdentifier(uri=uri) for _, uri, _, _ in notebook.cells
            ],
        )
    )


async def cell_diagnostics(
    client: RecordingClient, notebook: Notebook, number: int, since: int
) -> list[types.Diagnostic]:
    """The diagnostics of cell `number` for its current text: the publish for that cell's
    version at or after `since` (push), or a pull of the cell."""
    _, uri, _, version = notebook.cells[number - 1]
    if client.pull:
        report = await client.text_document_diagnostic_async(
            types.DocumentDiagnosticParams(text_document=types.TextDocumentIdentifier(uri))
        )
        return list(report.items)
    params = await client.wait_for_publish(lambda p: p.uri == uri and p.version == version, since)
    return list(params.diagnostics)
