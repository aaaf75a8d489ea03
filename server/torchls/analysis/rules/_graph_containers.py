"""TL206's question of which names hold a container a project helper filled with a tensor
still attached to its autograd graph.

Why: a loss helper often returns `(loss, stats)`, where `stats` is a dict or a metrics
object of per-term values for logging. When one of those values is stored without
`.item()`/`.detach()` (`stats["aux"] = aux_loss`), the stats object holds that step's graph;
a caller that backward()s the loss and folds every step's stats into a running total keeps
every graph alive. The statement shapes that accumulate a value across iterations
(`acc.append(v)`, `acc += v`, `acc = acc * decay + v`, `acc[k] = v`) live here too. In: the
caller's facts, a scope and its backward()-ed names, or one statement. Out: the names bound
to such a container; the accumulator, value and form of a statement.
"""

from __future__ import annotations

import ast

from torchls.analysis.facts import Facts
from torchls.analysis.queries.tensors import detached_value
from torchls.analysis.rules._graph_returns import called_function, summed_parts


def _stores_graph(owner: Facts, function: ast.AST, container: str) -> bool:
    """`function` stores, under some key of its local `container`, a value built from a
    forward call's graph (`stats[k] = part` with `part` from `model(...)`), not detached and
    not computed with gradients disabled."""
    for node in owner.walk_local(function):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target = node.targets[0]
        if not (
            isinstance(target, ast.Subscript)
            and isinstance(target.value, ast.Name)
            and target.value.id == container
        ):
            continue
        if detached_value(node.value) or owner.in_no_grad(node):
            continue
        if owner.graph_forwards(node.value):
            return True
    return False


def _returned_container(owner: Facts, function: ast.AST, index: int) -> str | None:
    """The local name every `return a, b, ...` of `function` hands back at `index`."""
    names = set()
    for node in owner.walk_local(function):
        if isinstance(node, ast.Return):
            value = node.value
            if not isinstance(value, ast.Tuple) or len(value.elts) <= index:
                return None
            element = value.elts[index]
            if not isinstance(element, ast.Name):
                return None
            names.add(element.id)
    return names.pop() if len(names) == 1 else None


def graph_containers(facts: Facts, scope: ast.AST, backwarded: set[str]) -> set[str]:
    """Names of `scope` unpacked from a project helper's tuple (`loss, stats = helper(...)`)
    whose other element is backward()-ed here (so the helper ran with gradients on) and whose
    own element is a container the helper stored a graph tensor in, or whose parts the
    backward()-ed element was summed from (`total = sum(parts.values()); return total, parts`)."""
    found: set[str] = set()
    bindings = facts.assignments.get(scope, {})
    for name, assignments in bindings.items():
        for binding in assignments:
            call = binding.value
            if binding.index is None or not isinstance(call, ast.Call):
                continue
            target = binding.stmt.targets[0] if isinstance(binding.stmt, ast.Assign) else None
            if not isinstance(target, ast.Tuple):
                continue
            siblings = {
                i: e.id
                for i, e in enumerate(target.elts)
                if isinstance(e, ast.Name) and e.id != name
            }
            backwarded_at = [i for i, sibling in siblings.items() if sibling in backwarded]
            if not backwarded_at:
                continue
            callee = called_function(facts, call)
            if callee is None:
                continue
            owner, function = callee
            container = _returned_container(owner, function, binding.index)
            if container is None:
                continue
            # Stored into one by one, or the very parts the backward()-ed total is summed from.
            if _stores_graph(owner, function, container) or any(
                summed_parts(owner, function, container, i) for i in backwarded_at
            ):
                found.add(name)
    return found


def backwarded_names(facts: Facts, scope: ast.AST) -> set[str]:
    """Names `scope` calls a bare `backward()` on (`loss.backward()`,
    `scaler.scale(loss).backward()`)."""
    names = set()
    for node in facts.calls_in(scope):
        if facts.method_name(node) == "backward" and not node.args:
            receiver = facts.backward_subject(node)
            if isinstance(receiver, ast.Name):
                names.add(receiver.id)
    return names


def returns_graph_container(facts: Facts, call: ast.Call) -> bool:
    """`call` runs a project helper that backward()s a loss and returns (every `return` of
    it) the container of its loss parts that `graph_containers` finds: a training step handing
    its loss dict back to the epoch loop."""
    callee = called_function(facts, call)
    if callee is None:
        return False
    owner, function = callee
    backwarded = backwarded_names(owner, function)
    if not backwarded:
        return False
    held = graph_containers(owner, function, backwarded)
    returns = [n for n in owner.walk_local(function) if isinstance(n, ast.Return)]
    return bool(returns) and all(
        isinstance(n.value, ast.Name) and n.value.id in held for n in returns
    )


def _is_running(name: str, expr: ast.expr) -> bool:
    """`expr` is the running value `name`, possibly decayed: `total`, `total * 0.99`."""
    if isinstance(expr, ast.Name):
        return expr.id == name
    return (
        isinstance(expr, ast.BinOp)
        and isinstance(expr.op, (ast.Mult, ast.Div))
        and isinstance(expr.left, ast.Name)
        and expr.left.id == name
    )


def added_to(name: str, value: ast.expr) -> ast.expr | None:
    """What `name = <value>` adds to the running `name`: `v` for `name + v`, `v + name` and
    `name * decay + v`; None when `value` is no such sum."""
    if not isinstance(value, ast.BinOp) or not isinstance(value.op, ast.Add):
        return None
    if _is_running(name, value.left):
        return value.right
    if _is_running(name, value.right):
        return value.left
    return None


def accumulation(stmt: ast.stmt) -> tuple[str, ast.expr, str] | None:
    """(accumulator, value, how) for `acc.append(v)`, `acc += v`, `acc[k] = v`, `acc[k] += v`
    (an assignment to a constant key replaces the value it held: no accumulation)."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        call = stmt.value
        func = call.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "append"
            and isinstance(func.value, ast.Name)
            and len(call.args) == 1
        ):
            return func.value.id, call.args[0], "append"
    if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
        added = added_to(stmt.targets[0].id, stmt.value)  # `total = total * decay + v`
        if added is not None:
            return stmt.targets[0].id, added, "+="
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.op, ast.Add):
        if isinstance(stmt.target, ast.Name):
            return stmt.target.id, stmt.value, "+="
        if isinstance(stmt.target, ast.Subscript) and isinstance(stmt.target.value, ast.Name):
            return stmt.target.value.id, stmt.value, "[]+="
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        target = stmt.targets[0]
        if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
            if isinstance(target.slice, ast.Constant):
                return None  # `latest["d"] = d_loss`: one slot, overwritten every step
            return target.value.id, stmt.value, "[]="
    return None


def bound_names(target: ast.expr) -> list[str]:
    """The names an assignment to `target` makes hold the value: `x`, `a, b`, `x[k]` (the
    container); not `obj.attr`, whose object's other attributes hold other things."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Starred):
        return bound_names(target.value)
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for element in target.elts for name in bound_names(element)]
    if isinstance(target, ast.Subscript):
        return bound_names(target.value)
    return []
