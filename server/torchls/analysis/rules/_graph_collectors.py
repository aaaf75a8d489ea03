"""TL206's question of which calls hand a graph-attached loss to a project collector object
that keeps it: a method appending its parameter to a list on `self` (`self.d_loss.append(l_d)`).

Why: training loops often log through a small class of their own (a metric counter, a loss
tracker, in another module) whose `add(...)` appends what it is given to a list that lives as
long as the object. Handing it the loss tensor itself (or an indexed piece of it, a view that
still holds the graph) keeps every step's graph alive, though the loop shows no container. In:
a scope's facts, its loss names and the calls it makes. Out: the call, the argument, and the
append in the collector's file.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.findings import Related
from torchls.analysis.registry import Hit
from torchls.analysis.rules._graph_loops import outlives_a_step
from torchls.analysis.rules._graph_returns import _class_built_by


def _self_attr(node: ast.AST, receiver: str) -> str | None:
    """`x` for `self.x` (`receiver` the method's first parameter)."""
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == receiver
    ):
        return node.attr
    return None


def _rebound_attrs(owner: Facts, method: ast.AST, receiver: str) -> set[str]:
    """The `self.` attributes `method` rebinds (`self.d_loss = []`)."""
    found: set[str] = set()
    for node in owner.walk_local(method):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                attr = _self_attr(target, receiver)
                if attr is not None:
                    found.add(attr)
    return found


def _appended_params(owner: Facts, method: ast.AST) -> dict[str, tuple[str, ast.Call]]:
    """Parameter → (attribute, append call) for each `self.<attr>.append(<param>)` in `method`
    whose list the method does not rebind itself (a list made afresh per call keeps nothing)."""
    args = method.args  # type: ignore[attr-defined]
    positional = [*args.posonlyargs, *args.args]
    if not positional:
        return {}
    receiver = positional[0].arg
    params = {a.arg for a in [*positional[1:], *args.kwonlyargs]}
    rebound = _rebound_attrs(owner, method, receiver)
    found: dict[str, tuple[str, ast.Call]] = {}
    for node in owner.walk_local(method):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "append"
            and len(node.args) == 1
            and not node.keywords
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id in params
        ):
            continue
        attr = _self_attr(node.func.value, receiver)
        if attr is not None and attr not in rebound:
            found.setdefault(node.args[0].id, (attr, node))
    return found


def _bind(method: ast.AST, call: ast.Call) -> dict[str, ast.expr]:
    """Parameter → argument of a method call (the receiver bound by attribute access)."""
    args = method.args  # type: ignore[attr-defined]
    params = [a.arg for a in [*args.posonlyargs, *args.args]][1:]
    if any(isinstance(a, ast.Starred) for a in call.args):
        return {}
    bound = dict(zip(params, call.args, strict=False))
    for keyword in call.keywords:
        if keyword.arg is not None:
            bound[keyword.arg] = keyword.value
    return bound


def _loss_piece(value: ast.expr, tensors: set[str]) -> ast.Name | None:
    """The loss name `value` is (`loss`) or an indexed piece of (`loss[0]`, still a view on
    the graph)."""
    if isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Constant):
        value = value.value
        if isinstance(value, ast.Name) and value.id in tensors:
            return value
        return None
    if isinstance(value, ast.Name):
        return value
    return None


def _method_called(facts: Facts, call: ast.Call) -> tuple[Facts, ast.AST] | None:
    """(facts, method) a method call runs: a resolved project callee, or the method of the
    project class whose instance the receiver holds (`self.counter = Counter(name)` in
    `__init__`, then `self.counter.add(...)`)."""
    target = facts.callee(call)
    if target is not None:
        return (target[0], target[1]) if target[2] else None
    func = call.func
    if not isinstance(func, ast.Attribute):
        return None
    built = _class_built_by(facts, facts.binding_value(func.value))
    if built is None:
        return None
    owner, klass = built
    info = owner.classes.get(klass.name)  # type: ignore[attr-defined]
    method = info.methods.get(func.attr) if info is not None else None
    return (owner, method) if method is not None else None


def _cleared_in(facts: Facts, loop: ast.AST, receiver: str, attr: str, call: ast.Call) -> bool:
    """Another method of the same receiver, called in `loop`, rebinds the list (`counter.clear()`
    every step): it keeps one step's loss only."""
    for other in facts.calls_in(loop):
        if other is call or not isinstance(other.func, ast.Attribute):
            continue
        if facts.source.segment(other.func.value) != receiver:
            continue
        target = _method_called(facts, other)
        if target is None:
            continue
        owner, method = target
        args = method.args  # type: ignore[attr-defined]
        positional = [*args.posonlyargs, *args.args]
        if positional and attr in _rebound_attrs(owner, method, positional[0].arg):
            return True
    return False


def collector_keeps(
    facts: Facts,
    scope: ast.AST,
    loss_names: set[str],
    tensors: set[str],
    detached: Callable[[ast.Name], bool],
) -> Iterator[Hit]:
    """A hit for each method call in a step loop of `scope` that hands a name of `loss_names`
    (or an indexed piece of a plain loss tensor of `tensors`) to a project method appending
    it to a list on the object, the object made outside that loop; not when `detached` says
    the name reaching the call holds a detached value."""
    for call in facts.calls_in(scope):
        if not isinstance(call.func, ast.Attribute) or facts.in_no_grad(call):
            continue
        handed = [*call.args, *(k.value for k in call.keywords)]
        pieces = [_loss_piece(a, tensors) for a in handed]
        if not any(p is not None and p.id in loss_names for p in pieces):
            continue  # cheap test first: the callee is only resolved for a loss argument
        target = _method_called(facts, call)
        if target is None:
            continue
        owner, method = target
        appended = _appended_params(owner, method)
        loops = facts.enclosing_loops(call)
        if not appended or not loops:
            continue
        holder = call.func.value
        made: list = []
        if isinstance(holder, ast.Name):
            made = list(facts.assignments_of(holder.id, scope))  # type: ignore[arg-type]
        elif not isinstance(holder, ast.Attribute):
            continue
        if not outlives_a_step(facts, loops, made):
            continue
        receiver = facts.source.segment(holder)
        for param, argument in _bind(method, call).items():
            loss = _loss_piece(argument, tensors)
            if param not in appended or loss is None or loss.id not in loss_names:
                continue
            attr, append = appended[param]
            if detached(loss) or any(
                _cleared_in(facts, loop, receiver, attr, call) for loop in loops
            ):
                continue
            yield Hit(
                call,
                f"`{loss.id}` is still attached to its autograd graph and "
                f"`{facts.source.segment(call.func)}` appends it to `self.{attr}`, which "
                f"outlives the step, so every step's graph stays alive; pass "
                f"`{facts.source.segment(argument)}.item()` instead",
                None,
                related=(
                    Related(owner.source.span(append), "kept in a list here", owner.filename),
                ),
            )
            break
