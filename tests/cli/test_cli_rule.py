"""`torchls rule CODE`, `torchls rule --all`, `--version`, and that `check` stays light.

Expected rule data comes from the registry itself, so the tests follow new rules.
"""

from __future__ import annotations

import json
import subprocess
import sys

from torchls import __version__
from torchls.analysis import get_rule
from torchls.analysis.catalog import documented_rules


def test_rule_prints_header_and_full_doc(project):
    rule = get_rule("TL101")
    assert rule is not None
    result = project.run("rule", "TL101")
    assert result.returncode == 0
    assert result.lines[0] == f"TL101 {rule.name}"
    assert f"Severity: {rule.severity}" in result.lines
    assert any(line.startswith("Fix: safe") for line in result.lines)
    assert rule.doc.strip() in result.stdout


def test_rule_code_is_case_insensitive_and_names_work(project):
    by_code = project.run("rule", "tl302")
    by_name = project.run("rule", "load-without-map-location")
    assert by_code.returncode == by_name.returncode == 0
    assert by_code.stdout == by_name.stdout
    assert any(line.startswith("Fix: unsafe") for line in by_code.lines)


def test_rule_without_fix_says_so(project):
    result = project.run("rule", "TL303")
    assert "Fix: no automatic fix" in result.lines


def test_unknown_rule_exits_2_with_a_close_match(project):
    result = project.run("rule", "TL1001")
    assert result.returncode == 2
    assert "unknown rule 'TL1001'" in result.stderr
    assert "did you mean TL10" in result.stderr
    far = project.run("rule", "TL999")
    assert far.returncode == 2
    assert "did you mean TL" in far.stderr
    assert far.stdout == ""


def test_rule_all_lists_every_registered_rule(project):
    result = project.run("rule", "--all")
    assert result.returncode == 0
    rows = {line.split()[0]: line.split() for line in result.lines[1:]}
    assert result.lines[0].split()[:4] == ["CODE", "NAME", "SEVERITY", "FIX"]
    rules = documented_rules()  # TL000 and the repro's TL9xx too: every code torchls emits
    assert list(rows) == [rule.code for rule in rules]
    for rule in rules:
        assert rows[rule.code][1:4] == [rule.name, rule.severity, rule.fix]


def test_rule_all_json(project):
    result = project.run("rule", "--all", "--output-format", "json")
    assert result.returncode == 0
    rows = result.json()
    assert [row["code"] for row in rows] == [rule.code for rule in documented_rules()]
    assert set(rows[0]) == {"code", "name", "severity", "fix", "summary", "doc"}


def test_rule_needs_a_code_or_all(project):
    assert project.run("rule").returncode == 2
    assert project.run("rule", "TL101", "--all").returncode == 2


def test_version(project):
    result = project.run("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"torchls {__version__}"


def test_check_does_not_import_the_language_server(project, tmp_path):
    project.copy("clean.py")
    script = (
        "import sys, json\n"
        "from torchls.cli import main\n"
        f"code = main(['check', {str(tmp_path / 'clean.py')!r}])\n"
        "print(json.dumps([code, sorted(m for m in sys.modules if m.startswith(('pygls', "
        "'torchls.lsp')))]))\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    code, loaded = json.loads(completed.stdout.splitlines()[-1])
    assert code == 0
    assert loaded == []


def test_every_repro_code_is_found_by_code_and_by_name(project):
    """`torchls rule` covers every code the tool can emit, the repro's TL9xx included."""
    probe = [rule for rule in documented_rules() if rule.code.startswith("TL9")]
    assert [rule.code for rule in probe] == [f"TL9{n:02d}" for n in range(1, 12)]
    for rule in probe:
        by_code = project.run("rule", rule.code)
        by_name = project.run("rule", rule.name)
        assert by_code.returncode == by_name.returncode == 0, by_name.stderr
        assert by_name.stdout == by_code.stdout
        assert rule.name in by_code.stdout


def test_an_unknown_repro_code_suggests_a_repro_code(project):
    result = project.run("rule", "TL912")
    assert result.returncode == 2
    assert "did you mean TL91" in result.stderr
