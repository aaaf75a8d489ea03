"""Helpers shared by the TL3xx checkpoint rules (one module per rule, `tl30x_*.py`).

Why: several of those rules look at the same calls (`torch.save` / `torch.load`), read the same
keyword arguments and collect the values a checkpoint dict stores; they live here once.
In: `Facts` and call nodes. Out: call names, keywords and the stored values, as AST nodes.
"""

from __future__ import annotations

import ast

from torchls.analysis.facts import Facts

SAVE = ("torch.save",)
LOAD = ("torch.load",)


def _keyword(call: ast.Call, name: str) -> ast.keyword | None:
    return next((k for k in call.keywords if k.arg == name), None)


def _dict_values(facts: Facts, expr: ast.expr) -> list[ast.expr]:
    """Values stored in the checkpoint dict: a dict literal / `dict(...)`, directly or through a
    local name, plus later `ckpt["key"] = value` assignments to that name."""
    values: list[ast.expr] = []
    literal = facts.binding_value(expr) if isinstance(expr, ast.Name) else expr
    if isinstance(literal, ast.Dict):
        values.extend(v for v in literal.values if v is not None)
    elif isinstance(literal, ast.Call) and isinstance(literal.func, ast.Name):
        if literal.func.id == "dict":
            values.extend(k.value for k in literal.keywords)
    if isinstance(expr, ast.Name):
        scope = facts.scope(expr)
        for node in facts.walk_local(scope):
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Subscript)
                and isinstance(node.targets[0].value, ast.Name)
                and node.targets[0].value.id == expr.id
                and node.lineno < expr.lineno
            ):
                values.append(node.value)
    return values
