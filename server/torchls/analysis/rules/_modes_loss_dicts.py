"""How TL206 (graph-kept-alive) reads a dict display of loss parts (`parts = {"box": box, "cls":
cls}`): which of its values an item or a loop over it reads, and which loop targets walk its keys.

Why a module of its own: it is a cohesive group of predicates that would take the rule's module
past its size limit. In: `Facts` and expressions. Out: the display, the values read, or whether a
subscript key is one of the display's fixed keys.
"""

from __future__ import annotations

import ast

from torchls.analysis.facts import Facts


def _dict_display(facts: Facts, expr: ast.expr) -> ast.Dict | None:
    """The dict display a plain local name is bound to (`parts = {"box": box, "cls": cls}`)."""
    if not isinstance(expr, ast.Name):
        return None
    value = facts.binding_value(expr)
    return value if isinstance(value, ast.Dict) else None


def _dict_iteration(facts: Facts, name: ast.Name) -> tuple[ast.Dict, str] | None:
    """(display, role) when `name` is a target of a loop over a dict display's `items()`
    (role "key" or "value"), `values()` ("value") or `keys()` / the dict itself ("key")."""
    assignment = facts.reaching_assignment(name)
    loop = assignment.loop if assignment is not None else None
    if loop is None:
        return None
    source, method = loop.iter, None
    if isinstance(source, ast.Call) and isinstance(source.func, ast.Attribute) and not source.args:
        source, method = source.func.value, source.func.attr
    display = _dict_display(facts, source)
    if display is None:
        return None
    target = loop.target
    if method == "items":
        if (
            isinstance(target, ast.Tuple)
            and len(target.elts) == 2
            and all(isinstance(e, ast.Name) for e in target.elts)
        ):
            if target.elts[1].id == name.id:  # type: ignore[attr-defined]
                return display, "value"
            if target.elts[0].id == name.id:  # type: ignore[attr-defined]
                return display, "key"
        return None
    if isinstance(target, ast.Name) and target.id == name.id:
        if method == "values":
            return display, "value"
        if method in (None, "keys"):
            return display, "key"
    return None


def _dict_parts(facts: Facts, value: ast.expr) -> list[ast.expr] | None:
    """The values of a dict display of loss parts that `value` reads: `parts["box"]` (the
    item under that key), `parts[k]` (any item), or the value target of a loop over
    `parts.items()` / `parts.values()` (any item)."""
    if isinstance(value, ast.Subscript):
        display = _dict_display(facts, value.value)
        if display is None:
            return None
        if isinstance(value.slice, ast.Constant):
            return [
                item
                for key, item in zip(display.keys, display.values, strict=True)
                if isinstance(key, ast.Constant) and key.value == value.slice.value
            ]
        return [
            item for key, item in zip(display.keys, display.values, strict=True) if key is not None
        ]
    if isinstance(value, ast.Name):
        found = _dict_iteration(facts, value)
        if found is not None and found[1] == "value":
            return [
                item
                for key, item in zip(found[0].keys, found[0].values, strict=True)
                if key is not None
            ]
    return None


def _fixed_key(facts: Facts, key: ast.expr) -> bool:
    """`key` walks the keys of a dict display (`for name, value in parts.items():
    latest[name] = value`): the same few slots, overwritten every step."""
    return isinstance(key, ast.Name) and (_dict_iteration(facts, key) or (None, ""))[1] == "key"
