"""docs/rules.md stays generated from the registry, its links work, and the README links to it.

It documents every code `torchls check` reports: the registry's rules and TL000, the syntax
error the checker reports by itself.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from torchls.analysis import all_rules, get_rule
from torchls.docs import reported_rules, rule_anchor, rule_markdown, rules_markdown

ROOT = Path(__file__).resolve().parents[2]
RULES_MD = ROOT / "docs" / "rules.md"
FENCE = re.compile(r"^\s*(```|~~~)")


def headings(markdown: str) -> list[str]:
    """Heading lines outside code blocks."""
    out, fenced = [], False
    for line in markdown.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            out.append(line)
    return out


def github_anchor(heading: str) -> str:
    """The fragment GitHub gives a heading: lower case, punctuation dropped, spaces to '-'."""
    text = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def test_rules_md_is_generated_from_the_registry():
    assert RULES_MD.is_file(), "run `python -m torchls.docs --write`"
    assert RULES_MD.read_text(encoding="utf-8") == rules_markdown(), (
        "docs/rules.md is out of date: run `python -m torchls.docs --write`"
    )


def test_generator_command_writes_the_same_file(tmp_path: Path):
    target = tmp_path / "out" / "rules.md"
    subprocess.run(
        [sys.executable, "-m", "torchls.docs", "--rules-md", str(target)],
        check=True,
        capture_output=True,
    )
    assert target.read_text(encoding="utf-8") == rules_markdown()


def test_every_rule_has_one_section_with_its_full_doc():
    text = rules_markdown()
    lines = headings(text)
    assert lines[0] == "# torchls rules"
    rule_headings = [line for line in lines if line.startswith("## ")]
    assert rule_headings == [f"## {rule.code} {rule.name}" for rule in reported_rules()]
    # The docs' own sections sit one level below their rule, never beside it.
    assert all(line.startswith(("# ", "## ", "### ", "#### ")) for line in lines)
    for rule in reported_rules():
        section = text.split(f"## {rule.code} {rule.name}\n", 1)[1].split("\n## ", 1)[0]
        assert rule.summary in section
        for part in ("What it catches", "Why it is wrong", "Example", "Fix"):
            assert f"### {part}" in section, (rule.code, part)
        assert "```python" in section


def test_index_links_reach_the_rule_sections():
    text = rules_markdown()
    anchors = {github_anchor(line) for line in headings(text)}
    links = re.findall(r"\]\(#([^)]+)\)", text)
    assert len(links) == len(reported_rules())
    assert set(links) <= anchors
    assert [rule_anchor(rule) for rule in reported_rules()] == links


def test_reported_codes_are_the_rules_and_the_syntax_error():
    assert [rule.code for rule in reported_rules()] == ["TL000"] + [r.code for r in all_rules()]


def test_single_rule_page_is_standalone_markdown():
    rule = all_rules()[0]
    page = rule_markdown(rule)
    assert page.startswith(f"# {rule.code} {rule.name}\n")
    assert rule.doc.strip() in page
    assert f"# noqa: {rule.code}" in page


def test_the_syntax_error_page_offers_no_way_to_silence_it():
    page = rule_markdown(get_rule("TL000"))
    assert page.startswith("# TL000 syntax-error\n")
    assert "# noqa: TL000" not in page
    assert "- Always reported: no selection, configuration or `# noqa` hides it;" in page


def test_readme_links_to_rules_md_next_to_the_rule_table():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Rules\n", 1)[1].split("\n## ", 1)[0]
    assert "(docs/rules.md)" in section
    assert "<!-- rules:start -->" in section
