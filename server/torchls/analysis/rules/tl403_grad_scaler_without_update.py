"""TL403 `grad-scaler-without-update`: the rule module.

Checks that every iteration calling `scaler.step(optimizer)` also calls `scaler.update()`,
following helpers to their call sites. In: the file's `Facts`. Out: hits, with a safe fix
inserting the update after the step.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.findings import Fix
from torchls.analysis.registry import Hit, exemption, rule
from torchls.analysis.rules._edits import insert_line_after
from torchls.analysis.rules._optimization import is_scaler_call, method_calls, owns_lines


def _iteration_of(facts: Facts, node: ast.AST) -> ast.AST | None:
    """The loop that is one training iteration around `node`: the innermost enclosing loop that
    reaches backward(), else the innermost loop that is not a loop over the optimizers a
    `scaler.step(optimizer)` steps (`for optimizer in self.optimizers: ...` runs inside one
    iteration, whose update may come after it)."""
    loops = facts.enclosing_loops(node)
    for loop in loops:
        if facts.node_reaches(loop, facts.is_backward):
            return loop
    stepped = node.args[0] if isinstance(node, ast.Call) and node.args else None
    for loop in loops:
        targets = (
            {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
            if isinstance(loop, (ast.For, ast.AsyncFor))
            else set()
        )
        if isinstance(stepped, ast.Name) and stepped.id in targets:
            continue
        return loop
    return None


@exemption("TL403", "neg_scaler_updated.py")
def _updates_scaler(facts: Facts, node: ast.AST) -> bool:
    """The iteration (or the function running it) calls `scaler.update()` on the `GradScaler`
    that stepped, so the loss scale adapts every iteration."""
    return facts.node_reaches(node, lambda c: is_scaler_call(facts, c, "update"))


def _update_in_iteration(facts: Facts, node: ast.AST, depth: int = 0) -> bool | None:
    """Whether the iteration running `node` also calls `scaler.update()`; None if unknown."""
    iteration = _iteration_of(facts, node)
    if iteration is not None:
        return _updates_scaler(facts, iteration)
    function = facts.enclosing_function(node)
    if function is None:
        return None
    if _updates_scaler(facts, function):
        return True
    sites = facts.call_sites(function)
    if not sites or depth >= 3:
        return None
    answers = {_update_in_iteration(facts, site, depth + 1) for site in sites}
    if True in answers:
        return True
    return None if None in answers else False


@rule(
    "TL403",
    "grad-scaler-without-update",
    "E",
    "scaler.step(optimizer) without scaler.update() in the same iteration",
    fix="safe",
)
def grad_scaler_without_update(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    `scaler.step(optimizer)` on a `GradScaler` in a training iteration that never calls
    `scaler.update()` (or calls it only after the loop). A loop over several optimizers
    inside one iteration (`for opt in optimizers: scaler.step(opt)`, then one update) is not
    the iteration.

    ## Why it is wrong
    `update()` is what adapts the loss scale: it lowers it after an overflow and resets the
    per-iteration inf checks. Without it the scale never changes, so a step that overflowed
    once keeps being skipped (the scaler still sees the old infs) or the scale stays too small
    for fp16 gradients to be represented; the model silently stops learning.

    ## Example
    ```python
    scaler.scale(loss).backward()
    scaler.step(optimizer)          # TL403: no scaler.update() follows
    optimizer.zero_grad()
    ```

    ## Fix
    Call `scaler.update()` once per iteration, right after the last `scaler.step(...)`. The
    fix inserts it after the step (after the loop over optimizers when there is one).
    """
    for call in method_calls(facts, "step"):
        if not is_scaler_call(facts, call, "step") or not call.args:
            continue
        answer = _update_in_iteration(facts, call)
        if answer is True or (answer is None and not _no_update_anywhere(facts)):
            continue
        scaler_text = facts.source.segment(facts.receiver(call))  # type: ignore[arg-type]
        yield Hit(
            call,
            f"`{facts.source.segment(call)}` is never followed by `{scaler_text}.update()` in "
            "the same iteration: the loss scale never adapts",
            _insert_update(facts, call, scaler_text),
        )


def _no_update_anywhere(facts: Facts) -> bool:
    return not any(is_scaler_call(facts, c, "update") for c in method_calls(facts, "update"))


def _insert_update(facts: Facts, call: ast.Call, scaler_text: str) -> Fix | None:
    stmt = facts.enclosing_statement(call)
    if stmt is None or facts.parents.get(call) is not stmt:
        return None
    scope = facts.enclosing_function(call) or facts.tree
    if _updates_scaler(facts, scope):
        return None  # an update elsewhere (after the loop): moving it is the author's call
    iteration = _iteration_of(facts, call)
    anchor: ast.stmt = stmt
    for loop in facts.enclosing_loops(call):
        if loop is iteration:
            break
        anchor = loop  # a loop over optimizers: update once, after it
    if not owns_lines(facts, anchor):
        return None
    return Fix(
        "safe",
        f"Insert `{scaler_text}.update()` after the step",
        (insert_line_after(facts, anchor, f"{scaler_text}.update()"),),
    )
