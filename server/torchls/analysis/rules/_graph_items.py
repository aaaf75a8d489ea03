"""TL206's question of which stores fill a new slot, every step, of a container whose slots
hold losses that are backward()-ed.

Why: `losses[step - 1].backward()` inside a step loop shows that the items of `losses` are
tensors attached to the autograd graph, whatever produced them (an optimizer's `step` handing
back a closure's loss, a tuple unpacked from a helper). A store under a moving key
(`losses[step], stats[step] = optimizer.step(closure)`) then keeps one more graph-attached
tensor per step in a container made before the loop, while the backward() of one item is
no use of the container as a whole (which `feeds_backward` lets pass). In: a scope's facts and
the backward()-ed items of its containers. Out: the storing statements and the containers.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.queries.tensors import detached_value
from torchls.analysis.rules._graph_loops import outlives_a_step
from torchls.analysis.rules._modes_loss_dicts import _fixed_key


def _moving_key(facts: Facts, key: ast.expr) -> bool:
    """A key that names a new slot per step (`step`, `i + 1`): no constant, no walk over a
    dict's few keys, no ring buffer (`i % 2`)."""
    if isinstance(key, ast.Constant) or _fixed_key(facts, key):
        return False
    return not any(
        isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) for node in ast.walk(key)
    )


def _stores(stmt: ast.Assign) -> Iterator[tuple[ast.Subscript, ast.expr]]:
    """(target `c[k]`, value stored there) of `c[k] = v` and of each `c[k]` in an unpacked
    target (`c[k], d[k] = ...`; the element of a tuple display, else the whole value)."""
    for target in stmt.targets:
        unpacked = isinstance(target, (ast.Tuple, ast.List))
        elements = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
        paired = (
            unpacked
            and isinstance(stmt.value, (ast.Tuple, ast.List))
            and len(stmt.value.elts) == len(elements)
        )
        for i, element in enumerate(elements):
            if isinstance(element, ast.Subscript) and isinstance(element.value, ast.Name):
                value = stmt.value.elts[i] if paired else stmt.value  # type: ignore[attr-defined]
                yield element, value


def slot_stores(
    facts: Facts, scope: ast.AST, items: dict[str, list[ast.Subscript]]
) -> Iterator[tuple[ast.Assign, str]]:
    """(statement, container) for each store under a moving key into a container of `items`
    (container name → its items that are backward()-ed), inside a step loop that also
    backward()s one of those items, the container made outside that loop; not a detached
    value nor a store with gradients off."""
    for stmt in facts.walk_local(scope):
        if not isinstance(stmt, ast.Assign) or facts.in_no_grad(stmt):
            continue
        for target, value in _stores(stmt):
            container = target.value.id  # type: ignore[attr-defined]
            backwarded = items.get(container)
            if not backwarded or not _moving_key(facts, target.slice):
                continue
            if detached_value(value) or isinstance(value, ast.Constant):
                continue
            loops = [
                loop
                for loop in facts.enclosing_loops(stmt)
                if any(facts.is_inside(item, loop) for item in backwarded)
            ]
            made = [a for a in facts.assignments_of(container, scope) if a.stmt is not stmt]  # type: ignore[arg-type]
            if loops and made and outlives_a_step(facts, loops, made):
                yield stmt, container
                break
