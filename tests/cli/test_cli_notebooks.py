"""`torchls check` on Jupyter notebooks, run as the real command.

A notebook's code cells are checked as one module; findings are placed by cell and line in
every output format, `--fix` rewrites only the cell sources it changed (outputs, metadata and
layout byte-identical), `# noqa` works in cells, and `include`/`exclude` pick notebooks in.
"""

from __future__ import annotations

import json

from tests.notebook_samples import (
    LOCAL_SOFTMAX_CELLS,
    TL101_CELL,
    TL101_COLUMN,
    TL101_ROW,
    TRAINING_CELLS,
    notebook_bytes,
)


def test_text_output_names_the_cell_and_the_line_in_it(project):
    project.write("train.ipynb", notebook_bytes(TRAINING_CELLS))
    result = project.run("check", "--select", "TL101", "train.ipynb")
    assert result.returncode == 1, result.stderr
    assert result.lines[0].startswith(
        f"train.ipynb:cell {TL101_CELL}:{TL101_ROW}:{TL101_COLUMN}: TL101 CrossEntropyLoss"
    )
    # The message's pointer to the softmax is a cell line too.
    assert "on line 7 of cell 3" in result.lines[0]


def test_folders_include_notebooks_and_markdown_cells_are_not_read(project):
    cells = [*TRAINING_CELLS, ("markdown", "loss = loss_fn(net(x).softmax(1), y)\n")]
    project.write("nb/train.ipynb", notebook_bytes(cells))
    project.write("nb/helpers.py", "import torch\n")
    rows = project.run("check", "--select", "TL1", "--output-format", "json", ".").json()
    assert [(row["filename"].endswith("train.ipynb"), row["cell"]) for row in rows] == [
        (True, TL101_CELL)
    ]


def test_folder_walks_skip_jupyters_own_copies_of_notebooks(project):
    # An autosave checkpoint (a second copy of the notebook) and jupyter-lsp's virtual
    # document (Python text under the notebook's name) are not the user's files.
    project.write("train.ipynb", notebook_bytes(TRAINING_CELLS))
    project.write(".ipynb_checkpoints/train-checkpoint.ipynb", notebook_bytes(TRAINING_CELLS))
    project.write(".virtual_documents/train.ipynb", "import torch\n")
    result = project.run("check", "--select", "TL101", "--output-format", "json", ".")
    assert result.returncode == 1, result.stderr  # a finding, no unreadable-notebook error
    assert [row["filename"].rsplit("/", 2)[-2:] for row in result.json()] == [
        [project.root.name, "train.ipynb"]
    ]


def test_json_sarif_and_github_locations_count_rows_in_the_cell(project):
    project.write("train.ipynb", notebook_bytes(TRAINING_CELLS))
    [row] = project.run(
        "check", "--select", "TL101", "--output-format", "json", "train.ipynb"
    ).json()
    assert row["cell"] == TL101_CELL
    assert row["location"] == {"row": TL101_ROW, "column": TL101_COLUMN}
    project.write("local.ipynb", notebook_bytes(LOCAL_SOFTMAX_CELLS))
    [row] = project.run(
        "check", "--select", "TL101", "--output-format", "json", "local.ipynb"
    ).json()
    assert row["cell"] == TL101_CELL
    assert all(edit["cell"] == TL101_CELL for edit in row["fix"]["edits"])
    assert {edit["location"]["row"] for edit in row["fix"]["edits"]} == {TL101_ROW}

    sarif = json.loads(
        project.run("check", "--select", "TL101", "--output-format", "sarif", "local.ipynb").stdout
    )
    [result] = sarif["runs"][0]["results"]
    [location] = result["locations"]
    assert location["properties"] == {"cell": TL101_CELL}
    assert location["physicalLocation"]["region"]["startLine"] == TL101_ROW
    assert "fixes" not in result  # its rows are not rows of the .ipynb file

    github = project.run(
        "check", "--select", "TL101", "--output-format", "github", "train.ipynb"
    ).stdout
    assert f"line={TL101_ROW},col={TL101_COLUMN}," in github
    assert f"title=TL101 (cell {TL101_CELL})" in github


def test_fix_rewrites_only_the_changed_cell_source(project):
    original = notebook_bytes(LOCAL_SOFTMAX_CELLS, outputs=True)
    path = project.write("train.ipynb", original)
    result = project.run("check", "--select", "TL101", "--fix", "train.ipynb")
    assert result.returncode == 0, result.stdout + result.stderr
    fixed = path.read_bytes()
    changed = [
        (old, new)
        for old, new in zip(original.splitlines(), fixed.splitlines(), strict=True)
        if old != new
    ]
    assert changed == [
        (
            b'    "        loss = loss_fn(F.softmax(net(x), dim=1), y)\\n",',
            b'    "        loss = loss_fn(net(x), y)\\n",',
        )
    ]
    before, after = json.loads(original), json.loads(fixed)
    assert [c.get("outputs") for c in after["cells"]] == [c.get("outputs") for c in before["cells"]]
    assert after["metadata"] == before["metadata"]
    # Checked again, the notebook is clean and its IPython lines are still there.
    assert project.codes("--select", "TL101", "train.ipynb") == []
    assert "%matplotlib inline\n" in after["cells"][1]["source"]


def test_noqa_in_a_cell(project):
    cells = list(TRAINING_CELLS)
    kind, source = cells[4]
    cells[4] = (kind, source.replace("net(x), y)", "net(x), y)  # noqa: TL101"))
    project.write("train.ipynb", notebook_bytes(cells))
    assert project.codes("--select", "TL101", "train.ipynb") == []


def test_empty_notebook_and_notebook_without_code_are_clean(project):
    project.write("empty.ipynb", notebook_bytes([]))
    project.write("notes.ipynb", notebook_bytes([("markdown", "# Notes\n")]))
    project.write("blank_cell.ipynb", notebook_bytes([("code", "")]))
    result = project.run("check", ".")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "All checks passed!" in result.stdout


def test_broken_notebook_is_an_error_naming_the_problem_and_others_still_checked(project):
    project.write("broken.ipynb", b'{"cells": [')
    project.write("train.ipynb", notebook_bytes(TRAINING_CELLS))
    result = project.run("check", "--select", "TL101", ".")
    assert result.returncode == 2
    assert "broken.ipynb: error: cannot read the notebook: not a notebook: invalid JSON" in (
        result.stderr
    )
    assert any(line.startswith("train.ipynb:cell 5:") for line in result.lines)


def test_a_notebook_in_another_language_is_skipped_with_a_note(project):
    project.write(
        "r.ipynb",
        notebook_bytes([("code", "x <- 1\n")], kernelspec={"language": "R", "name": "ir"}),
    )
    result = project.run("check", "r.ipynb")
    assert result.returncode == 0
    assert "not a Python notebook" in result.stderr


def test_include_and_exclude_pick_notebooks_in_or_out(project):
    project.write("train.ipynb", notebook_bytes(TRAINING_CELLS))
    assert project.codes("--select", "TL101", ".") == ["TL101"]
    project.write("pyproject.toml", '[tool.torchls]\ninclude = ["*.py"]\n')
    assert project.codes("--select", "TL101", ".") == []
    project.write("pyproject.toml", '[tool.torchls]\nexclude = ["*.ipynb"]\n')
    assert project.codes("--select", "TL101", ".") == []
    # A notebook named on the command line is checked whatever the globs say.
    assert project.codes("--select", "TL101", "train.ipynb") == ["TL101"]
    project.write("pyproject.toml", '[tool.torchls]\ninclude = "*.py"\n')
    result = project.run("check", ".")
    assert result.returncode == 2 and "include must be a list of strings" in result.stderr


def test_stdin_with_a_notebook_name_and_fix_prints_the_fixed_notebook(project):
    original = notebook_bytes(LOCAL_SOFTMAX_CELLS, outputs=True)
    result = project.run(
        "check", "--select", "TL101", "--stdin-filename", "train.ipynb", "-", stdin=original
    )
    assert result.returncode == 1
    assert result.lines[0].startswith(f"train.ipynb:cell {TL101_CELL}:{TL101_ROW}:")
    fixed = project.run(
        "check", "--select", "TL101", "--fix", "--stdin-filename", "train.ipynb", stdin=original
    )
    assert fixed.returncode == 0, fixed.stderr
    after = json.loads(fixed.stdout)
    assert after["cells"][4]["source"][3] == "        loss = loss_fn(net(x), y)\n"
    assert after["cells"][4]["outputs"] == json.loads(original)["cells"][4]["outputs"]


def test_cached_results_place_findings_in_cells_too(project):
    project.write("train.ipynb", notebook_bytes(TRAINING_CELLS))
    first = project.run("check", "--select", "TL101", "train.ipynb")
    second = project.run("check", "--select", "TL101", "train.ipynb")  # from the cache
    assert (project.root / ".torchls_cache").is_dir()
    assert first.stdout == second.stdout
    assert second.lines[0].startswith(f"train.ipynb:cell {TL101_CELL}:")
