"""TL204 missing-zero-grad: a loop backwards and steps an optimizer but never clears the
gradients that optimizer updates (none at all, only another optimizer's, or only in the other
arm of an `if`).

In: `Facts`. Out: `Hit`s at the optimizer step, with an unsafe fix inserting `zero_grad()` at the
start of the loop where nothing in it clears gradients.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.findings import Fix, Related
from torchls.analysis.registry import Hit, exemption, rule
from torchls.analysis.rules._edits import insert_line_before
from torchls.analysis.rules._modes_backprop import loops_through_handed_backprop
from torchls.analysis.rules._modes_memos import GradientClearings


def _steps(facts: Facts) -> Iterator[tuple[ast.Call, ast.expr]]:
    for call in facts.method_calls("step"):
        optimizer = facts.optimizer_of_step(call)
        if optimizer is not None:
            yield call, optimizer


def _privacy_wrapped(facts: Facts) -> set[str]:
    """Optimizers handed to an Opacus privacy engine (`engine.attach(optimizer)`,
    `engine.make_private(optimizer=...)`): its step rebuilds `.grad` from per-sample
    gradients each time, so stale gradients never reach the update."""
    if not any(target.startswith("opacus") for target in facts.imports.values()):
        return set()
    engines = set()
    for table in facts.assignments.values():
        for name, bindings in table.items():
            if any(
                isinstance(b.value, ast.Call)
                and (facts.call_qualname(b.value) or "").startswith("opacus.")
                for b in bindings
            ):
                engines.add(name)
    for info in facts.classes.values():
        for attribute, values in info.attributes.items():
            if any(
                isinstance(v, ast.Call) and (facts.call_qualname(v) or "").startswith("opacus.")
                for v in values
            ):
                engines.add(f"self.{attribute}")
    found: set[str] = set()
    for call in facts.calls:
        receiver = facts.key(facts.receiver(call))
        if receiver in engines or (facts.call_qualname(call) or "").startswith("opacus."):
            for argument in [*call.args, *(k.value for k in call.keywords)]:
                key = facts.key(argument)
                if key is not None:
                    found.add(key)
    return found


@exemption("TL204", "neg_mxnet_gluon_loop.py")
def _other_framework(facts: Facts) -> bool:
    """The file trains with another framework and never imports torch."""
    modules = {target.split(".")[0] for target in facts.imports.values()}
    return "torch" not in modules and bool(modules & OTHER_FRAMEWORKS)


OTHER_FRAMEWORKS = frozenset({"mxnet", "tensorflow", "jax", "flax", "paddle", "mindspore"})


def _uncleared_steps(facts: Facts, loop: ast.AST) -> set[int]:
    """Ids of the optimizer steps in `loop` whose parameters no `zero_grad()` in the loop
    clears, when every clearing there is a direct `zero_grad()` on a known optimizer or model
    and every stepped optimizer's parameters are known (`optimizer_D.step()` where only
    `optimizer_G.zero_grad()` runs). Empty as soon as anything cannot be told."""
    stepped = {
        facts.key(optimizer)
        for call in facts.calls_in(loop)
        if (optimizer := facts.optimizer_of_step(call)) is not None
    }
    if len(stepped) < 2:
        return set()  # one optimizer: the loop-wide check above already covers it
    if facts.get(GradientClearings).inside(loop):
        return set()  # `p.grad = None`: which parameters is not tracked
    cleared: list[set[str]] = []
    for call in facts.calls_in(loop):
        if not facts.is_zero_grad(call):
            if facts.reaches(call, lambda c: _clears(facts, c)):
                return set()  # a helper or a closure (LBFGS) clears something
            continue
        receiver = facts.receiver(call)
        kind = facts.kind_of(receiver)
        key = facts.key(receiver)
        if kind is None or kind.by_name or key is None:
            return set()
        if kind.kind == "optimizer":
            owners = facts.optimizer_parameter_owners(receiver)
        elif kind.kind == "model":
            owners = {key}
        else:
            return set()
        if not owners:
            return set()
        cleared.append(owners)
    found: set[int] = set()
    for step in facts.calls_in(loop):
        optimizer = facts.optimizer_of_step(step)
        if optimizer is None or facts.enclosing_loops(step)[:1] != [loop]:
            continue
        owners = facts.optimizer_parameter_owners(optimizer)
        if not owners:
            return set()
        if not any(_overlap(owners, other) for other in cleared):
            found.add(id(step))
    return found


@exemption("TL204", "neg_each_network_cleared_through_its_module.py")
def _overlap(first: set[str], second: set[str]) -> bool:
    """The step's optimizer shares parameters with a network the loop clears, the same one
    or one inside the other (`D` and `D.net`): `critic.zero_grad()` clears `critic_opt`'s."""
    return any(
        a == b or a.startswith(b + ".") or b.startswith(a + ".") for a in first for b in second
    )


def _clears(facts: Facts, call: ast.Call) -> bool:
    return facts.is_zero_grad(call) or facts.clears_gradients(call)


def _clearings_in(facts: Facts, loop: ast.AST) -> list[ast.AST]:
    """Every clearing of gradients in `loop`: a `zero_grad()`, a call that reaches one (a
    helper, an LBFGS closure), `p.grad = None`."""
    return [
        node
        for node in ast.walk(loop)
        if facts.clears_gradients(node)
        or (
            isinstance(node, ast.Call)
            and (facts.is_zero_grad(node) or facts.reaches(node, lambda c: _clears(facts, c)))
        )
    ]


def _arm_that_never_clears(
    facts: Facts, loop: ast.AST, step: ast.Call, clearings_of: Callable[[], list[ast.AST]]
) -> ast.If | None:
    """The `if` inside `loop` one of whose arms holds `step` and no clearing of gradients,
    while every one of the loop's clearings (`clearings_of()`) sits in its other arm: whenever
    the step's arm runs, the gradients of earlier iterations are still there
    (`if not use_amp: zero_grad, backward, step / else: scaler.step`). The clearings take a
    walk of the whole loop, so they are only asked for once an `if` with an `else` is found
    around the step."""
    current = facts.parents.get(step)
    while current is not None and current is not loop:
        if isinstance(current, ast.If) and current.orelse:
            break
        current = facts.parents.get(current)
    else:
        return None
    clearings = clearings_of()
    if not clearings:
        return None
    while current is not None and current is not loop:
        if isinstance(current, ast.If) and current.orelse:
            arms = (current.body, current.orelse)
            mine = next(
                (arm for arm in arms if any(facts.is_inside(step, stmt) for stmt in arm)), None
            )
            other = arms[1] if mine is arms[0] else arms[0]
            if mine is not None and all(
                any(facts.is_inside(node, stmt) for stmt in other) for node in clearings
            ):
                return current
        current = facts.parents.get(current)
    return None


def _clears_grads_in(facts: Facts, loop: ast.AST) -> bool:
    if facts.node_reaches(loop, lambda c: _clears(facts, c)):
        return True
    return facts.get(GradientClearings).inside(loop)


def _cleared_by_caller(facts: Facts, step: ast.Call, site: ast.Call) -> ast.expr | None:
    """The receiver of `step` (`self.optimizers.step()`) when its kind is unknown but the
    method holding `site` calls `zero_grad()` on the same object: it is cleared like an
    optimizer (`self.optimizers`, a library's container of optimizers)."""
    receiver = facts.receiver(step)
    key = facts.key(receiver)
    if receiver is None or key is None or facts.kind_of(receiver) is not None:
        return None
    caller = facts.scope(site)
    for call in facts.calls_in(caller):
        if facts.is_zero_grad(call) and facts.key(facts.receiver(call)) == key:
            return receiver
    return None


def _steps_of_helpers(facts: Facts) -> Iterator[tuple[ast.Call, ast.expr, ast.AST, ast.Call]]:
    """(step, optimizer, loop, call) for an optimizer step outside any loop in a function
    that backpropagates and never clears gradients itself, called (`self.train_step(batch)`)
    every iteration of a loop elsewhere in the file that clears none either: the helper's
    steps use the gradients of every earlier iteration too."""
    for step in facts.method_calls("step"):
        if facts.enclosing_loops(step):
            continue  # the loop-wide check covers steps inside a loop
        function = facts.scope(step)
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if not facts.node_reaches(function, facts.accumulates_grad):
            continue
        if _clears_grads_in(facts, function):
            continue
        for site in facts.call_sites(function):
            loops = facts.enclosing_loops(site)
            if not loops or facts.scope(site) is function:
                continue
            optimizer = facts.optimizer_of_step(step) or _cleared_by_caller(facts, step, site)
            if optimizer is None or _clears_grads_in(facts, loops[0]):
                continue
            yield step, optimizer, loops[0], site
            break


@rule(
    "TL204",
    "missing-zero-grad",
    "E",
    "Loop steps the optimizer but never clears gradients",
    fix="unsafe",
)
def missing_zero_grad(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    A loop that calls `backward()` and `optimizer.step()` (or `scaler.step(optimizer)`) but
    never clears gradients: no `optimizer.zero_grad()`, `model.zero_grad()` or
    `p.grad = None` anywhere in the loop (helpers and LBFGS closures included). Distributed
    autograd (`dist_autograd.backward(context_id, ...)` with a `DistributedOptimizer`) keeps
    gradients per context, not in `.grad`, and is not reported. With two optimizers in one
    loop (a GAN), an optimizer whose parameters no `zero_grad()` there clears is reported
    too, when every clearing in the loop names a known optimizer or model; when the loop
    clears nothing at all, each optimizer it steps is reported once; a step in one arm of an
    `if` whose other arm holds every clearing of the loop is reported too. Files that train
    with another framework and never import torch (MXNet's Gluon) are not checked, nor are
    optimizers handed to an Opacus privacy engine (its step rebuilds `.grad` itself). A
    helper that backpropagates and steps (`self.train_step(batch)`) called every iteration
    of a loop that clears nothing is reported at its step, also when the stepped object's
    kind is unknown but the loop's method calls `zero_grad()` on it once before the loop.
    A loop that hands each loss to a callable it receives as a parameter (`update(loss)`) is
    reported when every callable its callers pass for it (a method of the class or of a
    project base class in another file, whose `fit` calls the function itself or through
    an attribute bound to it, or an object of a project class built at the call site,
    whose `__call__` runs) backwards and steps without clearing gradients. A loop calling
    such an object held in a local name (`update = StepOnCall(...)`, then `update(x, y)`)
    is reported at the object's step, like a helper function.

    ## Why it is wrong
    `backward()` adds into `.grad`. Without clearing, step *k* uses the sum of all gradients so
    far: the effective learning rate grows every step and training diverges or oscillates.
    Gradient accumulation (clearing every *k* steps inside the loop) is correct and is not
    reported.

    ## Example
    ```python
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()          # TL204
    ```

    ## Fix
    Call `optimizer.zero_grad(set_to_none=True)` at the start of each iteration. Offered as
    an unsafe fix (it changes training).
    """
    if _other_framework(facts):
        return  # MXNet's or TensorFlow's backward overwrites gradients: nothing to clear
    private = _privacy_wrapped(facts)
    for step, optimizer, loop, site in _steps_of_helpers(facts):
        if facts.key(optimizer) in private:
            continue
        optimizer_text = facts.source.segment(optimizer)
        yield Hit(
            step,
            f"`{optimizer_text}` is stepped here after a backward(), and the loop on line "
            f"{loop.lineno} runs this every iteration (line {site.lineno}) without clearing "
            "gradients; they accumulate across iterations",
            None,
        )
    for call, loop, owner, backprop in loops_through_handed_backprop(facts):
        handed = backprop.name
        klass = owner.parents.get(backprop)
        if handed == "__call__" and isinstance(klass, ast.ClassDef):
            handed = f"{klass.name}.__call__"  # an object of the class, called
        yield Hit(
            call,
            f"`{facts.source.segment(call.func)}` is handed `{handed}`, which backwards "
            f"and steps without clearing gradients, and the loop on line {loop.lineno} never "
            "clears them; they accumulate across iterations",
            None,
            (
                Related(
                    owner.source.span(backprop),
                    "backward and step, no zero_grad",
                    owner.filename if owner is not facts else None,
                ),
            ),
        )
    # Each optimizer once per loop: with two optimizers and no clearing at all, each gets its
    # own finding and fix (clearing one leaves the other's gradients accumulating).
    reported: set[tuple[int, str]] = set()
    clearings: dict[int, list[ast.AST]] = {}  # per loop, for all the steps in it
    for step, optimizer in _steps(facts):
        loops = facts.enclosing_loops(step)
        if not loops or facts.key(optimizer) in private:
            continue
        loop = loops[0]
        seen = (id(loop), facts.key(optimizer) or facts.source.segment(optimizer))
        if seen in reported or not facts.node_reaches(loop, facts.accumulates_grad):
            continue
        if _clears_grads_in(facts, loop):

            def clearings_of(loop: ast.AST = loop) -> list[ast.AST]:
                if id(loop) not in clearings:
                    clearings[id(loop)] = _clearings_in(facts, loop)
                return clearings[id(loop)]

            branch = _arm_that_never_clears(facts, loop, step, clearings_of)
            if branch is not None:
                optimizer_text = facts.source.segment(optimizer)
                yield Hit(
                    step,
                    f"`{optimizer_text}` is stepped in an arm of the `if` on line "
                    f"{branch.lineno} that never clears gradients (only the other arm does); "
                    "whenever this arm runs they accumulate across iterations",
                    None,
                )
            elif id(step) in _uncleared_steps(facts, loop):
                # Two optimizers in one loop, and only the other one's gradients are cleared.
                optimizer_text = facts.source.segment(optimizer)
                yield Hit(
                    step,
                    f"`{optimizer_text}` is stepped in a loop that clears other gradients but "
                    f"never the ones `{optimizer_text}` updates; they accumulate across "
                    "iterations",
                    None,
                )
            continue
        reported.add(seen)
        optimizer_text = facts.source.segment(optimizer)
        body_start = loop.body[0]
        yield Hit(
            step,
            f"`{optimizer_text}` is stepped in a loop that never clears gradients; they "
            "accumulate across iterations",
            Fix(
                "unsafe",
                f"Insert `{optimizer_text}.zero_grad(set_to_none=True)` at the start of the loop",
                (
                    insert_line_before(
                        facts, body_start, f"{optimizer_text}.zero_grad(set_to_none=True)"
                    ),
                ),
            ),
        )
