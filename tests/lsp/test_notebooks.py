"""The server on Jupyter notebooks over LSP 3.17 notebook sync, driven over real stdio.

A notebook arrives as `notebookDocument/didOpen` with one text document per cell; its code
cells are analysed as one module, and what is found is published (or answered to a pull) per
cell, in the cell's own lines. Asserted here: a TL101 born in one cell (a forward ending in a
softmax) and reported in another (the loss call); markdown cells and IPython lines ignored; an
edit in one cell re-checking the others; a cell inserted above shifting the cell numbers in
messages but not the cell a diagnostic is on; the quick fix and `# noqa` edits addressed to
the cell; hover in a cell; closing clears every cell; a pull client's per-cell pulls.
"""

from __future__ import annotations

from pathlib import Path

from lsprotocol import types

from tests.notebook_samples import LOCAL_SOFTMAX_CELLS, TL101_ROW, TRAINING_CELLS

from .notebook_support import (
    cell_diagnostics,
    close_notebook,
    edit_cell,
    insert_cell,
    open_notebook,
)
from .support import (
    SERVER_COMMAND,
    end_session,
    initialize,
    make_client,
    position_of,
    session,
)


async def test_a_softmax_in_one_cell_is_reported_at_the_loss_in_another(tmp_path: Path) -> None:
    async with session("visual_studio_code", notebooks=True) as client:
        notebook = open_notebook(client, tmp_path / "train.ipynb", TRAINING_CELLS)
        found = await cell_diagnostics(client, notebook, 5, 0)
        assert [d.code for d in found] == ["TL101"]
        [tl101] = found
        # In the cell's own lines, on `net(x)`.
        expected = position_of(notebook.text(5), "net(x)", client.encoding)
        assert tl101.range.start == expected and expected.line == TL101_ROW - 1
        # The forward's softmax, in cell 3, is the related location, addressed to cell 3.
        related = tl101.related_information or []
        assert any(r.location.uri == notebook.cell_uri(3) for r in related)
        softmax = position_of(notebook.text(3), "F.softmax", client.encoding)
        assert any(r.location.range.start == softmax for r in related)
        # Every code cell heard about (an empty list: nothing there); the markdown cell not.
        for number in (2, 3, 4):
            assert await cell_diagnostics(client, notebook, number, 0) == []
        assert not client.publishes_for(notebook.cell_uri(1))
        assert not client.publishes_for(notebook.uri)

        # Fixing the forward in cell 3 clears cell 5: the cells are one module.
        since = len(client.publishes)
        edit_cell(client, notebook, 3, LOCAL_SOFTMAX_CELLS[2][1])
        assert await cell_diagnostics(client, notebook, 5, since) == []

        close_notebook(client, notebook)


async def test_messages_count_lines_in_cells_and_follow_an_inserted_cell(tmp_path: Path) -> None:
    async with session("visual_studio_code", notebooks=True) as client:
        notebook = open_notebook(client, tmp_path / "train.ipynb", TRAINING_CELLS)
        [tl101] = await cell_diagnostics(client, notebook, 5, 0)
        assert "line 7 of cell 3" in tl101.message  # the forward's return, as a person counts

        since = len(client.publishes)
        insert_cell(client, notebook, 0, "markdown", "# Setup\n")
        # Cell 5 is now cell 6: same cell document, same range, the message renumbered.
        [moved] = await cell_diagnostics(client, notebook, 6, since)
        assert moved.range == tl101.range
        assert "line 7 of cell 4" in moved.message

        since = len(client.publishes)
        close_notebook(client, notebook)
        await client.wait_for_publish(
            lambda p: p.uri == notebook.cell_uri(6) and not p.diagnostics, since
        )


async def test_quick_fix_and_noqa_edit_the_cell(tmp_path: Path) -> None:
    async with session("visual_studio_code", notebooks=True) as client:
        notebook = open_notebook(client, tmp_path / "local.ipynb", LOCAL_SOFTMAX_CELLS)
        [tl101] = await cell_diagnostics(client, notebook, 5, 0)
        uri = notebook.cell_uri(5)
        actions = await client.text_document_code_action_async(
            types.CodeActionParams(
                text_document=types.TextDocumentIdentifier(uri),
                range=tl101.range,
                context=types.CodeActionContext(diagnostics=[tl101]),
            )
        )
        titles = [a.title for a in actions or []]
        [fix] = [a for a in actions or [] if a.title.startswith("Fix TL101")]
        [noqa] = [a for a in actions or [] if a.title == "Disable TL101 for this line"]
        assert any(t.startswith("Show documentation for TL101") for t in titles)
        for action in (fix, noqa):
            change = (action.edit.document_changes or [])[0]
            assert change.text_document.uri == uri  # the cell, not the notebook
        [edit] = fix.edit.document_changes[0].edits
        line = notebook.text(5).split("\n")[edit.range.start.line]
        assert edit.range.start.line == edit.range.end.line == TL101_ROW - 1
        fixed = (
            line[: edit.range.start.character] + edit.new_text + line[edit.range.end.character :]
        )
        assert "loss_fn(net(x), y)" in fixed
        [silence] = noqa.edit.document_changes[0].edits
        assert silence.new_text.endswith("# noqa: TL101")
        # The fix-all action edits the cells that change, each by its own URI.
        source = await client.text_document_code_action_async(
            types.CodeActionParams(
                text_document=types.TextDocumentIdentifier(uri),
                range=tl101.range,
                context=types.CodeActionContext(
                    diagnostics=[], only=[types.CodeActionKind.SourceFixAll]
                ),
            )
        )
        [fix_all] = [a for a in source or [] if a.kind == "source.fixAll.torchls"]
        assert [c.text_document.uri for c in fix_all.edit.document_changes] == [uri]

        # A noqa written into the cell silences it.
        since = len(client.publishes)
        lines = notebook.text(5).split("\n")
        lines[TL101_ROW - 1] += "  # noqa: TL101"
        edit_cell(client, notebook, 5, "\n".join(lines))
        assert await cell_diagnostics(client, notebook, 5, since) == []
        close_notebook(client, notebook)


async def test_hover_in_a_cell_shows_the_loss_contract(tmp_path: Path) -> None:
    async with session("visual_studio_code", notebooks=True) as client:
        notebook = open_notebook(client, tmp_path / "train.ipynb", TRAINING_CELLS)
        await cell_diagnostics(client, notebook, 5, 0)
        at = position_of(notebook.text(5), "loss_fn(net", client.encoding)
        hover = await client.text_document_hover_async(
            types.HoverParams(
                text_document=types.TextDocumentIdentifier(notebook.cell_uri(5)), position=at
            )
        )
        assert hover is not None and "CrossEntropyLoss" in hover.contents.value
        # The same words in a markdown cell are not code.
        nothing = await client.text_document_hover_async(
            types.HoverParams(
                text_document=types.TextDocumentIdentifier(notebook.cell_uri(1)),
                position=types.Position(0, 3),
            )
        )
        assert nothing is None
        close_notebook(client, notebook)


async def test_a_pull_client_pulls_each_cell(tmp_path: Path) -> None:
    async with session("neovim", notebooks=True) as client:
        assert client.pull
        notebook = open_notebook(client, tmp_path / "train.ipynb", TRAINING_CELLS)
        [tl101] = await cell_diagnostics(client, notebook, 5, 0)
        assert tl101.code == "TL101"
        assert tl101.range.start.line == TL101_ROW - 1
        assert await cell_diagnostics(client, notebook, 3, 0) == []
        edit_cell(client, notebook, 3, LOCAL_SOFTMAX_CELLS[2][1])
        assert await cell_diagnostics(client, notebook, 5, 0) == []
        assert not client.publishes  # a pull client is never pushed to
        close_notebook(client, notebook)


async def test_notebook_sync_is_announced_only_to_clients_that_sync_notebooks() -> None:
    for notebooks in (True, False):
        client = make_client()
        await client.start_io(*SERVER_COMMAND)
        try:
            result = await initialize(client, "visual_studio_code", notebooks=notebooks)
            sync = result.capabilities.notebook_document_sync
            if notebooks:
                assert isinstance(sync, types.NotebookDocumentSyncOptions) and sync.save
                kinds = [selector.notebook for selector in sync.notebook_selector]
                assert "jupyter-notebook" in kinds
                for selector in sync.notebook_selector:
                    assert [c.language for c in selector.cells or []] == ["python"]
            else:
                assert sync is None
        finally:
            await end_session(client)
