"""TL404's hook case: gradient clipping registered as parameter hooks.

Why: some trainers clip by value during the backward pass instead of after it: a helper walks
`model.parameters()` and registers `p.register_hook(lambda grad: grad.clamp(-c, c))` on each.
Such a hook sees the gradient backward produces; when the loss goes through a GradScaler that
gradient is still multiplied by the loss scale, and no `unscale_` can come before the hook.

In: a file's `Facts`. Out: the registrations its calls make (directly, or through a project
helper in any file that registers them on the parameters of the model it is handed).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts, FunctionNode
from torchls.analysis.queries.vocabulary import argument_at

_CLAMP_METHODS = ("clamp", "clamp_", "clip", "clip_")
_CLAMP_FUNCTIONS = ("torch.clamp", "torch.clip")
_PARAMETER_METHODS = ("parameters", "named_parameters")


def clamp_hook_registrations(facts: Facts) -> Iterator[tuple[ast.Call, ast.expr, Facts, ast.Call]]:
    """(call here, the model whose parameters get the hooks, facts of the registering file,
    the `register_hook` call) for each call of this file that registers a hook clamping the
    gradient on every parameter of a model: `p.register_hook(...)` in a loop over
    `model.parameters()` here, or a project function doing that to a parameter of its own,
    with the model the call passes for it."""
    for call in facts.method_calls("register_hook"):
        model = _hooked_model(facts, call)
        if model is None:
            continue
        if isinstance(model, ast.Name) and facts.parameter_of(model) is not None:
            continue  # a helper's parameter: reported where the helper is called
        yield call, model, facts, call
    for call in facts.project_calls:
        target = facts.callee(call)
        if target is None:
            continue
        owner, function, method = target
        for register in owner.method_calls("register_hook"):
            if owner.enclosing_function(register) is not function:
                continue
            model = _hooked_model(owner, register)
            if not isinstance(model, ast.Name) or owner.parameter_of(model) is not function:
                continue
            told, argument = argument_at(call, function, model.id, method)
            if told and argument is not None:
                yield call, argument, owner, register


def _hooked_model(facts: Facts, register: ast.Call) -> ast.expr | None:
    """`model` when `register` is `p.register_hook(hook)` with `p` the target of a loop over
    `model.parameters()` (or `named_parameters()`, unpacked) and `hook` clamping the gradient
    it is given; None otherwise."""
    if len(register.args) != 1 or register.keywords:
        return None
    receiver = facts.receiver(register)
    if not isinstance(receiver, ast.Name) or not _clamps_gradient(facts, register.args[0]):
        return None
    assignment = facts.reaching_assignment(receiver)
    loop = assignment.loop if assignment is not None else None
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return None
    iterable = loop.iter
    if not isinstance(iterable, ast.Call) or facts.method_name(iterable) not in _PARAMETER_METHODS:
        return None
    if facts.method_name(iterable) == "named_parameters":
        target = loop.target
        if not (
            isinstance(target, ast.Tuple)
            and len(target.elts) == 2
            and isinstance(target.elts[1], ast.Name)
            and target.elts[1].id == receiver.id
        ):
            return None
    elif not (isinstance(loop.target, ast.Name) and loop.target.id == receiver.id):
        return None
    return facts.receiver(iterable)


def _clamps_gradient(facts: Facts, hook: ast.expr) -> bool:
    """`hook` (a lambda or an in-file function of one parameter) returns its gradient clamped
    to fixed bounds, directly or through a project function that clamps its argument. A
    hook that reads the loss scale (`get_scale`) adjusts its bounds: not counted."""
    function: ast.Lambda | FunctionNode | None = None
    if isinstance(hook, ast.Lambda):
        function = hook
    elif isinstance(hook, ast.Name):
        function = facts.functions.get(hook.id)
    if function is None:
        return False
    params = [a.arg for a in [*function.args.posonlyargs, *function.args.args]]
    if len(params) != 1:
        return False
    if any(
        isinstance(node, ast.Call) and facts.method_name(node) == "get_scale"
        for node in ast.walk(function)
    ):
        return False
    returned = _returned(function)
    return any(_clamp_of(facts, value, params[0], 0) for value in returned)


def _returned(function: ast.Lambda | FunctionNode) -> list[ast.expr]:
    if isinstance(function, ast.Lambda):
        return [function.body]
    return [
        node.value
        for node in ast.walk(function)
        if isinstance(node, ast.Return) and node.value is not None
    ]


def _clamp_of(facts: Facts, value: ast.expr, param: str, depth: int) -> bool:
    """`value` is `param` clamped: `g.clamp(lo, hi)`, `torch.clamp(g, ...)`, or a project
    function called with `g` that returns its own parameter clamped on some path and never
    hands it back unchanged."""
    if not isinstance(value, ast.Call):
        return False
    receiver = facts.receiver(value)
    if facts.method_name(value) in _CLAMP_METHODS and _is_name(receiver, param):
        return bool(value.args or value.keywords)
    if (facts.call_qualname(value) or "") in _CLAMP_FUNCTIONS:
        return bool(value.args) and _is_name(value.args[0], param)
    if depth > 1:
        return False
    target = facts.callee(value)
    if target is None:
        return False
    owner, function, method = target
    for name in [a.arg for a in [*function.args.posonlyargs, *function.args.args]]:
        told, argument = argument_at(value, function, name, method)
        if told and _is_name(argument, param):
            returned = _returned(function)
            if any(_is_name(r, name) for r in returned):
                return False
            return any(_clamp_of(owner, r, name, depth + 1) for r in returned)
    return False


def _is_name(expr: ast.AST | None, name: str) -> bool:
    return isinstance(expr, ast.Name) and expr.id == name
