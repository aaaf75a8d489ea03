"""TL202's questions about a forward that runs through a method of the model's class: a loop
that put the model in eval() hands each batch to a helper that calls `model.predict_step(x)`,
a method of the project's model class (in this file or another) that runs the model's own
forward (`self(x)`, maybe a few of its methods down).

Why a module of its own: `_modes.py` is at its size limit, and the mode analysis only knows a
forward as `model(x)` or `model.forward(x)`; the method's body lives with the model's class,
often in another file.
In: `Facts` and nodes. Out: (site, loop, key, method call) for each such loop.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts, FunctionNode
from torchls.analysis.rules._modes import (
    _function_trains,
    _handles_optimizer,
    _on_training_path,
    modes_of,
)

Through = tuple[ast.Call, ast.AST, str, ast.Call, Facts, ast.Call]


def eval_loops_through_model_methods(facts: Facts) -> Iterator[Through]:
    """(site, loop, key, method call, facts of the class's file, forward there): `site`
    sits in a loop of a function that never trains and is run on no training path, and
    hands the model `key` over while it is in eval mode on every path there
    (`self._predict(self.model, batch)` after `self.model.eval()`), along with something
    the loop fetched this iteration; the helper it calls runs, on the parameter receiving
    the model, a method of the model's class that reaches the model's own forward
    (`model.predict_step(inputs)`, whose body calls `self(inputs)`)."""
    analysis = modes_of(facts)
    seen: set[tuple[int, str]] = set()
    ordered = sorted(analysis.at_site.items(), key=lambda i: (i[0].lineno, i[0].col_offset))
    for site, held in ordered:
        helper = facts.called_function(site)
        loops = facts.enclosing_loops(site)
        function = facts.enclosing_function(site)
        if helper is None or not loops or function is None or helper is function:
            continue
        loop = loops[0]
        if _function_trains(facts, function) or _function_trains(facts, helper):
            continue
        if facts.node_reaches(loop, facts.is_backward) or _handles_optimizer(facts, loop):
            continue
        for position, argument in enumerate(site.args):
            key = facts.key(argument)
            modes = held.get(key) if key is not None else None
            if not modes or any(fact.mode != "eval" for fact in modes):
                continue
            if (id(loop), key) in seen or not _fetched_in_loop(facts, loop, site, argument):
                continue
            param = _parameter_at(helper, site, position)
            if param is None:
                continue
            found = _forward_method_call(facts, helper, param, argument)
            if found is None or _on_training_path(facts, function):
                continue
            seen.add((id(loop), key))  # type: ignore[arg-type]
            yield site, loop, key, *found  # type: ignore[misc]


def _parameter_at(helper: FunctionNode, site: ast.Call, position: int) -> str | None:
    """The name of the helper's parameter that receives the site's positional `position`."""
    params = [a.arg for a in [*helper.args.posonlyargs, *helper.args.args]]
    if params and params[0] == "self" and isinstance(site.func, ast.Attribute):
        params = params[1:]
    if any(isinstance(a, ast.Starred) for a in site.args[: position + 1]):
        return None
    return params[position] if position < len(params) else None


def _fetched_in_loop(facts: Facts, loop: ast.AST, site: ast.Call, model: ast.expr) -> bool:
    """Another argument of `site` is a loop target, or a name the loop body binds before it
    (`batch = batcher.next_batch()`): the site runs on fresh data every iteration."""
    bound: set[str] = set()
    if isinstance(loop, (ast.For, ast.AsyncFor)):
        bound |= {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    for node in ast.walk(loop):
        if isinstance(node, ast.Assign) and (node.lineno, node.col_offset) < (
            site.lineno,
            site.col_offset,
        ):
            if facts.scope(node) is facts.scope(site) and isinstance(node.value, ast.Call):
                targets = [n for t in node.targets for n in ast.walk(t)]
                bound |= {n.id for n in targets if isinstance(n, ast.Name)}
    others = [a for a in [*site.args, *(k.value for k in site.keywords)] if a is not model]
    return any(isinstance(n, ast.Name) and n.id in bound for a in others for n in ast.walk(a))


def _forward_method_call(
    facts: Facts, helper: FunctionNode, param: str, argument: ast.expr
) -> tuple[ast.Call, Facts, ast.Call] | None:
    """In `helper`, the call `param.method(...)` of a method that `param`'s class defines
    (its annotation, else the project class the site's `argument` was built from, here or
    in another project file) and that reaches the class's own forward; the parameter is
    not rebound in the helper, and nothing there turns gradients off."""
    if facts.grad_disabling_decorator(helper) or helper.decorator_list:
        return None
    annotation = next(
        (a.annotation for a in [*helper.args.posonlyargs, *helper.args.args] if a.arg == param),
        None,
    )
    found = None
    if isinstance(annotation, ast.Name):
        found = _class_methods(facts, annotation.id)
    elif annotation is None:
        kind = facts.kind_of(argument)
        built = kind.node if kind is not None and not kind.by_name else None
        module = facts.module_class_of_call(built) if isinstance(built, ast.Call) else None
        found = (module[0], module[1].methods) if module is not None else None
    if found is None:
        return None
    owner, methods = found
    for call in facts.calls_in(helper):
        func = call.func
        if not (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == param
            and func.attr in methods
        ):
            continue
        if facts.in_no_grad(call) or any(
            isinstance(n, ast.Name) and n.id == param and isinstance(n.ctx, ast.Store)
            for n in facts.walk_local(helper)
        ):
            return None
        forward = _reaches_own_forward(owner, methods, methods[func.attr], 0)
        if forward is not None:
            return call, owner, forward
    return None


def _class_methods(facts: Facts, name: str) -> tuple[Facts, dict[str, FunctionNode]] | None:
    """The facts of the file defining class `name` (this one or the project file it is
    imported from) and the class's methods."""
    info = facts.classes.get(name)
    if info is not None:
        return facts, info.methods
    definition = facts.definition(name)
    if definition is None or not isinstance(definition.node, ast.ClassDef):
        return None
    other = definition.facts.classes.get(definition.node.name)
    return (definition.facts, other.methods) if other is not None else None


def _reaches_own_forward(
    owner: Facts, methods: dict[str, FunctionNode], method: FunctionNode, depth: int
) -> ast.Call | None:
    """`method` calls `self(...)` or `self.forward(...)` (the call found), directly or
    through further methods of the class (a few levels), with no grad-disabling decorator
    or block on the way (a method that turns gradients off itself needs no `no_grad` from
    its caller)."""
    if depth > 3 or method.decorator_list:
        return None
    for call in owner.calls_in(method):
        func = call.func
        on_self = isinstance(func, ast.Name) and func.id == "self"
        named = (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "self"
        )
        if not (on_self or named) or owner.in_no_grad(call):
            continue
        if on_self or func.attr == "forward":  # type: ignore[attr-defined]
            return call
        other = methods.get(func.attr)  # type: ignore[attr-defined]
        if other is not None and other is not method:
            found = _reaches_own_forward(owner, methods, other, depth + 1)
            if found is not None:
                return found
    return None
