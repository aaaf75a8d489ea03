"""TL408 `clip-after-step`: the rule module.

Checks that gradients are not clipped after the optimizer step that used them, before the
next backward pass. In: the file's `Facts`. Out: hits, with an unsafe fix moving the clip
before the step.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.findings import Fix
from torchls.analysis.registry import Hit, exemption, rule
from torchls.analysis.rules._edits import insert_line_before
from torchls.analysis.rules._optimization import (
    _FUNCTION_TYPES,
    _LOOP_TYPES,
    CLIP_FUNCTIONS,
    _optimizer_step_inside,
    block_of,
    clips_nothing,
    index_in,
    is_scaler_call,
    movable,
    owns_lines,
    statement_text,
)

_SIMPLE = (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign)


def _previous_event(facts: Facts, stmt: ast.stmt) -> tuple[str, ast.stmt] | None:
    """Walking back from `stmt` within its iteration: ("step", statement) when the nearest
    earlier statement that matters steps an optimizer unconditionally, ("backward", ...) when
    it is a backward pass, None when unknown."""
    current: ast.stmt = stmt
    while True:
        block = block_of(facts, current)
        if block is None:
            return None
        for earlier in reversed(block[: index_in(block, current)]):
            if facts.node_reaches(earlier, facts.is_backward):
                return "backward", earlier
            if _optimizer_step_inside(facts, earlier):
                return ("step", earlier) if isinstance(earlier, _SIMPLE) else None
        parent = facts.parents.get(current)
        if parent is None or isinstance(parent, (*_FUNCTION_TYPES, *_LOOP_TYPES)):
            return None
        current = parent  # type: ignore[assignment]


@exemption("TL408", "neg_clip_before_step.py")
def _steps_before_next_backward(facts: Facts, stmt: ast.stmt) -> bool:
    """The clip is followed by an optimizer step before the next backward pass: it clips
    the gradients that step is about to apply."""
    current: ast.stmt = stmt
    while True:
        block = block_of(facts, current)
        if block is None:
            return False
        for later in block[index_in(block, current) + 1 :]:
            if facts.node_reaches(later, facts.is_backward):
                return False
            if _optimizer_step_inside(facts, later):
                return True
        parent = facts.parents.get(current)
        if parent is None or isinstance(parent, (*_FUNCTION_TYPES, *_LOOP_TYPES)):
            return False
        current = parent  # type: ignore[assignment]


@rule(
    "TL408",
    "clip-after-step",
    "E",
    "Gradient clipping after optimizer.step(): the step used unclipped gradients",
    fix="unsafe",
)
def clip_after_step(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    `clip_grad_norm_` / `clip_grad_value_` called after `optimizer.step()` with no backward
    pass in between.

    ## Why it is wrong
    Clipping only matters before the update. After `step()` the gradients were already
    applied unclipped; the clip then changes gradients that are about to be zeroed. Exploding
    gradients go straight into the weights, which is exactly what the clip was added to stop.

    ## Example
    ```python
    loss.backward()
    optimizer.step()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)   # TL408: too late
    ```

    ## Fix
    Clip between `backward()` and `step()`. The quick fix moves the clip before the step; it
    is unsafe because it changes the updates (that is the point).
    """
    for clip in facts.calls_to(*CLIP_FUNCTIONS):
        stmt = facts.enclosing_statement(clip)
        if stmt is None or clips_nothing(facts, clip):
            continue
        previous = _previous_event(facts, stmt)
        if previous is None or previous[0] != "step":
            continue
        if _steps_before_next_backward(facts, stmt):
            continue
        step_stmt = previous[1]
        yield Hit(
            clip,
            f"`{facts.source.segment(clip.func)}` runs after "
            f"`{facts.source.segment(step_stmt).strip()}` (line {step_stmt.lineno}): the "
            "update already used the unclipped gradients; clip before the step",
            _move_clip_before(facts, stmt, step_stmt),
        )


def _move_clip_before(facts: Facts, clip_stmt: ast.stmt, step_stmt: ast.stmt) -> Fix | None:
    block = block_of(facts, clip_stmt)
    if block is None or not any(item is step_stmt for item in block):
        return None
    if not isinstance(clip_stmt, _SIMPLE) or not owns_lines(facts, step_stmt):
        return None
    if any(is_scaler_call(facts, c, "step") for c in facts.calls_in(step_stmt)):
        return None  # would also need scaler.unscale_ before the clip
    deletion = movable(facts, clip_stmt)
    if deletion is None:
        return None
    return Fix(
        "unsafe",
        "Move the clipping before the optimizer step",
        (deletion, insert_line_before(facts, step_stmt, statement_text(facts, clip_stmt))),
    )
