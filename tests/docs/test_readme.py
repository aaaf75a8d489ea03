"""The README stays true: its rule table matches the registry and its quick start has exactly
the two commands, which exist and are executable."""

from __future__ import annotations

import os
import re
from pathlib import Path

from torchls.docs import rule_table

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_rule_table_matches_registry() -> None:
    match = re.search(r"<!-- rules:start -->\n(.*?)\n<!-- rules:end -->", README, re.DOTALL)
    assert match, "README lacks the rules markers"
    assert match.group(1).strip() == rule_table().strip(), "run `python -m torchls.docs --write`"


def test_quick_start_has_two_working_commands() -> None:
    section = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["./scripts/demo", "./scripts/test"]
    for command in commands:
        script = ROOT / command
        assert script.is_file() and os.access(script, os.X_OK)


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "./scripts/test" in ci


def test_docs_write_regenerates_the_readme_table_and_rules_md(tmp_path: Path) -> None:
    """`python -m torchls.docs --write ROOT` rewrites both generated documents in place and
    leaves the rest of the README alone; run again, it changes nothing."""
    import subprocess
    import sys

    from torchls.docs import rules_markdown

    stale = README.replace("| TL101 |", "| TL100 |", 1)
    (tmp_path / "README.md").write_text(stale, encoding="utf-8")
    command = [sys.executable, "-m", "torchls.docs", "--write", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    assert "README.md" in done.stderr and "rules.md" in done.stderr
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == README
    assert (tmp_path / "docs" / "rules.md").read_text(encoding="utf-8") == rules_markdown()
    again = subprocess.run(command, capture_output=True, text=True, check=True)
    assert "up to date" in again.stderr


def test_readme_github_annotation_example_is_what_the_command_prints() -> None:
    import subprocess
    import sys

    match = re.search(
        r"`(torchls check --output-format github [^`]+)` starts with\s+`([^`]+)`", README
    )
    assert match, "README lacks the GitHub annotation example"
    command, example = match.group(1).split()[1:], match.group(2)
    done = subprocess.run(
        [sys.executable, "-m", "torchls", *command], cwd=ROOT, capture_output=True, text=True
    )
    assert done.stdout.splitlines()[0].startswith(example.removesuffix("…").rstrip())
