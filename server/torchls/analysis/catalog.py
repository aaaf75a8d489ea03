"""The catalog of every code torchls can emit: the static rules (registered by importing the
`rules` package) and the TL9xx findings of the repro (`probe_rules`).

Why a module of its own: the registry is what rule modules import to register themselves, so
it must not import them back; this module sits above both, and the one import that loads every
rule is here, at the top, not inside a function.
In: the registry, filled by the rules package. Out: rules by code or name, ordered by code.
"""

from __future__ import annotations

import torchls.analysis.rules  # noqa: F401  (importing the package registers every rule)
from torchls.analysis.probe_rules import PROBE_RULES
from torchls.analysis.registry import RULES, Rule


def all_rules() -> list[Rule]:
    """Every registered rule, ordered by code."""
    return [RULES[code] for code in sorted(RULES)]


def get_rule(code: str) -> Rule | None:
    """The rule registered under `code`, or the documentation of a TL9xx probe finding."""
    return RULES.get(code.upper()) or PROBE_RULES.get(code.upper())


def documented_rules() -> list[Rule]:
    """Every code torchls can emit, ordered by code: the static rules and the TL9xx findings
    of the repro (`torchls rule` and its name lookup cover all of them)."""
    found = {rule.code: rule for rule in all_rules()} | PROBE_RULES
    return [found[code] for code in sorted(found)]


def rule_by_name(name: str) -> Rule | None:
    """The rule (static or repro) whose kebab-case name is `name`."""
    wanted = name.strip().lower()
    return next((rule for rule in documented_rules() if rule.name == wanted), None)
