"""TL206's question of which names hold what a backward()-ed loss was made from.

`loss = sum(parts) if isinstance(parts, tuple) else parts; loss.backward()` shows that `parts`
(a helper's result: one loss tensor or a tuple of them) is attached to the graph too, so keeping
`parts` across steps keeps every step's graph. In: a scope's facts and its backward()-ed names.
Out: the names of the values those losses were made from.
"""

from __future__ import annotations

import ast

from torchls.analysis.facts import Facts
from torchls.analysis.queries.tensors import detached_value


def _made_from(value: ast.expr) -> list[str]:
    """The names `value` hands on whole or sums up: `parts`, `sum(parts)`, and both arms of
    `a if c else b`. Arithmetic with other operands (`ce + weight`) is left out: an operand
    may be a Python number."""
    if isinstance(value, ast.Name):
        return [value.id]
    if isinstance(value, ast.IfExp):
        return _made_from(value.body) + _made_from(value.orelse)
    if (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id == "sum"
        and len(value.args) == 1
        and not value.keywords
        and isinstance(value.args[0], ast.Name)
    ):
        return [value.args[0].id]
    return []


def graph_sources(facts: Facts, scope: ast.AST, backwarded: set[str]) -> set[str]:
    """Names of `scope` bound to a call's result (not detached) that a backward()-ed name of
    `backwarded` was assigned from as a whole or as a `sum(...)` (see `_made_from`)."""
    bindings = facts.assignments.get(scope, {})
    found: set[str] = set()
    for name in backwarded:
        for binding in bindings.get(name, ()):
            stmt = binding.stmt
            if (
                not isinstance(stmt, ast.Assign)
                or binding.value is None
                or binding.index is not None
            ):
                continue
            for source in _made_from(binding.value):
                if source == name or source in backwarded:
                    continue
                made = bindings.get(source, ())
                # One binding only: a second one may be a detached copy
                # (`parts = tuple(p.detach() for p in parts)`).
                if (
                    len(made) == 1
                    and isinstance(made[0].stmt, ast.Assign)
                    and made[0].index is None
                    and isinstance(made[0].value, ast.Call)
                    and not detached_value(made[0].value)
                    and not (facts.call_qualname(made[0].value) or "").startswith("torch.")
                ):
                    found.add(source)
    return found
