"""TL206's questions about what a project callable hands back: which function a call runs
(also an object's `__call__`, the object built by a project class or a factory returning
one), and whether a helper returns a container of loss parts still attached to the graph.

Why: a training step often gets its loss parts from a loss object (`self.loss_fn(...)`,
built by a factory in another file) as `(total, parts)`, backward()s `total` and returns
`parts` to an epoch loop that sums every batch's parts. `total` being computed from `parts`
and backward()-ed shows that `parts` holds the graph, whatever the names. In: the caller's
facts and a call (or a helper function and its backward()-ed names). Out: the callee, or the
answer to whether a result keeps a graph.
"""

from __future__ import annotations

import ast

from torchls.analysis.facts import Facts, FunctionNode
from torchls.analysis.queries.tensors import detached_value

MAX_STEPS = 3


def _class_built_by(
    facts: Facts, value: ast.expr | None, depth: int = 0
) -> tuple[Facts, ast.AST] | None:
    """(facts, class node) of the project class whose instance `value` is: a construction
    (`Loss(cfg)`, in this file or imported) or a project factory whose every return is one
    (`create_loss(cfg)` returning `Loss(cfg)` or a name bound to it)."""
    if depth > MAX_STEPS:
        return None
    if isinstance(value, ast.Name):
        value = facts.binding_value(value)
    if not isinstance(value, ast.Call) or not isinstance(value.func, ast.Name):
        return None
    name = value.func.id
    if name in facts.classes:
        return facts, facts.classes[name].node
    definition = facts.definition(name)
    if definition is not None:
        if isinstance(definition.node, ast.ClassDef):
            return definition.facts, definition.node
        return _factory_class(definition.facts, definition.node, depth)
    if name in facts.functions:
        return _factory_class(facts, facts.functions[name], depth)
    return None


def _factory_class(owner: Facts, function: ast.AST, depth: int) -> tuple[Facts, ast.AST] | None:
    found: list[tuple[Facts, ast.AST]] = []
    for node in owner.walk_local(function):
        if isinstance(node, ast.Return):
            built = _class_built_by(owner, node.value, depth + 1)
            if built is None:
                return None
            found.append(built)
    if not found or any(klass is not found[0][1] for _, klass in found):
        return None
    return found[0]


def called_function(facts: Facts, call: ast.Call) -> tuple[Facts, FunctionNode] | None:
    """(facts of its file, function) that `call` runs: a project callee, or the `__call__`
    of an object built from a project class (`self.loss_fn(...)` after `self.loss_fn =
    create_loss(cfg)`)."""
    target = facts.callee(call)
    if target is not None:
        return target[0], target[1]
    func = call.func
    if not isinstance(func, (ast.Name, ast.Attribute)):
        return None
    built = _class_built_by(facts, facts.binding_value(func))
    if built is None:
        return None
    owner, klass = built
    info = owner.classes.get(klass.name)  # type: ignore[attr-defined]
    method = info.methods.get("__call__") if info is not None else None
    return (owner, method) if method is not None else None


def _dict_display(owner: Facts, function: ast.AST, name: str) -> ast.Dict | None:
    """The dict display `name` is bound to, once, in `function`, every value of it a
    tensor expression (no constant, nothing detached)."""
    bindings = owner.assignments.get(function, {}).get(name, [])
    if len(bindings) != 1 or bindings[0].index is not None:
        return None
    display = bindings[0].value
    if not isinstance(display, ast.Dict) or not display.values:
        return None
    if any(
        key is None or isinstance(value, ast.Constant) or detached_value(value)
        for key, value in zip(display.keys, display.values, strict=True)
    ):
        return None
    return display


def summed_parts(owner: Facts, function: ast.AST, container: str, total_index: int) -> bool:
    """Every `return ...` of `function` hands back, at `total_index`, a name computed from the
    dict display `container` (`total = sum(parts.values())`; `return total, parts`): when the
    caller backward()s that total, the parts it was built from hold the graph."""
    if _dict_display(owner, function, container) is None:
        return False
    returns = [n for n in owner.walk_local(function) if isinstance(n, ast.Return)]
    if not returns:
        return False
    for node in returns:
        value = node.value
        if not isinstance(value, ast.Tuple) or len(value.elts) <= total_index:
            return False
        total = value.elts[total_index]
        if not isinstance(total, ast.Name) or total.id == container:
            return False
        bindings = owner.assignments.get(function, {}).get(total.id, [])
        if len(bindings) != 1 or bindings[0].value is None or bindings[0].index is not None:
            return False
        made = bindings[0].value
        if detached_value(made) or not any(
            isinstance(n, ast.Name) and n.id == container for n in ast.walk(made)
        ):
            return False
    return True


def iterated_container(facts: Facts, name: ast.Name) -> ast.Name | None:
    """The container whose values the loop target `name` walks: `parts` for the value of
    `for key, part in parts.items()` or for `for part in parts.values()`."""
    assignment = facts.reaching_assignment(name)
    loop = assignment.loop if assignment is not None else None
    if loop is None:
        return None
    source = loop.iter
    if not (
        isinstance(source, ast.Call)
        and isinstance(source.func, ast.Attribute)
        and isinstance(source.func.value, ast.Name)
        and not source.args
    ):
        return None
    target = loop.target
    if source.func.attr == "items":
        if (
            isinstance(target, ast.Tuple)
            and len(target.elts) == 2
            and isinstance(target.elts[1], ast.Name)
            and target.elts[1].id == name.id
        ):
            return source.func.value
        return None
    if source.func.attr == "values" and isinstance(target, ast.Name) and target.id == name.id:
        return source.func.value
    return None
