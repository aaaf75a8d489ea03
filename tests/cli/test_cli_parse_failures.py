"""`torchls check` on a file that does not parse: a TL000 error finding in every output format.

Why: the syntax error used to reach stderr only, so `--output-format json` printed `[]` and the
exit status was 0: a CI job showed a green check for a file torchls never fully read. Now each
syntax error is an error finding (code TL000, at Python's position, no fix) in text, JSON, SARIF
and GitHub output, the rest of the file is still checked, and the exit status is 1 (0 with
`--exit-zero`), for a `.py` file and for a notebook whose code cell is broken (placed by cell).
TL000 is documented like a rule (`torchls rule TL000`, the SARIF descriptor comes from that
doc) but is none: `--select`/`--ignore` refuse it, a configuration or `# noqa` cannot hide it.
In: broken files written into a temporary project, the real command. Out: assertions on stdout
and the exit status.
"""

from __future__ import annotations

import json

import pytest

from tests.notebook_samples import notebook_bytes
from torchls.analysis import get_rule
from torchls.analysis.probe_rules import CHECKER_CODES
from torchls.checker import PARSE_FAILURE_CODE, PARSE_FAILURE_NAME

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


def test_a_syntax_error_has_the_sarif_descriptor_of_its_documentation(broken):
    result = broken.run("check", "--output-format", "sarif", "broken.py")
    run = json.loads(result.stdout)["runs"][0]
    [descriptor] = [d for d in run["tool"]["driver"]["rules"] if d["id"] == "TL000"]
    rule = get_rule("TL000")
    assert rule is not None
    assert descriptor["name"] == "syntax-error"
    assert descriptor["shortDescription"]["text"] == rule.summary
    assert descriptor["fullDescription"]["text"].startswith("A file, or a notebook's code cell")
    assert descriptor["help"] == {"text": rule.doc, "markdown": rule.doc}
    assert descriptor["defaultConfiguration"] == {"level": "error"}


def test_the_checker_reports_the_documented_code_and_name():
    # The analysis does not import the checker, so the code is written in both places.
    rule = get_rule(PARSE_FAILURE_CODE)
    assert rule is not None and PARSE_FAILURE_CODE in CHECKER_CODES
    assert (rule.name, rule.severity, rule.fix) == (PARSE_FAILURE_NAME, "error", "none")


def test_rule_tl000_prints_its_documentation(project):
    rule = get_rule("TL000")
    assert rule is not None
    result = project.run("rule", "TL000")
    assert result.returncode == 0, result.stderr
    assert result.lines[:2] == ["TL000 syntax-error", rule.summary]
    assert "Severity: error" in result.lines
    assert "Fix: no automatic fix" in result.lines
    # Nothing silences it, so the header offers no noqa.
    assert "Always reported: no selection, configuration or # noqa hides it" in result.lines
    assert "# noqa: TL000" not in result.stdout
    for section in ("## What it catches", "## Why it is wrong", "## Example", "## Fix"):
        assert section in result.stdout
    assert rule.doc.strip() in result.stdout
    assert project.run("rule", "syntax-error").stdout == result.stdout
    assert project.run("rule", "tl000").stdout == result.stdout


def test_rule_all_lists_tl000_first(project):
    result = project.run("rule", "--all")
    assert result.returncode == 0
    assert result.lines[1].split()[:4] == ["TL000", "syntax-error", "error", "none"]


@pytest.mark.parametrize("flag", ["--select", "--ignore", "--extend-select"])
def test_selecting_or_ignoring_tl000_is_a_usage_error_that_says_why(broken, flag):
    # As before TL000 was documented: refused (exit 2, nothing checked), now without a
    # "did you mean" of an unrelated rule.
    result = broken.run("check", flag, "tl000", "broken.py")
    assert result.returncode == 2
    assert result.stdout == ""
    assert f"TL000 (syntax-error) in {flag} is not a rule `torchls check` runs" in result.stderr
    assert "did you mean" not in result.stderr


def test_noqa_does_not_silence_a_syntax_error(project):
    project.write("broken.py", "def half_typed(:  # noqa: TL000\n    pass\n")
    result = project.run("check", "--output-format", "json", "broken.py")
    assert result.returncode == 1
    assert [row["code"] for row in result.json()] == ["TL000"]


@pytest.mark.parametrize("key", ["ignore", "select"])
def test_a_configuration_naming_tl000_warns_and_still_reports_it(broken, key):
    broken.write("pyproject.toml", f'[tool.torchls]\n{key} = ["TL000"]\n')
    result = broken.run("check", "--output-format", "json", "broken.py")
    assert result.returncode == 1
    assert "TL000" in [row["code"] for row in result.json()]
    # Said as the flags say it: a documented code that is no check, not a typo.
    assert (
        f"warning: TL000 (syntax-error) in [tool.torchls] {key} is not a rule `torchls check` "
        "runs, so it cannot be selected or ignored; 'torchls rule TL000' explains it"
    ) in result.stderr
    assert "did you mean" not in result.stderr
