"""Rule documentation rendered from the registry (the README table, later docs/rules.md).

In: the registered rules. Out: Markdown. `python -m torchls.docs` prints the README table so
it can be pasted between the README's `rules` markers; a test keeps the two in sync.
"""

from __future__ import annotations

from torchls.analysis import all_rules

SEVERITY_LETTER = {"error": "E", "warning": "W", "information": "I"}


def rule_table() -> str:
    """The Markdown table of every rule: code, name, severity, fix, summary."""
    lines = ["| code | name | severity | fix | what it catches |", "|---|---|---|---|---|"]
    for rule in all_rules():
        lines.append(
            f"| {rule.code} | {rule.name} | {SEVERITY_LETTER[rule.severity]} | {rule.fix} "
            f"| {rule.summary} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(rule_table())
