"""TL204's question about a backward-and-step handed in as a callable: a batch loop calls
`backprop(loss)`, `backprop` is a parameter of its function, and every callable the function's
callers pass for it (a method of the class or of a base class in another project file:
`self._train_epoch_impl(progress, ctx, self._backprop)`) backwards and steps an optimizer
without clearing gradients; the loop clears none either.

Why a module of its own: the callers are found through the object model (the function may be
bound to an attribute, `self._epoch = self._epoch_unsupervised`, and called through it by a
base class elsewhere), which TL204's loop-wide check has no need of.
In: `Facts`. Out: (call, loop, callable's facts, callable) for each such call.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from typing import cast

from torchls.analysis.facts import Facts, FunctionNode
from torchls.analysis.objects import ClassRef, ObjectModel
from torchls.analysis.rules._modes_memos import GradientClearings

Handed = tuple[ast.Call, ast.stmt, Facts, FunctionNode]


def loops_through_handed_backprop(facts: Facts) -> Iterator[Handed]:
    """(call, loop, owner, callable): see the module docstring. Quiet as soon as one caller
    passes something that cannot be read, or that clears gradients itself."""
    for function in facts.scope_nodes:
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        params = [a.arg for a in [*function.args.posonlyargs, *function.args.args]]
        for call in facts.calls_in(function):
            func = call.func
            loops = facts.enclosing_loops(call)
            if not isinstance(func, ast.Name) or func.id not in params or not loops:
                continue
            if facts.scope(call) is not function or _clears(facts, loops[0]):
                continue
            if any(
                isinstance(n, ast.Name) and n.id == func.id and isinstance(n.ctx, ast.Store)
                for n in facts.walk_local(function)
            ):
                continue  # rebound in the function: not what the callers pass
            passed = _passed_callables(facts, function, func.id)
            if passed and all(_steps_without_clearing(owner, f) for owner, f in passed):
                yield call, cast(ast.stmt, loops[0]), *passed[0]
                break  # one finding per function is enough


def _clears(facts: Facts, node: ast.AST) -> bool:
    if facts.get(GradientClearings).inside(node):
        return True
    return facts.node_reaches(node, lambda c: facts.is_zero_grad(c) or facts.clears_gradients(c))


def _steps_without_clearing(owner: Facts, function: FunctionNode) -> bool:
    """`function` backwards and steps an optimizer (itself or through what it calls), and
    clears no gradients."""
    return (
        owner.node_reaches(function, owner.accumulates_grad)
        and owner.node_reaches(function, lambda c: owner.optimizer_of_step(c) is not None)
        and not _clears(owner, function)
    )


def _passed_callables(
    facts: Facts, function: FunctionNode, param: str
) -> list[tuple[Facts, FunctionNode]]:
    """What every call of `function` passes for `param`, as functions with their files: the
    in-file call sites of a plain function, or, for a method, the calls of `self.<name>(...)`
    in its class and the class's project bases, where `name` is the method's own or an
    attribute the class binds to it (`self._impl = self.<method>`). Empty when any argument
    is not a method reached on `self` (or an in-file function), or nothing calls it."""
    model = facts.get(ObjectModel)
    ref = model.enclosing_class(function)
    sites = [(facts, site) for site in facts.call_sites(function)]
    if ref is not None:
        names = {function.name} | {
            attr
            for attr, values in ref.info.attributes.items()
            if any(_on_self(v) and v.attr == function.name for v in values)  # type: ignore[attr-defined]
        }
        for klass in model.lineage(ref):
            for method in klass.info.methods.values():
                for call in klass.facts.calls_in(method):
                    if _on_self(call.func) and call.func.attr in names:  # type: ignore[attr-defined]
                        sites.append((klass.facts, call))
    found: list[tuple[Facts, FunctionNode]] = []
    params = [a.arg for a in [*function.args.posonlyargs, *function.args.args]]
    if params[:1] == ["self"]:
        params = params[1:]
    for owner, site in {id(s[1]): s for s in sites}.values():
        argument = _argument_for(site, params, param)
        target = _resolve(owner, argument, ref, model) if argument is not None else None
        if target is None:
            return []
        found.append(target)
    return found


def _argument_for(site: ast.Call, params: list[str], param: str) -> ast.expr | None:
    for keyword in site.keywords:
        if keyword.arg == param:
            return keyword.value
        if keyword.arg is None:
            return None
    if any(isinstance(a, ast.Starred) for a in site.args) or param not in params:
        return None
    position = params.index(param)
    return site.args[position] if position < len(site.args) else None


def _resolve(
    owner: Facts, argument: ast.expr, ref: ClassRef | None, model: ObjectModel
) -> tuple[Facts, FunctionNode] | None:
    """`self.<method>` looked up from the class of the instance (`ref`, then its bases), or
    a function of the caller's file named by a plain name, or the `__call__` of the project
    class whose object the caller builds right there."""
    if _on_self(argument) and ref is not None:
        for klass in model.lineage(ref):
            method = klass.info.methods.get(argument.attr)  # type: ignore[attr-defined]
            if method is not None:
                return klass.facts, method
        return None
    if isinstance(argument, ast.Call):
        # An object whose `__call__` runs the step (`update=StepOnCall(model, optimizer)`).
        called = owner.called_instance_method(argument)
        return (called[0], called[1]) if called is not None else None
    if isinstance(argument, ast.Name):
        function = owner.functions.get(argument.id)
        if function is not None and owner.scope(function) is owner.tree:
            return owner, function
    return None


def _on_self(expr: ast.AST) -> bool:
    return (
        isinstance(expr, ast.Attribute)
        and isinstance(expr.value, ast.Name)
        and expr.value.id == "self"
    )
