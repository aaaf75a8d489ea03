"""`--output-format sarif` and `--output-format github`: what code scanning and Actions read.

The SARIF log is validated against the SARIF 2.1.0 JSON schema vendored in `data/` (see
`data/sarif-schema-2.1.0.LICENSE.md` for where it comes from), then checked field by field:
driver and rule metadata, 1-based regions, and fixes that really fix the file. The GitHub
format is checked line by line against the workflow-command syntax.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import jsonschema
import pytest

from torchls.analysis import all_rules

from .conftest import DATA, Project

SCHEMA = json.loads((DATA / "sarif-schema-2.1.0.json").read_text(encoding="utf-8"))
LEVELS = {"error": "error", "warning": "warning", "information": "note"}

# One finding of each severity: TL101 (error, safe fix), TL303 (warning, no fix), TL305
# (information, unsafe fix). Tests asserting on them select those codes (and buggy.py's), so a
# new rule firing on the samples does not change what a test about the formats sees.
MIXED_CODES = ("--select", "TL101,TL303,TL305")
BUGGY = ("--select", "TL101,TL106,TL302,TL303")
MIXED = """\
import torch
import torch.nn.functional as F


def step(model: torch.nn.Module, x, y, path):
    probs = F.softmax(model(x), dim=1)
    loss = F.cross_entropy(probs, y)
    state = torch.load(path, map_location="cpu", weights_only=False)
    torch.save(model, "model.pt")
    return loss, state
"""


def sarif(project: Project, *args: str) -> tuple[dict[str, Any], int]:
    result = project.run("check", "--output-format", "sarif", *args)
    assert result.returncode in (0, 1), result.stderr
    return result.json(), result.returncode


def schema_errors(log: dict[str, Any]) -> list[str]:
    validator_class = jsonschema.validators.validator_for(SCHEMA)
    validator = validator_class(SCHEMA, format_checker=validator_class.FORMAT_CHECKER)
    return [
        f"{'/'.join(map(str, error.absolute_path))}: {error.message}"
        for error in validator.iter_errors(log)
    ]


def test_vendored_schema_is_the_sarif_2_1_0_schema_and_rejects_bad_logs():
    validator_class = jsonschema.validators.validator_for(SCHEMA)
    validator_class.check_schema(SCHEMA)
    assert "SARIF" in SCHEMA["title"] and "2.1.0" in SCHEMA["title"]
    assert schema_errors({"version": "2.1.0", "runs": []}) == []
    # The schema really constrains what we emit: a wrong level or a 0-based line fails.
    bad_level = {
        "version": "2.1.0",
        "runs": [{"tool": {"driver": {"name": "x"}}, "results": [_result(level="fatal")]}],
    }
    bad_line = {
        "version": "2.1.0",
        "runs": [{"tool": {"driver": {"name": "x"}}, "results": [_result(line=0)]}],
    }
    assert schema_errors(bad_level) and schema_errors(bad_line)


def _result(level: str = "error", line: int = 1) -> dict[str, Any]:
    return {
        "ruleId": "TL101",
        "level": level,
        "message": {"text": "m"},
        "locations": [
            {
                "physicalLocation": {
                    "artifactLocation": {"uri": "a.py"},
                    "region": {"startLine": line},
                }
            }
        ],
    }


@pytest.mark.parametrize(
    "layout",
    [
        {"buggy.py": "buggy.py"},
        {"clean.py": "clean.py"},
        {"buggy.py": "buggy.py", "pkg/my training script.py": "buggy.py"},
    ],
    ids=["buggy", "clean", "nested-with-space"],
)
def test_sarif_log_validates_against_the_schema(project: Project, layout: dict[str, str]):
    for name, sample in layout.items():
        project.copy(sample, name)
    log, code = sarif(project, *BUGGY, ".")
    assert schema_errors(log) == []
    assert log["version"] == "2.1.0"
    assert log["$schema"].endswith("/sarif-schema-2.1.0.json")
    assert code == (0 if set(layout.values()) == {"clean.py"} else 1)
    results = log["runs"][0]["results"]
    assert len(results) == 4 * list(layout.values()).count("buggy.py")


def test_driver_names_torchls_and_describes_every_rule(project: Project):
    project.copy("buggy.py")
    log, _ = sarif(project, "buggy.py")
    [run] = log["runs"]
    driver = run["tool"]["driver"]
    assert driver["name"] == "torchls"
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", driver["version"])
    rules = {rule.code: rule for rule in all_rules()}
    assert [d["id"] for d in driver["rules"]] == list(rules)
    for descriptor in driver["rules"]:
        rule = rules[descriptor["id"]]
        assert descriptor["name"] == rule.name
        assert descriptor["shortDescription"]["text"] == rule.summary
        assert descriptor["fullDescription"]["text"]
        assert descriptor["fullDescription"]["text"] in " ".join(rule.doc.split())
        assert descriptor["help"]["markdown"] == rule.doc
        assert descriptor["help"]["text"] == rule.doc
        assert descriptor["defaultConfiguration"]["level"] == LEVELS[rule.severity]
    # ruleIndex points at the result's own descriptor.
    for result in run["results"]:
        assert driver["rules"][result["ruleIndex"]]["id"] == result["ruleId"]


def test_results_have_levels_and_1_based_regions(project: Project):
    project.write("train.py", MIXED)
    log, code = sarif(project, *MIXED_CODES, "train.py")
    assert code == 1
    [run] = log["runs"]
    assert run["columnKind"] == "unicodeCodePoints"
    by_rule = {result["ruleId"]: result for result in run["results"]}
    assert sorted(by_rule) == ["TL101", "TL303", "TL305"]
    assert {rule: result["level"] for rule, result in by_rule.items()} == {
        "TL101": "error",
        "TL303": "warning",
        "TL305": "note",
    }
    rows = {
        row["code"]: row
        for row in project.run("check", *MIXED_CODES, "--output-format", "json").json()
    }
    for rule, result in by_rule.items():
        [location] = result["locations"]
        physical = location["physicalLocation"]
        assert physical["artifactLocation"] == {"uri": "train.py", "uriBaseId": "%SRCROOT%"}
        region = physical["region"]
        row = rows[rule]
        assert (region["startLine"], region["startColumn"]) == (
            row["location"]["row"],
            row["location"]["column"],
        )
        assert (region["endLine"], region["endColumn"]) == (
            row["end_location"]["row"],
            row["end_location"]["column"],
        )
        assert result["message"]["text"] == row["message"]
    line, column = project.locate("train.py", "probs, y")
    assert by_rule["TL101"]["locations"][0]["physicalLocation"]["region"] == {
        "startLine": line,
        "startColumn": column,
        "endLine": line,
        "endColumn": column + len("probs"),
    }
    root = run["originalUriBaseIds"]["%SRCROOT%"]["uri"]
    assert root.endswith("/") and Path(unquote(urlsplit(root).path)) == project.root.resolve()
    assert "fixes" not in by_rule["TL303"]


def apply_replacements(text: str, replacements: list[dict[str, Any]]) -> str:
    """Apply SARIF replacements (1-based lines, code-point columns, end exclusive)."""
    lines = text.splitlines(keepends=True)

    def offset(line: int, column: int) -> int:
        return sum(len(item) for item in lines[: line - 1]) + column - 1

    spans = []
    for replacement in replacements:
        region = replacement["deletedRegion"]
        start = offset(region["startLine"], region["startColumn"])
        end = offset(region["endLine"], region["endColumn"])
        spans.append((start, end, replacement["insertedContent"]["text"]))
    for start, end, new in sorted(spans, reverse=True):
        text = text[:start] + new + text[end:]
    return text


def test_fixes_describe_edits_that_fix_the_file(project: Project):
    project.copy("buggy.py")
    original = (project.root / "buggy.py").read_text(encoding="utf-8")
    log, _ = sarif(project, *BUGGY, "buggy.py")
    results = log["runs"][0]["results"]
    safe = [r for r in results if r.get("properties", {}).get("fixApplicability") == "safe"]
    assert sorted(r["ruleId"] for r in safe) == ["TL101", "TL106"]
    assert [r["ruleId"] for r in results if "fixes" not in r] == ["TL303"]
    replacements = []
    for result in safe:
        [fix] = result["fixes"]
        assert fix["description"]["text"]
        [change] = fix["artifactChanges"]
        assert change["artifactLocation"]["uri"] == "buggy.py"
        replacements += change["replacements"]
    fixed_by_sarif = apply_replacements(original, replacements)

    assert project.run("check", *BUGGY, "--fix", "buggy.py").returncode == 1  # TL302, TL303 remain
    assert fixed_by_sarif == (project.root / "buggy.py").read_text(encoding="utf-8")
    assert fixed_by_sarif != original


def test_paths_are_uri_encoded_and_absolute_outside_the_working_folder(
    project: Project, tmp_path_factory: pytest.TempPathFactory
):
    project.write("my dir/train #1.py", MIXED)
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "other.py"
    elsewhere.write_text(MIXED, encoding="utf-8")
    log, _ = sarif(project, ".", str(elsewhere))
    assert schema_errors(log) == []
    uris = {
        r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
        for r in log["runs"][0]["results"]
    }
    assert uris == {"my%20dir/train%20%231.py", elsewhere.resolve().as_uri()}


# --- github ------------------------------------------------------------------------------------

GITHUB_LINE = re.compile(
    r"^::(?P<level>error|warning|notice) "
    r"file=(?P<file>[^,]+),line=(?P<line>\d+),"
    r"col=(?P<col>\d+),endLine=(?P<end_line>\d+),endColumn=(?P<end_col>\d+),"
    r"title=(?P<code>TL\d{3})::(?P<message>.*)$"
)


def test_github_annotations_one_per_finding_with_level_by_severity(project: Project):
    project.write("train.py", MIXED)
    result = project.run("check", *MIXED_CODES, "--output-format", "github")
    assert result.returncode == 1
    rows = project.run("check", *MIXED_CODES, "--output-format", "json").json()
    matches = [GITHUB_LINE.match(line) for line in result.lines]
    assert all(matches), result.stdout
    assert len(matches) == len(rows) == 3
    levels = {"error": "error", "warning": "warning", "information": "notice"}
    for match, row in zip(matches, rows, strict=True):
        assert match["code"] == row["code"]
        assert match["level"] == levels[row["severity"]]
        assert match["file"] == "train.py"
        assert (int(match["line"]), int(match["col"])) == (
            row["location"]["row"],
            row["location"]["column"],
        )
        assert (int(match["end_line"]), int(match["end_col"])) == (
            row["end_location"]["row"],
            row["end_location"]["column"],
        )
        where = f"train.py:{match['line']}:{match['col']}"
        assert match["message"] == f"{where}: {row['code']} {row['message']}"
    assert [m["level"] for m in matches] == ["error", "warning", "notice"]


def test_github_escapes_property_and_message_text(project: Project):
    project.write("a,b: c%.py", MIXED)
    result = project.run("check", "--output-format", "github", ".")
    matches = [GITHUB_LINE.match(line) for line in result.lines]
    assert all(matches), result.stdout
    assert {m["file"] for m in matches} == {"a%2Cb%3A c%25.py"}
    # In the message only %, \r and \n are special; the file name stays readable.
    assert all(m["message"].startswith("a,b: c%25.py:") for m in matches)


def test_github_prints_nothing_for_a_clean_tree(project: Project):
    project.copy("clean.py")
    result = project.run("check", "--output-format", "github")
    assert result.returncode == 0
    assert result.stdout == ""
