"""`torchls.notebook`: notebooks read as one module, rows mapped to cells, fixes written back.

The module text must keep every code line on a row that maps to its cell and line, IPython
lines must become code that parses, and writing back must change nothing but the sources of
the cells whose text changed (byte for byte, in the layouts real files have).
"""

from __future__ import annotations

import ast
import json

import pytest

from tests.notebook_samples import TRAINING_CELLS, notebook, notebook_bytes
from torchls.analysis.findings import Edit, Finding, Fix, Span
from torchls.notebook import (
    SEPARATOR,
    NotebookError,
    cell_finding,
    notebook_from_cells,
    read_notebook,
    relabel_lines,
    write_back,
)


def test_code_cells_in_order_with_markdown_left_out_and_rows_mapped():
    source = read_notebook(notebook_bytes(TRAINING_CELLS))
    assert [cell.number for cell in source.cells] == [2, 3, 4, 5]
    lines = source.text.split("\n")
    # Every line of every code cell is on the row the map gives for it.
    for number, (kind, text) in enumerate(TRAINING_CELLS, start=1):
        if kind != "code":
            continue
        for row, line in enumerate(text.split("\n"), start=1):
            module_row = source.map.module_row(number, row)
            assert module_row is not None
            assert source.map.locate(module_row) == (number, row)
            if line and not line.startswith(("%", "!")):
                assert lines[module_row - 1] == line
    assert lines.count(SEPARATOR) == 3
    ast.parse(source.text)


@pytest.mark.parametrize(
    "cell",
    [
        "%load_ext autoreload\n%autoreload 2\nimport torch\n",
        "!pip install timm \\\n    einops\nimport torch\n",
        "files = !ls data\nout, err = %sx ls\nimport torch\n",
        "for i in range(2):\n    !echo $i\n    %time x = i\n",
        "torch.nn.Linear?\n??torch.optim\n",
        "%%bash\n  echo hi\n    if true; then echo x; fi\n",
        "%%time\nfor i in range(3):\n    y = i * 2\n",
    ],
)
def test_ipython_lines_become_code_that_parses_on_the_same_rows(cell):
    source = notebook_from_cells([cell])
    ast.parse(source.text)  # raises if a placeholder broke the indentation
    assert source.text.count("\n") == cell.count("\n")
    # Python lines stay as they are (a %%time body is Python that runs).
    if cell.startswith("%%time"):
        assert "    y = i * 2" in source.text.split("\n")
    if cell.startswith("%%bash"):
        assert "echo" not in source.text


@pytest.mark.parametrize(
    ("cell", "kept", "blanked"),
    [
        # `%` at the start of a line inside open brackets is string formatting.
        ("print('loss %.4f'\n      % (loss,))\n%matplotlib inline\n", ["      % (loss,))"], 1),
        # `!` inside a triple-quoted string that goes on over lines.
        ('doc = """\n!not a shell command\n"""\n!ls\n', ["!not a shell command"], 1),
        # A backslash continuation, then a real magic on its own line.
        ("total = 1 + \\\n    2\n%time f()\n", ["    2"], 1),
        # A bracket inside a string or a comment opens nothing: the help line is IPython.
        ('label = "(("  # [\nlen?\n', [], 1),
        ("rows = [1,\n        2]\n%who\n", ["        2]"], 1),
    ],
)
def test_continuation_lines_are_python_not_magics(cell, kept, blanked):
    source = notebook_from_cells([cell])
    ast.parse(source.text)
    lines = source.text.split("\n")
    for line in kept:
        assert line in lines
    assert len(source.cells[0].ipython) == blanked


def test_identity_write_back_is_byte_identical():
    for data in (
        notebook_bytes(TRAINING_CELLS, outputs=True),
        json.dumps(notebook(TRAINING_CELLS), indent=2).encode(),  # other tools' layout
        json.dumps(notebook(TRAINING_CELLS)).encode(),  # all on one line
    ):
        source = read_notebook(data)
        assert write_back(data, source, source.text) == data


def _changed_lines(before: bytes, after: bytes) -> list[tuple[str, str]]:
    old, new = before.decode().splitlines(), after.decode().splitlines()
    return [(a, b) for a, b in zip(old, new, strict=False) if a != b]


def test_write_back_changes_only_the_edited_cell_and_keeps_outputs_and_magics():
    data = notebook_bytes(TRAINING_CELLS, outputs=True)
    source = read_notebook(data)
    fixed = source.text.replace("F.softmax(self.head(x), dim=1)", "self.head(x)")
    out = write_back(data, source, fixed)
    assert out is not None and out != data
    assert _changed_lines(data, out) == [
        (
            '    "        return F.softmax(self.head(x), dim=1)\\n"',
            '    "        return self.head(x)\\n"',
        )
    ]
    after = json.loads(out)
    before = json.loads(data)
    assert [c.get("outputs") for c in after["cells"]] == [c.get("outputs") for c in before["cells"]]
    assert after["cells"][1]["source"][0] == "%matplotlib inline\n"  # the magic came back
    assert after["cells"][3]["source"][0] == "!nvidia-smi\n"


def test_write_back_of_inserted_lines_and_string_sources():
    data = json.dumps(
        {
            "cells": [
                {"cell_type": "code", "metadata": {}, "outputs": [], "source": "x = 1\n!ls\ny = 2"},
                {"cell_type": "code", "metadata": {}, "outputs": [], "source": []},
            ],
            "metadata": {},
            "nbformat": 4,
            "nbformat_minor": 4,
        },
        indent=1,
    ).encode()
    source = read_notebook(data)
    lines = source.text.split("\n")
    lines.insert(1, "z = 0")
    lines.insert(len(lines) - 1, "w = 3")  # into the empty last cell
    out = write_back(data, source, "\n".join(lines))
    assert out is not None
    cells = json.loads(out)["cells"]
    assert cells[0]["source"] == "x = 1\nz = 0\n!ls\ny = 2"  # a string stays a string
    assert cells[1]["source"] == ["w = 3"]


def test_write_back_refuses_text_that_lost_a_cell_boundary():
    data = notebook_bytes(TRAINING_CELLS)
    source = read_notebook(data)
    assert write_back(data, source, source.text.replace(SEPARATOR + "\n", "", 1)) is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty"),
        (b"{not json", "invalid JSON at line 1 column 2"),
        (b"[]", "not an object"),
        (b'{"nbformat": 4, "metadata": {}}', "no 'cells' list"),
        (b'{"nbformat": 3, "worksheets": []}', "nbformat 3 notebooks are not supported"),
        (b'{"nbformat": 4, "cells": [{"cell_type": "code", "source": 3}]}', "not text"),
        (b"\xff\xfe{}", "not UTF-8"),
    ],
)
def test_files_that_are_not_notebooks_say_why(data, message):
    with pytest.raises(NotebookError, match=message):
        read_notebook(data)


def test_a_notebook_in_another_language_has_no_cells():
    data = notebook_bytes(
        [("code", "library(torch)\n")], kernelspec={"language": "R", "name": "ir"}
    )
    source = read_notebook(data)
    assert source.language == "r" and source.cells == () and source.text == ""


def test_findings_are_placed_in_cells_with_line_mentions_relabelled():
    source = read_notebook(notebook_bytes(TRAINING_CELLS))
    forward_row = source.map.module_row(3, 7)
    loss_row = source.map.module_row(5, 4)
    assert forward_row is not None and loss_row is not None
    finding = Finding(
        "TL101",
        f"input (from `F.softmax` on line {forward_row}; see `line {forward_row}` and "
        f"data.py, line 4)",
        "error",
        Span.of(loss_row, 23, loss_row, 29),
        Fix("safe", "drop it", (Edit(Span.of(forward_row, 15, forward_row, 45), "x"),)),
    )
    cell, placed = cell_finding(finding, source.map)
    assert cell == 5
    assert (placed.span.start.row, placed.span.end.row, placed.span.start.column) == (4, 4, 23)
    assert placed.fix is not None and placed.fix.edits[0].span.start.row == 7
    assert placed.message == (
        f"input (from `F.softmax` on line 7 of cell 3; see `line {forward_row}` and "
        "data.py, line 4)"
    )
    assert relabel_lines("no rows here", source.map) == "no rows here"
