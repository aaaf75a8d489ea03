"""`torchls check` on a file that does not parse: a TL000 error finding in every output format.

Why: the syntax error used to reach stderr only, so `--output-format json` printed `[]` and the
exit status was 0: a CI job showed a green check for a file torchls never fully read. Now each
syntax error is an error finding (code TL000, at Python's position, no fix) in text, JSON, SARIF
and GitHub output, the rest of the file is still checked, and the exit status is 1 (0 with
`--exit-zero`), for a `.py` file and for a notebook whose code cell is broken (placed by cell).
In: broken files written into a temporary project, the real command. Out: assertions on stdout
and the exit status.
"""

from __future__ import annotations

import json

import pytest

from tests.notebook_samples import notebook_bytes

BROKEN_PY = "import torch\n\ndef half_typed(:\n    pass\n\nstate = torch.load(path)\n"
# Cell 3 (cells count from 1, markdown included), row 1, column 16 is where Python stops.
BROKEN_CELLS = [
    ("markdown", "# Training\n"),
    ("code", "import torch\n"),
    ("code", "def half_typed(:\n    pass\n"),
    ("code", "state = torch.load(path)\n"),
]
FORMATS = ["text", "json", "sarif", "github"]


@pytest.fixture
def broken(project):
    project.write("broken.py", BROKEN_PY)
    project.write("broken.ipynb", notebook_bytes(BROKEN_CELLS))
    project.write("clean.py", "x = 1\n")
    return project


def parse_failures(output_format: str, stdout: str) -> list[tuple[str, int | None, int, int]]:
    """(file, cell, row, column) of each TL000 in one format's output, columns 1-based."""
    found: list[tuple[str, int | None, int, int]] = []
    if output_format == "json":
        for row in json.loads(stdout):
            if row["code"] == "TL000":
                assert row["severity"] == "error" and row["fix"] is None
                assert row["message"].startswith("syntax error: ")
                name = row["filename"].rsplit("/", 1)[-1]
                found.append((name, row["cell"], row["location"]["row"], row["location"]["column"]))
    elif output_format == "sarif":
        run = json.loads(stdout)["runs"][0]
        rules = run["tool"]["driver"]["rules"]
        for result in run["results"]:
            if result["ruleId"] == "TL000":
                assert result["level"] == "error"
                assert rules[result["ruleIndex"]]["id"] == "TL000"
                location = result["locations"][0]
                region = location["physicalLocation"]["region"]
                name = location["physicalLocation"]["artifactLocation"]["uri"]
                cell = location.get("properties", {}).get("cell")
                found.append((name, cell, region["startLine"], region["startColumn"]))
    elif output_format == "github":
        for line in stdout.splitlines():
            if "title=TL000" in line:
                assert line.startswith("::error file=")
                fields = line.removeprefix("::error ").split("::")[0].split(",")
                props = dict(field.split("=", 1) for field in fields)
                title = props["title"].removesuffix(")").split(" (cell ")
                cell = int(title[1]) if len(title) == 2 else None
                found.append((props["file"], cell, int(props["line"]), int(props["col"])))
    else:
        for line in stdout.splitlines():
            where, _, rest = line.partition(": TL000 ")
            if rest:
                assert rest.startswith("syntax error: ")
                parts = where.split(":")
                cell = int(parts[1].removeprefix("cell ")) if parts[1].startswith("cell") else None
                found.append((parts[0], cell, int(parts[-2]), int(parts[-1])))
    return found


@pytest.mark.parametrize("output_format", FORMATS)
def test_a_broken_py_file_is_an_error_in_every_format(broken, output_format):
    result = broken.run("check", "--output-format", output_format, "broken.py", "clean.py")
    assert result.returncode == 1, result.stderr
    assert parse_failures(output_format, result.stdout) == [("broken.py", None, 3, 16)]


@pytest.mark.parametrize("output_format", FORMATS)
def test_a_notebook_with_a_broken_cell_is_an_error_placed_in_that_cell(broken, output_format):
    result = broken.run("check", "--output-format", output_format, "broken.ipynb")
    assert result.returncode == 1, result.stderr
    assert parse_failures(output_format, result.stdout) == [("broken.ipynb", 3, 1, 16)]


def test_the_rest_of_a_broken_file_is_still_checked_and_listed_in_order(broken):
    rows = broken.run("check", "--output-format", "json", "--select", "TL302", ".").json()
    assert [(row["filename"].rsplit("/", 1)[-1], row["cell"], row["code"]) for row in rows] == [
        ("broken.ipynb", 3, "TL000"),
        ("broken.ipynb", 4, "TL302"),
        ("broken.py", None, "TL000"),
        ("broken.py", None, "TL302"),
    ]


def test_selection_does_not_hide_a_syntax_error(broken):
    # TL000 is no rule: `--select` of some other code still shows the file could not be parsed.
    result = broken.run("check", "--output-format", "json", "--select", "TL101", "broken.py")
    assert result.returncode == 1
    assert [row["code"] for row in result.json()] == ["TL000"]


def test_exit_zero_and_statistics_count_a_syntax_error_like_a_finding(broken):
    assert broken.run("check", "--exit-zero", "broken.py").returncode == 0
    stats = broken.run("check", "--statistics", "--output-format", "json", "broken.py")
    assert stats.returncode == 1
    assert {"code": "TL000", "name": "syntax-error", "count": 1, "fixable": False} in stats.json()


def test_text_output_does_not_claim_all_checks_passed(broken):
    result = broken.run("check", "broken.py")
    assert "All checks passed!" not in result.stdout
    assert "Found 2 findings (1 error, 1 advice)." in result.stdout


def test_a_file_that_parses_has_no_tl000_and_no_extra_sarif_descriptor(broken):
    result = broken.run("check", "--output-format", "sarif", "clean.py")
    assert result.returncode == 0
    run = json.loads(result.stdout)["runs"][0]
    assert run["results"] == []
    assert "TL000" not in [rule["id"] for rule in run["tool"]["driver"]["rules"]]
