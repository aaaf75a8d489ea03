"""`torchls check` in text format: finding lines, the summary, stderr problems, exit codes;
and the command line's parser, built for the one command a run names.

Each test runs the real command on files in a temporary folder and asserts what a user sees.
"""

from __future__ import annotations

import re

import pytest

from .conftest import Project

# The findings of `data/buggy.py` these tests assert on: selected, so that a new rule firing on
# the sample does not change what a test about plumbing sees.
BUGGY = ("--select", "TL101,TL106,TL302,TL303")
LINE_RE = re.compile(
    r"^(?P<path>[^:]+):(?P<row>\d+):(?P<col>\d+): (?P<code>TL\d+)(?P<fix> \[\*\])? "
)


def test_buggy_file_lists_each_finding_with_1_based_column(project):
    project.copy("buggy.py")
    result = project.run("check", *BUGGY, "buggy.py")
    assert result.returncode == 1
    found = [LINE_RE.match(line) for line in result.lines[:4]]
    assert all(found), result.stdout
    assert [m["code"] for m in found] == ["TL101", "TL106", "TL302", "TL303"]
    assert {m["path"] for m in found} == {"buggy.py"}
    assert (int(found[0]["row"]), int(found[0]["col"])) == project.locate("buggy.py", "probs, y")
    assert (int(found[2]["row"]), int(found[2]["col"])) == project.locate(
        "buggy.py", "torch.load(path)"
    )


def test_fix_marker_only_on_fixes_the_current_flags_would_apply(project):
    project.copy("buggy.py")
    markers = {
        m["code"]: bool(m["fix"])
        for m in map(LINE_RE.match, project.run("check", *BUGGY, "buggy.py").lines)
        if m
    }
    assert markers == {"TL101": True, "TL106": True, "TL302": False, "TL303": False}
    unsafe = {
        m["code"]: bool(m["fix"])
        for m in map(
            LINE_RE.match, project.run("check", *BUGGY, "--unsafe-fixes", "buggy.py").lines
        )
        if m
    }
    assert unsafe == {"TL101": True, "TL106": True, "TL302": True, "TL303": False}


def test_summary_counts_findings_by_severity_and_fixable_and_hidden_fixes(project):
    project.copy("buggy.py")
    result = project.run("check", *BUGGY, "buggy.py")
    assert result.lines[-2:] == [
        "Found 4 findings (2 errors, 1 warning, 1 advice).",
        "[*] 2 fixable with the --fix option "
        "(1 hidden fix can be enabled with the --unsafe-fixes option).",
    ]
    unsafe = project.run("check", *BUGGY, "--unsafe-fixes", "buggy.py")
    assert unsafe.lines[-1] == "[*] 3 fixable with the --fix --unsafe-fixes options."


def test_clean_file_passes_with_exit_0(project):
    project.copy("clean.py")
    result = project.run("check", "clean.py")
    assert result.returncode == 0
    assert result.stdout == "All checks passed!\n"
    assert result.stderr == ""


def test_default_path_is_the_current_folder_walked_recursively(project):
    project.copy("buggy.py", "pkg/sub/train.py")
    project.copy("clean.py", "pkg/ok.py")
    result = project.run("check")
    assert result.returncode == 1
    assert {line.split(":")[0] for line in result.lines if LINE_RE.match(line)} == {
        "pkg/sub/train.py"
    }


def test_tool_and_build_folders_are_skipped(project):
    for folder in (".git", ".venv", "venv", "node_modules", "__pycache__", "build", "dist"):
        project.copy("buggy.py", f"{folder}/bad.py")
    project.copy("buggy.py", "env3/lib/site-packages/pkg/bad.py")
    project.write("myenv/pyvenv.cfg", "home = /usr/bin\n")
    project.copy("buggy.py", "myenv/lib/bad.py")
    project.copy("clean.py", "src/ok.py")
    result = project.run("check", ".")
    assert result.returncode == 0, result.stdout
    assert result.stdout == "All checks passed!\n"


def test_only_py_files_are_collected_from_folders_but_named_files_always_count(project):
    project.copy("buggy.py", "notes.txt")
    project.copy("buggy.py", "script")
    assert project.run("check", ".").returncode == 0
    named = project.run("check", "script")
    assert named.returncode == 1
    assert named.lines[0].startswith("script:")


def test_same_file_twice_is_reported_once(project):
    project.copy("buggy.py")
    result = project.run("check", *BUGGY, "buggy.py", ".", "./buggy.py")
    assert sum(1 for line in result.lines if LINE_RE.match(line)) == 4


def test_exit_zero_keeps_the_report_but_exits_0(project):
    project.copy("buggy.py")
    result = project.run("check", *BUGGY, "--exit-zero", "buggy.py")
    assert result.returncode == 0
    assert "Found 4 findings (2 errors, 1 warning, 1 advice)." in result.lines


def test_missing_path_is_an_error_but_the_others_are_checked(project):
    project.copy("buggy.py")
    result = project.run("check", *BUGGY, "nope.py", "buggy.py")
    assert result.returncode == 2
    assert "torchls: error: path not found: nope.py" in result.stderr
    assert "Found 4 findings (2 errors, 1 warning, 1 advice)." in result.lines


def test_undecodable_and_binary_files_are_errors_next_to_reported_findings(project):
    project.copy("buggy.py")
    project.write("latin.py", "x = 'caf\xe9'\n".encode("latin-1"))
    project.write("blob.py", b"\x00\x01\x02binary")
    result = project.run("check", *BUGGY, ".")
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if ": error: " in line]
    assert sorted(line.split(":")[0] for line in errors) == ["blob.py", "latin.py"]
    assert "utf-8" in result.stderr.lower()
    assert "binary" in result.stderr
    assert "Found 4 findings (2 errors, 1 warning, 1 advice)." in result.lines


def test_coding_cookie_file_is_read_in_its_declared_encoding(project):
    text = "# -*- coding: latin-1 -*-\n# caf\xe9\nimport torch\nstate = torch.load(p)\n"
    project.write("legacy.py", text.encode("latin-1"))
    result = project.run("check", "--select", "TL302", "legacy.py")
    assert result.returncode == 1
    assert "TL302" in result.stdout


def test_exit_zero_does_not_hide_an_unreadable_file(project):
    project.write("blob.py", b"\x00\x00")
    assert project.run("check", "--exit-zero", "blob.py").returncode == 2


def test_syntax_error_is_an_error_finding_and_the_rest_is_still_checked(project):
    project.write(
        "broken.py",
        "import torch\n\ndef half_typed(:\n    pass\n\nstate = torch.load(path)\n",
    )
    result = project.run("check", "--select", "TL302", "broken.py")
    assert result.returncode == 1
    assert re.search(
        r"^broken\.py:3:\d+: error: syntax error: .+ \(rest of the file was still checked\)$",
        result.stderr,
        re.MULTILINE,
    ), result.stderr
    assert [m["code"] for m in map(LINE_RE.match, result.lines) if m] == ["TL000", "TL302"]


def test_syntax_error_alone_fails_the_check(project):
    # tests/cli/test_cli_parse_failures.py has it in every output format.
    project.write("broken.py", "def f(:\n    pass\n")
    result = project.run("check", "broken.py")
    assert result.returncode == 1
    assert "syntax error" in result.stderr


def test_empty_folder_passes_with_a_warning(project):
    result = project.run("check", ".")
    assert result.returncode == 0
    assert "no Python files found" in result.stderr


def test_stdin_is_checked_under_its_stdin_filename(project):
    buggy = (project.copy("buggy.py")).read_bytes()
    plain = project.run("check", "-", stdin=buggy)
    assert plain.returncode == 1
    assert plain.lines[0].startswith("-:")
    named = project.run("check", "-", "--stdin-filename", "models/train.py", stdin=buggy)
    assert named.lines[0].startswith("models/train.py:")
    clean = project.run("check", "-", stdin=b"x = 1\n")
    assert clean.returncode == 0


def test_stdin_filename_without_paths_reads_stdin(project):
    project.copy("buggy.py")  # in the folder, so checking "." instead would report it
    result = project.run(
        "check",
        *("--select", "TL302", "--stdin-filename", "train.py"),
        stdin=b"import torch\ns = torch.load(p)\n",
    )
    assert result.returncode == 1
    assert [line.split(" ")[0] for line in result.lines if LINE_RE.match(line)] == ["train.py:2:5:"]


def test_stdin_with_fix_prints_the_fixed_source_and_reports_on_stderr(project):
    buggy = project.copy("buggy.py").read_bytes()
    result = project.run("check", *BUGGY, "--fix", "-", stdin=buggy)
    assert result.returncode == 1  # TL302 and TL303 remain
    assert "F.cross_entropy(logits, y)" in result.stdout
    assert "y.long()" in result.stdout
    assert "Fixed 2 findings." in result.stderr
    assert "TL302" in result.stderr


def test_stdin_cannot_be_mixed_with_paths(project):
    project.copy("clean.py")
    result = project.run("check", "-", "clean.py")
    assert result.returncode == 2
    assert "stdin" in result.stderr


def test_colour_only_when_asked_or_on_a_terminal(project):
    project.copy("buggy.py")
    assert "\x1b[" not in project.run("check", "buggy.py").stdout  # a pipe: no colour
    assert "\x1b[" in project.run("check", "--color", "always", "buggy.py").stdout
    assert "\x1b[" not in project.run("check", "--color", "never", "buggy.py").stdout


def test_bad_option_is_a_usage_error(project):
    result = project.run("check", "--output-format", "xml", ".")
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


def test_no_command_prints_help_and_exits_2(project):
    result = project.run()
    assert result.returncode == 2
    assert "check" in result.stderr


def test_a_missing_path_alone_never_reads_as_all_checks_passed(project):
    result = project.run("check", "does_not_exist.py")
    assert result.returncode == 2
    assert "torchls: error: path not found: does_not_exist.py" in result.stderr
    assert "All checks passed!" not in result.stdout
    assert result.lines == ["No findings in the files checked; some paths could not be checked."]


# --- one command's parser ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "--output-format", "json", "--select", "TL1,TL2", "-j", "2", "a.py", "b"],
        ["check", "--fix", "--unsafe-fixes", "--no-cache", "--color", "never"],
        ["rule", "TL101", "--output-format", "json"],
        ["repro", "train.py", "--steps", "3", "--device", "cpu"],
        ["inspect", "model.pt"],
        ["server", "--stdio"],
    ],
)
def test_a_command_parses_the_same_with_only_its_own_parser_built(argv: list[str]):
    from torchls.cli import build_parser

    alone = build_parser(argv[0])
    assert alone.parse_args(argv) == build_parser().parse_args(argv)
    # Only that command was registered: the others are left out.
    others = {"check", "rule", "repro", "inspect", "server"} - {argv[0]}
    commands = alone._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert set(commands) == {argv[0]} and not others & set(commands)


def test_an_unknown_command_is_told_every_command(project: Project):
    result = project.run("chek", ".")
    assert result.returncode == 2
    assert "invalid choice: 'chek'" in result.stderr
    for command in ("check", "rule", "repro", "inspect", "server"):
        assert f"'{command}'" in result.stderr
