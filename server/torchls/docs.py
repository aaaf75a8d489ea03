"""Rule documentation rendered from the registry: the README table, docs/rules.md, one rule.

In: the registered rules and the codes `torchls check` reports by itself (TL000, a syntax
error: `CHECKER_CODES`), ordered by code. Out: Markdown. `python -m torchls.docs --write
[ROOT]` regenerates both generated documents of a checkout (the README table between its
`rules` markers and docs/rules.md); `python -m torchls.docs` prints the README table and
`python -m torchls.docs --rules-md [PATH]` writes docs/rules.md alone. Tests keep both in sync,
and the language server's "Show documentation for TLxxx" shows `rule_markdown()` or links to
`rule_anchor()` in a published copy of docs/rules.md. `--write` also regenerates the
catalog's copy the rule tests read, tests/rules/catalog.md (`catalog_markdown()`): every code,
name, severity, summary and fix kind comes from the registry, where it is written once.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from torchls.analysis import Rule, all_rules, get_rule
from torchls.analysis.probe_rules import CHECKER_CODES, PROBE_RULES

SEVERITY_LETTER = {"error": "E", "warning": "W", "information": "I"}
RULES_MD = Path("docs") / "rules.md"
CATALOG_MD = Path("tests") / "rules" / "catalog.md"
# The families of the catalog, by the first digit of a code.
FAMILIES = {
    "1": "loss and target contracts",
    "2": "modes, gradient bookkeeping and autograd",
    "3": "checkpoints",
    "4": "optimizer, scheduler, mixed precision",
    "5": "numerics and devices",
    "6": "TensorFlow / Keras",
    "7": "PyTorch Lightning",
    "8": "torch.distributed",
    "9": "probe findings (runtime, from a bounded repro)",
}
FIX_TEXT = {
    "safe": "safe (applied by `--fix` and the editor's fix-all)",
    "unsafe": "unsafe (a quick fix you pick by hand, or `--fix --unsafe-fixes`)",
    "none": "none",
}
_FENCE = re.compile(r"^\s*(```|~~~)")


def reported_rules() -> list[Rule]:
    """Every code `torchls check` can report, ordered by code: its rules and TL000."""
    found = all_rules() + [rule for code in CHECKER_CODES if (rule := get_rule(code))]
    return sorted(found, key=lambda rule: rule.code)


def rule_table() -> str:
    """The Markdown table of every code `torchls check` reports: code, name, severity, fix,
    summary."""
    lines = ["| code | name | severity | fix | what it catches |", "|---|---|---|---|---|"]
    for rule in reported_rules():
        lines.append(
            f"| {rule.code} | {rule.name} | {SEVERITY_LETTER[rule.severity]} | {rule.fix} "
            f"| {rule.summary} |"
        )
    return "\n".join(lines)


def rule_heading(rule: Rule) -> str:
    return f"{rule.code} {rule.name}"


def rule_anchor(rule: Rule) -> str:
    """The fragment GitHub (and most Markdown renderers) give the rule's heading in rules.md."""
    slug = re.sub(r"[^\w\- ]", "", rule_heading(rule).lower())
    return slug.replace(" ", "-")


def _demote(markdown: str, levels: int) -> str:
    """Push every heading down `levels` levels, leaving code blocks alone."""
    out, fenced = [], False
    for line in markdown.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            line = "#" * levels + line
        out.append(line)
    return "\n".join(out)


def _rule_body(rule: Rule) -> str:
    silence = (
        "Always reported: no selection, configuration or `# noqa` hides it"
        if rule.code in CHECKER_CODES
        else f"Silence one line with `# noqa: {rule.code}`"
    )
    facts = (
        f"**{rule.summary}**\n\n"
        f"- Severity: {rule.severity}\n"
        f"- Fix: {FIX_TEXT[rule.fix]}\n"
        f"- {silence}; details: `torchls rule {rule.code}`\n"
    )
    return facts + "\n" + rule.doc.strip() + "\n"


def rule_markdown(rule: Rule) -> str:
    """One rule's full documentation as a standalone Markdown page."""
    return f"# {rule_heading(rule)}\n\n" + _rule_body(rule)


def rules_markdown(rules: Sequence[Rule] | None = None) -> str:
    """docs/rules.md: an index table linking to the full documentation of every code
    `torchls check` reports."""
    rules = list(reported_rules() if rules is None else rules)
    parts = [
        "<!-- Generated from the rule registry by `python -m torchls.docs --write`; "
        "do not edit by hand. -->",
        "# torchls rules",
        "Every rule torchls checks, with what it catches, why it is wrong, an example and the "
        "fix. Severity: **E** a definite bug, **W** very likely a bug, **I** advice. Select "
        "and ignore rules by code prefix (`--select TL2`, `[tool.torchls] ignore = "
        '["TL302"]`); silence one line with `# noqa: TL101`. TL000, a file that does not '
        "parse, is no rule: it is always reported.",
        "| code | name | severity | fix | what it catches |\n|---|---|---|---|---|\n"
        + "\n".join(
            f"| [{r.code}](#{rule_anchor(r)}) | {r.name} | {SEVERITY_LETTER[r.severity]} "
            f"| {r.fix} | {r.summary} |"
            for r in rules
        ),
    ]
    for rule in rules:
        parts.append(f"## {rule_heading(rule)}\n\n" + _demote(_rule_body(rule), 1).rstrip())
    return "\n\n".join(parts) + "\n"


def catalog_markdown() -> str:
    """tests/rules/catalog.md: one table row per static rule and per TL9xx probe finding
    (code, name, severity letter, summary, fix kind), grouped by family. The rule tests read
    it (so a checkout without ../shared runs them) and compare it with the public catalog."""
    rules = sorted(
        all_rules() + [r for code, r in PROBE_RULES.items() if code not in CHECKER_CODES],
        key=lambda rule: rule.code,
    )
    parts = [
        "<!-- Generated from the rule registry by `python -m torchls.docs --write`; "
        "do not edit by hand. -->",
        "# torchls rule catalog (generated copy)",
        "Every code torchls reports from a static check or a bounded repro, as the registry "
        "declares it. Codes are a public contract: a code never changes meaning once shipped. "
        "Where `../shared/rules.md` (the public catalog) sits beside the checkout, "
        "`tests/rules/test_docs.py` checks that it says the same codes, names, severities and "
        "fix kinds. Severity: E a definite bug, W very likely a bug, I advice.",
    ]
    for digit, title in FAMILIES.items():
        family = [rule for rule in rules if rule.code[2] == digit]
        if not family:
            continue
        rows = "\n".join(
            f"| {r.code} | {r.name} | {SEVERITY_LETTER[r.severity]} | {r.summary} | {r.fix} |"
            for r in family
        )
        parts.append(
            f"## TL{digit}xx: {title}\n\n| code | name | sev | summary | fix |\n"
            f"|---|---|---|---|---|\n{rows}"
        )
    return "\n\n".join(parts) + "\n"


README = Path("README.md")
_TABLE = re.compile(r"(<!-- rules:start -->\n)(.*?)(\n<!-- rules:end -->)", re.DOTALL)


def readme_with_table(readme: str) -> str:
    """`readme` with the rule table between its markers regenerated (ValueError without them)."""
    if not _TABLE.search(readme):
        raise ValueError("README.md lacks the <!-- rules:start --> / <!-- rules:end --> markers")
    return _TABLE.sub(lambda m: m.group(1) + rule_table() + m.group(3), readme, count=1)


def write_docs(root: Path) -> list[Path]:
    """Regenerate README.md's rule table, docs/rules.md and tests/rules/catalog.md under
    `root`; the files changed."""
    changed = []
    readme = root / README
    old = readme.read_text(encoding="utf-8")
    if (new := readme_with_table(old)) != old:
        readme.write_text(new, encoding="utf-8")
        changed.append(readme)
    for path, text in (
        (root / RULES_MD, rules_markdown()),
        (root / CATALOG_MD, catalog_markdown()),
    ):
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m torchls.docs",
        description="Regenerate the README rule table, docs/rules.md and the catalog's copy "
        "(--write), or print "
        "the table, or write docs/rules.md alone.",
    )
    parser.add_argument(
        "--write",
        nargs="?",
        const=".",
        metavar="ROOT",
        help="rewrite README.md's rule table, docs/rules.md and tests/rules/catalog.md in "
        "the checkout at ROOT "
        "(default: the current folder)",
    )
    parser.add_argument(
        "--rules-md",
        nargs="?",
        const=str(RULES_MD),
        metavar="PATH",
        help=f"write every rule's documentation to PATH (default: {RULES_MD})",
    )
    args = parser.parse_args(argv)
    if args.write is not None:
        try:
            changed = write_docs(Path(args.write))
        except (OSError, ValueError) as error:
            print(f"torchls.docs: error: {error}", file=sys.stderr)
            return 2
        for path in changed:
            print(f"wrote {path}", file=sys.stderr)
        if not changed:
            print(f"README.md, {RULES_MD} and {CATALOG_MD} are up to date", file=sys.stderr)
        return 0
    if args.rules_md is None:
        print(rule_table())
        return 0
    target = Path(args.rules_md)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(rules_markdown(), encoding="utf-8")
    print(f"wrote {target}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
