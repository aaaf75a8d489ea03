"""TL404's cross-function case: a scaled backward here, the clip and `scaler.step` in a helper.

Why: trainers often split the update: the engine runs `scaler.scale(loss).backward()` and
hands the scaler to an updater object (in another file) whose step method clips and then
calls `scaler.step(optimizer)`. Inside that method the clip is not preceded by any scaled
backward, so the one-function check cannot see that the gradients it clips are scaled; from
the engine's side, the helper's body is one call away.

In: the facts of the file with the scaled backward, and that backward. Out: the calls after
it that pass the same scaler to a project function which clips before stepping with it and
never unscales it, with the clip (in the helper's own file) that is wrong.
"""

from __future__ import annotations

import ast

from torchls.analysis.facts import Facts, FunctionNode
from torchls.analysis.objects import ObjectModel
from torchls.analysis.queries.vocabulary import argument_at
from torchls.analysis.rules._optimization import (
    CLIP_FUNCTIONS,
    clips_nothing,
    is_scaler_call,
    position,
)


def scaled_backward(facts: Facts, call: ast.Call) -> bool:
    """`scaler.scale(loss).backward()`."""
    if facts.method_name(call) != "backward":
        return False
    inner = facts.receiver(call)
    return isinstance(inner, ast.Call) and is_scaler_call(facts, inner, "scale")


def helpers_clipping_scaled(
    facts: Facts, backward: ast.Call, scaler: ast.expr
) -> list[tuple[ast.Call, Facts, ast.Call]]:
    """(call here, facts of the helper's file, clip there) for each call after `backward`, in
    its function, that hands `scaler` to a project function clipping before it steps with it.
    The search ends at anything that could unscale or step here (`scaler.unscale_`, a step,
    another scaled backward), and at a call whose scaler argument is not the same text."""
    scope = facts.enclosing_function(backward) or facts.tree
    scaler_text = facts.source.segment(scaler)
    here = position(backward)
    found = []
    for call in facts.calls_in(scope):
        if position(call) <= here:
            continue
        name = facts.method_name(call)
        if (
            name == "unscale_"
            or is_scaler_call(facts, call, "step")
            or scaled_backward(facts, call)
        ):
            break
        target = _target(facts, call)
        if target is None:
            continue
        owner, function, bound = target
        parameter = _parameter_given(facts, call, function, bound, scaler_text)
        if parameter is None:
            continue
        clip = _clip_before_step(owner, function, parameter)
        if clip is not None:
            found.append((call, owner, clip))
    return found


def _target(facts: Facts, call: ast.Call) -> tuple[Facts, FunctionNode, bool] | None:
    """The project function `call` runs: a known callee, or a method of an object built from
    a project class (`self.updater.step(...)` with `self.updater = Updater(...)`)."""
    if not isinstance(call.func, (ast.Name, ast.Attribute)):
        return None
    found = facts.callee(call)
    if found is not None:
        return found
    if not isinstance(call.func, ast.Attribute):
        return None
    method = facts.get(ObjectModel).object_method(call)
    return (method[0], method[1], True) if method is not None else None


def _parameter_given(
    facts: Facts, call: ast.Call, function: FunctionNode, bound: bool, scaler_text: str | None
) -> str | None:
    """The parameter of `function` that `call` passes the scaler (the same text) to."""
    if scaler_text is None:
        return None
    args = function.args
    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
        told, value = argument_at(call, function, arg.arg, bound)
        if told and value is not None and facts.source.segment(value) == scaler_text:
            return arg.arg
    return None


def _clip_before_step(owner: Facts, function: FunctionNode, parameter: str) -> ast.Call | None:
    """In `function`, a gradient clip followed by `<parameter>.step(optimizer)` with no
    `<parameter>.unscale_(...)` before the clip (and the parameter never rebound)."""
    if any(a.stmt is not function for a in owner.assignments_of(parameter, function)):
        return None
    clip: ast.Call | None = None
    for call in owner.calls_in(function):
        receiver = owner.receiver(call) if isinstance(call.func, ast.Attribute) else None
        on_parameter = isinstance(receiver, ast.Name) and receiver.id == parameter
        name = owner.method_name(call)
        if on_parameter and name in ("unscale_", "scale"):
            return None  # unscaled here, or a backward of its own: the one-function case
        if clip is None and owner.call_qualname(call) in CLIP_FUNCTIONS:
            if not clips_nothing(owner, call):
                clip = call
            continue
        if clip is not None and on_parameter and name == "step" and call.args:
            return clip
    return None


def scaled_by_callers(facts: Facts, clip: ast.Call) -> list[tuple[Facts, ast.Call]]:
    """For a clip in a function that later steps with a scaler parameter it never unscales:
    (facts, scaled backward) in each caller (this file or another) that scales the loss with
    the scaler it passes and makes this call next (what `helpers_clipping_scaled` finds from
    the caller's side)."""
    function = facts.enclosing_function(clip)
    if function is None:
        return []
    args = function.args
    parameters = [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]]
    if not any(_clip_before_step(facts, function, p) is clip for p in parameters):
        return []
    sites = [(facts, site) for site in facts.call_sites(function)]
    sites += facts.calls_from_other_files(function)
    found = []
    for other, site in sites:
        scope = other.enclosing_function(site) or other.tree
        for backward in other.calls_in(scope):
            if position(backward) >= position(site) or not scaled_backward(other, backward):
                continue
            scaler = other.receiver(other.receiver(backward))  # type: ignore[arg-type]
            if scaler is not None and any(
                call is site for call, _, _ in helpers_clipping_scaled(other, backward, scaler)
            ):
                found.append((other, backward))
    return found
