"""The bounded repro of a Jupyter notebook: its code cells through the first one that trains,
run as one script with real torch, findings on the notebook's rows.

The notebook's IPython lines must not run (no shell, no magics), cells after the training one
must not run at all, and what the run reports must be attributed to the notebook, so that the
rows map back to cells.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.notebook_samples import TRAINING_CELLS, notebook_bytes
from tests.probe.support import codes
from torchls.notebook import read_notebook
from torchls.probe import ReproOptions, ReproUsageError, run_repro
from torchls.probe.prepare import prepare
from torchls.probe.text import render

# A cell after the training one: it must never run.
AFTER = ("code", "open('after-the-training-cell.txt', 'w').write('ran')\nraise SystemExit(7)\n")
# A shell line that would leave a file if it ran as a command; the repro must skip it.
SHELL = ("code", "!touch shell-line-ran.txt\n%time x = 1\n")


def _options(device: str | None, **extra: object) -> ReproOptions:
    options: dict[str, object] = {"python": sys.executable, "timeout_s": 60.0, **extra}
    if device is not None:
        options["device"] = device
    return ReproOptions(**options)  # type: ignore[arg-type]


def _write(project: Path, cells: list[tuple[str, str]], name: str = "train.ipynb") -> Path:
    path = project / name
    path.write_bytes(notebook_bytes(cells))
    return path


def test_cells_through_the_training_one_run_and_findings_land_on_the_notebook(
    project: Path, device: str | None
):
    cells = [*TRAINING_CELLS[:3], SHELL, *TRAINING_CELLS[3:], AFTER]
    path = _write(project, cells)
    report = run_repro(path, _options(device))
    assert report.status == "ok", report.to_json()
    # The softmax output reaches cross-entropy: TL903 on the loss line, cell 6 line 4.
    found = [finding for finding in report.findings if finding.code == "TL903"]
    assert found, codes(report)
    cell_map = read_notebook(path.read_bytes()).map
    assert Path(found[0].filename).name == "train.ipynb"
    assert cell_map.locate(found[0].line) == (6, 4)
    notes = report.data["notes"]
    assert any("cells 2-6" in note and "cell 6 is the first that trains" in note for note in notes)
    # Neither the cell after training nor the shell line ran (the run's copy of the project
    # is where they would have written).
    written = " ".join(str(entry) for entry in report.data.get("written") or [])
    assert "after-the-training-cell" not in written and "shell-line-ran" not in written
    assert report.data["exception"] is None
    # The report says where each cell that ran is, and the text report places rows in cells.
    block = report.data["target"]["notebook"]
    assert block["through"] == 6 and block["found_loop"] is True
    assert [c["cell"] for c in block["cells"]] == [2, 3, 4, 5, 6]
    for entry in block["cells"]:
        assert cell_map.module_row(entry["cell"], 1) == entry["first_line"]
    text = render(report, cwd=str(project))
    cell, line = cell_map.locate(found[0].line)
    assert f"train.ipynb:cell {cell}:{line}:{found[0].column}" in text
    assert f"train.ipynb:{found[0].line}:" not in text  # no module row is shown as a line


def test_a_notebook_that_never_trains_runs_every_code_cell(project: Path, device: str | None):
    cells = [("code", "import torch\nx = torch.ones(3)\n"), ("code", "print(float(x.sum()))\n")]
    path = _write(project, cells, "explore.ipynb")
    report = run_repro(path, _options(device))
    assert report.status == "ok", report.to_json()
    assert any("ran every code cell, cells 1-2" in note for note in report.data["notes"])
    assert "3.0" in (report.data.get("output") or {}).get("text", "") or any(
        "3.0" in str(value) for value in report.data.values()
    )


def test_the_warm_worker_runs_the_same_notebook_script(project: Path, device: str | None):
    from torchls.probe import ReproSession

    path = _write(project, [*TRAINING_CELLS, AFTER])
    options = _options(device)
    session = ReproSession()
    try:
        session.prewarm_prepared(prepare(path, options), wait=True)
        report = session.run(path, options)
    finally:
        session.close()
    assert report.data["timing"]["runner"] == "warm"
    assert report.status == "ok", report.to_json()
    [finding] = [finding for finding in report.findings if finding.code == "TL903"]
    assert read_notebook(path.read_bytes()).map.locate(finding.line) == (5, 4)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{broken", "invalid JSON"),
        (notebook_bytes([("markdown", "# only prose\n")]), "has no code cell"),
    ],
)
def test_a_notebook_that_cannot_run_is_a_usage_error(project: Path, data: bytes, message: str):
    path = project / "bad.ipynb"
    path.write_bytes(data)
    with pytest.raises(ReproUsageError, match=message):
        run_repro(path, _options(None))
