"""TL405 `double-optimizer-step`: the rule module.

Checks that an optimizer stepped through the GradScaler is not also stepped directly on a path
that always runs both. In: the file's `Facts`. Out: hits (no fix).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.registry import Hit, rule
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


def run_together(facts: Facts, first: ast.AST, second: ast.AST) -> bool:
    """True when `first` and `second` always run together: same function, no branch or inner
    loop separating them."""
    ancestor = _lowest_common_ancestor(facts, first, second)
    if ancestor is None or isinstance(ancestor, _BRANCHING):
        return False
    return _path_unconditional(facts, first, ancestor) and _path_unconditional(
        facts, second, ancestor
    )


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
    (`scaler.step(optimizer)`) and once directly (`optimizer.step()`), with no branch between
    them (the usual `if use_amp: scaler.step(opt) else: opt.step()` is fine).

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
