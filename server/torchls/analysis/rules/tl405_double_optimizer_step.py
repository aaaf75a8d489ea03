"""TL405 `double-optimizer-step`: the rule module.

Checks that an optimizer stepped through the GradScaler is not also stepped directly on a path
that always runs both. In: the file's `Facts`. Out: hits (no fix).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.registry import Hit, exemption, rule
from torchls.analysis.rules._optimization import (
    _lowest_common_ancestor,
    _path_unconditional,
    is_scaler_call,
    method_calls,
)


def is_plain_optimizer_step(facts: Facts, call: ast.Call) -> bool:
    """`optimizer.step()` (not `scaler.step(optimizer)`)."""
    return facts.method_name(call) == "step" and facts.is_kind(facts.receiver(call), "optimizer")


_BRANCHING = (ast.If, ast.Try, ast.IfExp, ast.BoolOp, ast.Match, getattr(ast, "TryStar", ast.Try))


@exemption("TL405", "neg_single_step.py")
def _on_separate_branches(facts: Facts, first: ast.AST, second: ast.AST) -> bool:
    """The two steps sit on different branches of an `if`, `try`, conditional expression or
    `match` (`if use_amp: scaler.step(opt) else: opt.step()`): only one of them runs."""
    ancestor = _lowest_common_ancestor(facts, first, second)
    return ancestor is None or isinstance(ancestor, _BRANCHING)


def run_together(facts: Facts, first: ast.AST, second: ast.AST) -> bool:
    """True when `first` and `second` always run together: same function, no branch or inner
    loop separating them."""
    if _on_separate_branches(facts, first, second):
        return False
    ancestor = _lowest_common_ancestor(facts, first, second)
    if ancestor is None:
        return False  # already excluded by `_on_separate_branches`; said again for mypy
    return _path_unconditional(facts, first, ancestor) and _path_unconditional(
        facts, second, ancestor
    )


_LEAVES = (ast.Return, ast.Continue, ast.Break, ast.Raise)


def stepped_again(facts: Facts, first: ast.Call, second: ast.Call) -> bool:
    """`second` (a plain step of the same optimizer, later in the same function) always runs
    after `first` in the same iteration, with no backward() in between: `first` sits under
    `if`/`with` blocks of the loop body that `second` follows unconditionally, and nothing
    between them leaves the iteration (`continue`, `return`, ...)."""
    if facts.scope(first) is not facts.scope(second) or first.lineno >= second.lineno:
        return False
    if _on_separate_branches(facts, first, second):
        return False
    ancestor = _lowest_common_ancestor(facts, first, second)
    if ancestor is None:
        return False  # already excluded by `_on_separate_branches`; said again for mypy
    if not _path_unconditional(facts, second, ancestor):
        return False
    loops = facts.enclosing_loops(first)
    if not loops or facts.enclosing_loops(second)[:1] != loops[:1]:
        return False  # not one iteration of a training loop (a test stepping on purpose)
    if not facts.is_inside(loops[0], ancestor) and loops[0] is not ancestor:
        return False
    branched = False
    current = facts.parents.get(first)
    while current is not None and current is not ancestor:
        if not isinstance(current, (ast.If, ast.With, ast.AsyncWith, ast.Expr)):
            return False  # a loop or `try` around the first step: it may run 0 or n times
        branched = branched or isinstance(current, ast.If)
        current = facts.parents.get(current)
    if current is None or not branched:
        return False  # the accumulation branch's step, then the leftover one
    return not _backward_or_exit_between(facts, first, second)


@exemption("TL405", "neg_branch_step_then_fresh_backward.py")
def _backward_or_exit_between(facts: Facts, first: ast.Call, second: ast.Call) -> bool:
    """Between the two plain steps the code runs a backward pass or leaves the iteration
    (`continue`, `return`, `break`, `raise`, `yield`, `await`): each step applies its own
    gradients, or only one of them runs."""
    for node in facts.walk_local(facts.scope(first)):
        line = getattr(node, "lineno", 0)
        if not first.end_lineno < line < second.lineno:  # type: ignore[operator]
            continue
        if isinstance(node, (*_LEAVES, ast.Yield, ast.Await)):
            return True
        if isinstance(node, ast.Call) and facts.reaches(node, facts.is_backward):
            return True
    return False


@rule(
    "TL405",
    "double-optimizer-step",
    "E",
    "scaler.step(optimizer) and optimizer.step() on the same optimizer",
)
def double_optimizer_step(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    The same optimizer stepped twice in one iteration: once through the GradScaler
    (`scaler.step(optimizer)`) and once directly (`optimizer.step()`); also a plain
    `optimizer.step()` under an `if` of the loop body (an accumulation branch) followed,
    unconditionally and with no backward() in between, by another `optimizer.step()`.

    ## Why it is wrong
    `scaler.step(optimizer)` already calls `optimizer.step()` (unless it skips the step
    because of an overflow). The second call applies the update again: the effective learning
    rate doubles, momentum and Adam statistics advance twice, and the steps the scaler skipped
    on purpose happen anyway with inf/NaN gradients.

    ## Example
    ```python
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.step()                 # TL405: second update of the same parameters
    ```

    ## Fix
    Keep only `scaler.step(optimizer)` when mixed precision is on. No automatic fix.
    """
    steps = method_calls(facts, "step")
    plain = [c for c in steps if is_plain_optimizer_step(facts, c)]
    for first in plain:
        key = facts.key(facts.receiver(first))
        for second in plain:
            if key is not None and facts.key(facts.receiver(second)) == key:
                if stepped_again(facts, first, second):
                    yield Hit(
                        second,
                        f"`{key}` is stepped again here after its step on line "
                        f"{first.lineno}, with no backward() in between: the update is "
                        "applied twice (or on just-zeroed gradients)",
                    )
                    break
    scaler_steps = [c for c in steps if is_scaler_call(facts, c, "step") and c.args]
    if not scaler_steps:
        return
    for call in steps:
        if not is_plain_optimizer_step(facts, call):
            continue
        key = facts.key(facts.receiver(call))
        if key is None:
            continue
        for scaler_step in scaler_steps:
            if facts.key(scaler_step.args[0]) != key:
                continue
            if facts.scope(scaler_step) is not facts.scope(call):
                continue
            if not run_together(facts, scaler_step, call):
                continue
            yield Hit(
                call,
                f"`{key}` is stepped twice: by `{facts.source.segment(scaler_step)}` on line "
                f"{scaler_step.lineno} and again here",
            )
            break
