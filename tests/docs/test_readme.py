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
    assert match.group(1).strip() == rule_table().strip(), "run `python -m torchls.docs`"


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
