"""Which rules run: --select/--ignore/--extend-select, `[tool.torchls]`, per-file ignores,
excludes, and `# noqa` comments. Asserted through the JSON codes the real command reports.
"""

from __future__ import annotations

ALL_CODES = ["TL101", "TL106", "TL302", "TL303"]


def test_select_exact_codes_and_comma_lists(project):
    project.copy("buggy.py")
    assert project.codes("--select", "TL302") == ["TL302"]
    assert project.codes("--select", "TL101,TL303") == ["TL101", "TL303"]
    assert project.codes("--select", "TL101", "--select", "TL106") == ["TL101", "TL106"]


def test_select_by_prefix(project):
    project.copy("buggy.py")
    assert project.codes("--select", "TL1") == ["TL101", "TL106"]
    assert project.codes("--select", "TL3") == ["TL302", "TL303"]
    assert project.codes("--select", "ALL") == ALL_CODES


def test_ignore_codes_and_prefixes(project):
    project.copy("buggy.py")
    assert project.codes("--ignore", "TL3") == ["TL101", "TL106"]
    assert project.codes("--ignore", "TL101,TL303") == ["TL106", "TL302"]


def test_more_specific_selector_wins(project):
    project.copy("buggy.py")
    assert project.codes("--select", "TL1", "--ignore", "TL106") == ["TL101"]
    assert project.codes("--ignore", "TL3", "--extend-select", "TL303") == [
        "TL101",
        "TL106",
        "TL303",
    ]


def test_unknown_selector_is_a_usage_error(project):
    project.copy("buggy.py")
    for flag in ("--select", "--ignore", "--extend-select"):
        result = project.run("check", flag, "TL999", ".")
        assert result.returncode == 2
        assert f"unknown rule selector 'TL999' in {flag}" in result.stderr
        assert "did you mean TL" in result.stderr
        assert result.stdout == ""


def test_pyproject_select_and_ignore(project):
    project.copy("buggy.py")
    project.write("pyproject.toml", '[tool.torchls]\nselect = ["TL1", "TL3"]\nignore = ["TL303"]\n')
    assert project.codes() == ["TL101", "TL106", "TL302"]


def test_command_line_select_replaces_config_select(project):
    project.copy("buggy.py")
    project.write("pyproject.toml", '[tool.torchls]\nselect = ["TL1"]\n')
    assert project.codes("--select", "TL3") == ["TL302", "TL303"]
    assert project.codes("--extend-select", "TL303") == ["TL101", "TL106", "TL303"]


def test_nearest_pyproject_is_found_from_a_subfolder(project):
    project.write("pyproject.toml", '[tool.torchls]\nignore = ["TL1"]\n')
    project.copy("buggy.py", "src/pkg/train.py")
    assert project.run("check", ".", cwd=project.root / "src").returncode == 1
    assert project.codes("src") == ["TL302", "TL303"]


def test_pyproject_without_torchls_table_is_skipped_for_the_next_one_up(project):
    project.write("pyproject.toml", '[tool.torchls]\nselect = ["TL302"]\n')
    project.write("sub/pyproject.toml", '[project]\nname = "sub"\n')
    project.copy("buggy.py", "sub/train.py")
    assert project.codes("sub") == ["TL302"]


def test_per_file_ignores_match_paths_relative_to_the_pyproject(project):
    project.write(
        "pyproject.toml",
        '[tool.torchls]\n[tool.torchls.per-file-ignores]\n"tests/*" = ["TL1"]\n'
        '"legacy.py" = ["TL302"]\n',
    )
    project.copy("buggy.py", "tests/smoke_train.py")
    project.copy("buggy.py", "legacy.py")
    project.copy("buggy.py", "train.py")
    rows = project.run("check", "--output-format", "json").json()
    by_file: dict[str, list[str]] = {}
    for row in rows:
        name = row["filename"][len(str(project.root)) + 1 :]
        by_file.setdefault(name, []).append(row["code"])
    assert by_file == {
        "legacy.py": ["TL101", "TL106", "TL303"],
        "tests/smoke_train.py": ["TL302", "TL303"],
        "train.py": ALL_CODES,
    }
    # Run from inside tests/: the pattern still matches against the pyproject's folder.
    inner = project.run("check", "--output-format", "json", ".", cwd=project.root / "tests")
    assert [row["code"] for row in inner.json()] == ["TL302", "TL303"]


def test_per_file_ignores_apply_to_stdin_filename(project):
    project.write("pyproject.toml", '[tool.torchls.per-file-ignores]\n"tests/*" = ["TL3"]\n')
    buggy = project.copy("buggy.py").read_bytes()
    result = project.run(
        "check", "--output-format", "json", "-", "--stdin-filename", "tests/t.py", stdin=buggy
    )
    assert [row["code"] for row in result.json()] == ["TL101", "TL106"]


def test_exclude_globs_skip_folders_and_files_when_walking(project):
    project.write("pyproject.toml", '[tool.torchls]\nexclude = ["generated", "*_pb2.py"]\n')
    project.copy("buggy.py", "generated/model.py")
    project.copy("buggy.py", "src/generated/model.py")
    project.copy("buggy.py", "src/model_pb2.py")
    project.copy("clean.py", "src/ok.py")
    assert project.run("check").returncode == 0
    # A file named on the command line is checked even when excluded (ruff does the same).
    assert project.codes("src/model_pb2.py") == ALL_CODES


def test_explicit_config_file(project):
    project.write("conf/pyproject.toml", '[tool.torchls]\nselect = ["TL303"]\n')
    project.copy("buggy.py")
    assert project.codes("--config", "conf/pyproject.toml", "buggy.py") == ["TL303"]
    missing = project.run("check", "--config", "nope/pyproject.toml", "buggy.py")
    assert missing.returncode == 2
    assert "not found" in missing.stderr


def test_unknown_config_key_is_a_usage_error(project):
    project.copy("buggy.py")
    project.write("pyproject.toml", '[tool.torchls]\nselct = ["TL1"]\n')
    result = project.run("check", ".")
    assert result.returncode == 2
    assert "torchls: error:" in result.stderr
    assert "selct" in result.stderr
    assert result.stdout == ""


def test_malformed_pyproject_is_a_usage_error_not_a_silent_fallback(project):
    project.copy("buggy.py")
    project.write("pyproject.toml", '[tool.torchls]\nselect = ["TL1"\n')
    result = project.run("check", ".")
    assert result.returncode == 2
    assert "pyproject.toml: cannot read" in result.stderr
    assert result.stdout == ""


def test_wrong_config_type_is_a_usage_error(project):
    project.copy("buggy.py")
    project.write("pyproject.toml", '[tool.torchls]\nselect = "TL1"\n')
    result = project.run("check", ".")
    assert result.returncode == 2
    assert "select" in result.stderr


def test_unknown_code_in_config_is_a_warning_not_a_failure(project):
    project.copy("buggy.py")
    project.write("pyproject.toml", '[tool.torchls]\nignore = ["TL3", "TL777"]\n')
    result = project.run("check", ".")
    assert result.returncode == 1
    assert "unknown rule selector 'TL777' in [tool.torchls] ignore" in result.stderr
    assert project.codes() == ["TL101", "TL106"]


def test_noqa_with_codes_silences_only_those_codes(project):
    project.write(
        "noqa.py",
        "import torch\n"
        "a = torch.load(p)  # noqa: TL302\n"
        'b = torch.load(p, map_location="cpu", weights_only=False)  # noqa: TL302\n'
        "c = torch.load(p)  # noqa: TL101, TL302\n"
        "d = torch.load(p)  # noqa:TL303\n",
    )
    rows = project.run("check", "--output-format", "json", "noqa.py").json()
    assert [(row["code"], row["location"]["row"]) for row in rows] == [("TL303", 3), ("TL302", 5)]


def test_bare_noqa_silences_everything_on_the_line(project):
    project.write(
        "noqa.py",
        "import torch\n"
        'b = torch.load(p, map_location="cpu", weights_only=False)  # noqa\n'
        "c = torch.load(p)\n",
    )
    rows = project.run("check", "--output-format", "json", "noqa.py").json()
    assert [(row["code"], row["location"]["row"]) for row in rows] == [("TL302", 3)]
