"""TL205 zero-grad-between-backward-and-step: a `zero_grad()` runs after `backward()` and before
the `step()` of the optimizer it clears, in the same block, so the step sees no gradients.

In: `Facts`. Out: `Hit`s at the `zero_grad()` call, with an unsafe fix moving it to the start of
its block.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.findings import Fix
from torchls.analysis.registry import Hit, exemption, rule
from torchls.analysis.rules._edits import delete_statement_line, insert_line_before


def _zero_grad_statements(facts: Facts) -> Iterator[tuple[ast.Call, ast.stmt, list[ast.stmt]]]:
    for call in facts.method_calls("zero_grad"):
        statement = facts.parents.get(call)
        if isinstance(statement, ast.Expr):
            block = facts.block_of(statement)
            if block is not None:
                yield call, statement, block


@exemption("TL205", "neg_zero_grad_before_next_backward.py")
def _backward_runs_first(facts: Facts, later: ast.stmt) -> bool:
    """A statement after the `zero_grad()` runs a new `backward()` before any step is reached
    (the generator phase of a GAN step, after the discriminator's step): the step uses the
    gradients of that new backward, which the `zero_grad()` rightly cleared the way for."""
    return facts.node_reaches(later, facts.is_backward)


@exemption("TL205", "neg_zero_grad_of_other_optimizer.py")
def _clears_another_optimizer(facts: Facts, zero_grad: ast.Call, step: ast.Call) -> bool:
    """The `zero_grad()` belongs to an optimizer other than the one stepped next
    (`opt_dec.zero_grad()` then `opt_enc.step()`): the step reads gradients it did not clear.
    A `zero_grad()` on the model (or on `self`) clears every optimizer's gradients."""
    cleared = facts.receiver(zero_grad)
    cleared_key = facts.key(cleared)
    if facts.is_kind(cleared, "model") or cleared_key == "self":
        return False
    return facts.key(facts.optimizer_of_step(step)) != cleared_key


@rule(
    "TL205",
    "zero-grad-between-backward-and-step",
    "E",
    "zero_grad() between backward() and step() wipes the gradients",
    fix="unsafe",
)
def zero_grad_between_backward_and_step(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    `optimizer.zero_grad()` (or `model.zero_grad()`) called after `loss.backward()` and before
    the `optimizer.step()` that uses those gradients, in the same block.

    ## Why it is wrong
    The gradients `backward()` just computed are erased before the optimizer uses them, so
    `step()` sees zeros (or `None`): the parameters never change, or only weight decay and
    momentum move them. The loss stays flat.

    ## Example
    ```python
    loss.backward()
    optimizer.zero_grad()   # TL205
    optimizer.step()
    ```

    ## Fix
    Clear gradients before the forward pass (start of the iteration), or after `step()`.
    The quick fix moves the call to the start of the block; it is unsafe.
    """
    for call, stmt, block in _zero_grad_statements(facts):
        index = next(i for i, item in enumerate(block) if item is stmt)
        if not any(facts.node_reaches(s, facts.is_backward) for s in block[:index]):
            continue
        for later in block[index + 1 :]:
            if _backward_runs_first(facts, later):
                break
            steps = [c for c in facts.calls_in(later) if facts.optimizer_of_step(c) is not None]
            matched = [s for s in steps if not _clears_another_optimizer(facts, call, s)]
            if matched:
                yield Hit(
                    call,
                    f"`{facts.source.segment(call)}` runs after backward() and before "
                    f"`{facts.source.segment(matched[0])}`: the step sees no gradients",
                    _move_to_block_start(facts, block, stmt),
                )
                break


def _move_to_block_start(facts: Facts, block: list[ast.stmt], stmt: ast.stmt) -> Fix | None:
    deletion = delete_statement_line(facts, stmt)
    if deletion is None or block[0] is stmt:
        return None
    text = facts.source.segment(stmt)
    return Fix(
        "unsafe",
        "Move the zero_grad() call before the forward pass",
        (insert_line_before(facts, block[0], text), deletion),
    )
