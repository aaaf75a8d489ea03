"""TL206 through the object's own attributes: a trainer method that runs once per step keeps
the step's loss in a list (or dict, or running total) on `self` that outlives the step, either
directly (`self.losses.append(loss)` after `loss.backward()`) or through another attribute a
sibling method stored it in (`self.last = loss` in the step, `self.history.append(self.last)`
in the logging method the step calls).

In: `Facts` and two callbacks of the rule (the loss names of a scope, whether a name reaching a
use holds a detached value). Out: `Hit`s at the accumulating statement.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.findings import Related
from torchls.analysis.queries.vocabulary import ClassInfo
from torchls.analysis.registry import Hit, exemption
from torchls.analysis.rules._graph_collectors import _self_attr


def _on(node: ast.AST) -> str | None:
    """`x` for `self.x`."""
    return _self_attr(node, "self")


Loop = ast.For | ast.AsyncFor | ast.While
EMPTY_BUILDERS = {"list", "dict", "deque", "defaultdict", "OrderedDict"}


def _self_accumulation(stmt: ast.AST) -> tuple[str, ast.expr, str] | None:
    """(attr, value, how) for `self.attr.append(v)`, `self.attr += v`, `self.attr[k] = v`
    under a key that moves (a constant key is one slot, overwritten each time)."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        call = stmt.value
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr == "append" and len(call.args) == 1:
            attr = _on(func.value)
            if attr is not None:
                return attr, call.args[0], "append"
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.op, ast.Add):
        attr = _on(stmt.target)
        if attr is not None:
            return attr, stmt.value, "+="
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        target = stmt.targets[0]
        if isinstance(target, ast.Subscript) and not isinstance(target.slice, ast.Constant):
            attr = _on(target.value)
            if attr is not None:
                return attr, stmt.value, "[]="
    return None


def _runs_per_step(facts: Facts, info: ClassInfo) -> dict[ast.AST, Loop]:
    """The methods of the class that run once per iteration of a loop: called as
    `self.m(...)` inside a loop of one of its methods (not under `no_grad`), or called by
    such a method; each with the loop that repeats it."""
    by_node = {id(m): m for m in info.methods.values()}
    callers: dict[int, list[tuple[ast.Call, ast.AST]]] = {}
    for method in info.methods.values():
        for call in facts.calls_in(method):
            func = call.func
            if not isinstance(func, ast.Attribute) or _on(func) is None:
                continue
            target = info.methods.get(func.attr)
            if target is not None and target is not method:
                callers.setdefault(id(target), []).append((call, method))
    per_step: dict[ast.AST, Loop] = {}
    changed = True
    while changed:
        changed = False
        for key, sites in callers.items():
            method = by_node[key]
            if method in per_step:
                continue
            for call, caller in sites:
                if facts.in_no_grad(call):
                    continue
                loops = facts.enclosing_loops(call)
                loop = loops[0] if loops else per_step.get(caller)
                if loop is not None:
                    per_step[method] = loop
                    changed = True
                    break
    return per_step


@exemption("TL206", "neg_self_losses_summed_for_backward.py")
def _emptied_per_step(
    facts: Facts, info: ClassInfo, attr: str, method: ast.AST, per_step: dict
) -> bool:
    """A method that runs every step (the accumulating one included) empties `self.attr`
    (rebinds it or `.clear()`s it): a hand-written gradient accumulation that sums the kept
    losses, backward()s them and starts a new list, or a per-step scratch list."""
    return any(m in per_step or m is method for m in _resets(facts, info, attr))


def _resets(facts: Facts, info: ClassInfo, attr: str) -> list[ast.AST]:
    """The methods that empty `self.attr` (rebind it, or `.clear()` it)."""
    found: list[ast.AST] = []
    for method in info.methods.values():
        for node in facts.walk_local(method):
            if (isinstance(node, ast.Assign) and any(_on(t) == attr for t in node.targets)) or (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "clear"
                and _on(node.func.value) == attr
            ):
                found.append(method)
                break
    return found


def _fresh_container(facts: Facts, info: ClassInfo, attr: str) -> bool:
    """`self.attr` is only ever bound to an empty list/dict (or a zero total) by the class."""
    values = info.attributes.get(attr)
    if not values:
        return False
    for value in values:
        if isinstance(value, (ast.List, ast.Dict)) and not _is_display(value):
            continue  # `[]`, `{}`
        if isinstance(value, ast.Constant) and value.value == 0:
            continue
        if (
            isinstance(value, ast.Call)
            and isinstance(value.func, (ast.Name, ast.Attribute))
            and (value.func.id if isinstance(value.func, ast.Name) else value.func.attr)
            in EMPTY_BUILDERS
            and not value.args[1:]
            and not (value.args and _is_display(value.args[0]))
        ):
            continue
        return False
    return True


def _is_display(node: ast.AST) -> bool:
    return isinstance(node, (ast.List, ast.Tuple, ast.Dict, ast.Set)) and bool(
        getattr(node, "elts", None) or getattr(node, "keys", None)
    )


def _kept_loss(
    facts: Facts,
    info: ClassInfo,
    method: ast.AST,
    value: ast.expr,
    loss_names_of: Callable[[ast.AST], set[str]],
    detached: Callable[[ast.Name], bool],
) -> tuple[str, ast.AST | None] | None:
    """(label, where it was stored) when `value` is a loss tensor still on its graph: a
    loss name of `method`, or `self.other` that a method stores such a name in."""
    if isinstance(value, ast.Name):
        if value.id in loss_names_of(method) and not detached(value):
            return value.id, None
        return None
    other = _on(value)
    if other is None:
        return None
    stores = [
        stored
        for stored in info.attributes.get(other, [])
        if not (isinstance(stored, ast.Constant) and stored.value is None)
    ]
    for stored in stores:
        if not isinstance(stored, ast.Name):
            return None
        scope = facts.scope(stored)
        if scope is None or stored.id not in loss_names_of(scope) or detached(stored):
            return None
        if facts.in_no_grad(stored):
            return None
    if not stores:
        return None
    return f"self.{other}", stores[0]


def self_attribute_keeps(
    facts: Facts,
    loss_names_of: Callable[[ast.AST], set[str]],
    detached: Callable[[ast.Name], bool],
) -> Iterator[Hit]:
    """A hit for each statement of a per-step method that adds a loss still on its graph
    to a container on `self` that no per-step method empties."""
    for info in facts.classes.values():
        per_step: dict[ast.AST, Loop] | None = None
        for method in info.methods.values():
            for node in facts.walk_local(method):
                found = _self_accumulation(node)
                if found is None:
                    continue
                if per_step is None:
                    per_step = _runs_per_step(facts, info)
                attr, value, _how = found
                if method not in per_step or facts.in_no_grad(node):
                    continue
                kept = _kept_loss(facts, info, method, value, loss_names_of, detached)
                if kept is None or not _fresh_container(facts, info, attr):
                    continue
                if _emptied_per_step(facts, info, attr, method, per_step):
                    continue
                label, stored = kept
                related = (
                    (Related(facts.source.span(stored), f"the loss stored in `{label}` here"),)
                    if stored is not None
                    else ()
                )
                yield Hit(
                    node,
                    f"`{label}` is a loss still attached to its autograd graph and this "
                    f"method, run once per iteration (line {per_step[method].lineno}), keeps "
                    f"it in `self.{attr}`, which outlives the step: every step's graph stays "
                    f"alive; store `{label}.item()` or `{label}.detach()` instead",
                    None,
                    related,
                )
