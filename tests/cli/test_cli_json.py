"""`--output-format json`: the ruff-shaped public contract from design.md, key by key.

Also the other machine formats (`--statistics` as JSON, SARIF, GitHub annotations), whose
positions must agree with the JSON ones.
"""

from __future__ import annotations

import json
import os

# The findings of `data/buggy.py` these tests assert on: selected, so that a new rule firing on
# the sample does not change what a test about the output formats sees.
BUGGY = ("--select", "TL101,TL106,TL302,TL303")
FINDING_KEYS = {
    "filename",
    "cell",  # null outside notebooks, as in ruff's JSON
    "code",
    "message",
    "severity",
    "location",
    "end_location",
    "fix",
    "url",
}


def test_every_finding_has_exactly_the_contract_keys(project):
    path = project.copy("buggy.py")
    result = project.run("check", *BUGGY, "--output-format", "json", "buggy.py")
    assert result.returncode == 1
    rows = result.json()
    assert [row["code"] for row in rows] == ["TL101", "TL106", "TL302", "TL303"]
    for row in rows:
        assert set(row) == FINDING_KEYS
        assert row["filename"] == os.path.abspath(path)
        assert row["severity"] in ("error", "warning", "information")
        assert isinstance(row["message"], str) and row["message"]
        assert row["url"] is None
        for key in ("location", "end_location"):
            assert set(row[key]) == {"row", "column"}
            assert row[key]["row"] >= 1 and row[key]["column"] >= 1


def test_location_is_1_based_and_end_location_is_exclusive(project):
    project.copy("buggy.py")
    row = project.run("check", "--output-format", "json", "--select", "TL106", ".").json()[0]
    line, column = project.locate("buggy.py", "y.float()")
    assert row["location"] == {"row": line, "column": column}
    assert row["end_location"] == {"row": line, "column": column + len("y.float()")}


def test_fix_object_shape_for_safe_unsafe_and_no_fix(project):
    project.copy("buggy.py")
    rows = {
        row["code"]: row for row in project.run("check", *BUGGY, "--output-format", "json").json()
    }
    safe = rows["TL106"]["fix"]
    assert set(safe) == {"applicability", "message", "edits"}
    assert safe["applicability"] == "safe"
    line, column = project.locate("buggy.py", "y.float()")
    assert safe["edits"] == [
        {
            "content": "y.long()",
            "location": {"row": line, "column": column},
            "end_location": {"row": line, "column": column + len("y.float()")},
        }
    ]
    # Unsafe fixes are in the JSON whether or not --unsafe-fixes is given: tools decide.
    assert rows["TL302"]["fix"]["applicability"] == "unsafe"
    assert rows["TL303"]["fix"] is None


def test_columns_count_code_points_after_non_ascii_text(project):
    project.write(
        "unicode.py",
        "import torch\n"
        "# Prüfpunkt laden — 检查点\n"
        'def resume(path):\n    note = "naïve ☃"; state = torch.load(path)\n    return state\n',
    )
    row = project.run("check", "--select", "TL302", "--output-format", "json", "unicode.py").json()[
        0
    ]
    assert row["code"] == "TL302"
    line, column = project.locate("unicode.py", "torch.load(path)")
    assert row["location"] == {"row": line, "column": column}
    assert row["end_location"] == {"row": line, "column": column + len("torch.load(path)")}
    insertion = row["fix"]["edits"][0]
    assert insertion["location"] == insertion["end_location"]
    assert insertion["location"]["column"] == column + len("torch.load(path")


def test_clean_run_prints_an_empty_array(project):
    project.copy("clean.py")
    result = project.run("check", "--output-format", "json")
    assert result.returncode == 0
    assert result.json() == []


def test_json_stdout_stays_parseable_when_files_fail(project):
    project.copy("buggy.py")
    project.write("blob.py", b"\x00\x00")
    result = project.run("check", *BUGGY, "--output-format", "json", ".", "missing.py")
    assert result.returncode == 2
    assert len(result.json()) == 4
    assert "blob.py" in result.stderr and "missing.py" in result.stderr


def test_json_is_sorted_by_file_then_position(project):
    project.copy("buggy.py", "b.py")
    project.copy("buggy.py", "a.py")
    rows = project.run("check", *BUGGY, "--output-format", "json", "b.py", "a.py").json()
    keys = [
        (os.path.basename(r["filename"]), r["location"]["row"], r["location"]["column"])
        for r in rows
    ]
    assert keys == sorted(keys)
    assert len(rows) == 8


def test_statistics_json(project):
    project.copy("buggy.py", "a.py")
    project.copy("buggy.py", "b.py")
    result = project.run("check", *BUGGY, "--statistics", "--output-format", "json")
    assert result.returncode == 1
    stats = {row["code"]: row for row in result.json()}
    assert set(stats) == {"TL101", "TL106", "TL302", "TL303"}
    assert stats["TL101"] == {
        "code": "TL101",
        "name": "softmax-before-cross-entropy",
        "count": 2,
        "fixable": True,
    }
    assert stats["TL302"]["fixable"] is False


def test_sarif_log_agrees_with_json_positions(project):
    project.copy("buggy.py")
    sarif = json.loads(project.run("check", "--output-format", "sarif").stdout)
    rows = project.run("check", "--output-format", "json").json()
    assert sarif["version"] == "2.1.0"
    run = sarif["runs"][0]
    assert run["tool"]["driver"]["name"] == "torchls"
    assert run["columnKind"] == "unicodeCodePoints"
    assert len(run["results"]) == len(rows)
    for result, row in zip(run["results"], rows, strict=True):
        region = result["locations"][0]["physicalLocation"]["region"]
        assert result["ruleId"] == row["code"]
        assert (region["startLine"], region["startColumn"]) == (
            row["location"]["row"],
            row["location"]["column"],
        )
    assert {r["id"] for r in run["tool"]["driver"]["rules"]} >= {row["code"] for row in rows}


def test_github_annotations(project):
    project.copy("buggy.py")
    result = project.run("check", *BUGGY, "--output-format", "github")
    assert result.returncode == 1
    line, column = project.locate("buggy.py", "y.float()")
    assert (
        f"::error file=buggy.py,line={line},col={column},"
        f"endLine={line},endColumn={column + 9},title=TL106::buggy.py:{line}:{column}: TL106 "
    ) in result.stdout
    assert result.stdout.count("::warning ") == 1  # TL303
    assert result.stdout.count("::notice ") == 1  # TL302 (information)
