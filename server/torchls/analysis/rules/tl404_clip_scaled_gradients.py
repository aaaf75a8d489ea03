"""TL404 `clip-scaled-gradients`: the rule module.

Checks that gradients are not clipped between a scaled backward and `scaler.step(...)` while
still multiplied by the loss scale (no `scaler.unscale_()` first). In: the file's `Facts`.
Out: hits, with a safe fix inserting the `unscale_` call before the clip.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from torchls.analysis.facts import Facts
from torchls.analysis.findings import Fix, Related
from torchls.analysis.registry import Hit, exemption, rule
from torchls.analysis.rules._edits import insert_line_before
from torchls.analysis.rules._optimization import (
    CLIP_FUNCTIONS,
    _lowest_common_ancestor,
    _path_unconditional,
    _statement_of_call,
    block_of,
    clips_nothing,
    index_in,
    is_scaler_call,
    owns_lines,
    position,
)
from torchls.analysis.rules._optimization_clip_hooks import clamp_hook_registrations
from torchls.analysis.rules._optimization_scaled_helpers import (
    helpers_clipping_scaled,
    scaled_backward,
    scaled_by_callers,
)


@exemption("TL404", "neg_scaler_built_disabled.py")
def _scaler_disabled(facts: Facts, scaler: ast.expr | None) -> bool:
    """The scaler is built with `enabled=False` (`GradScaler(enabled=False)`): it scales
    nothing, so the gradients clipped are the true ones."""
    kind = facts.kind_of(scaler)
    constructor = kind.node if kind is not None else None
    if not isinstance(constructor, ast.Call):
        return False
    enabled = next((k.value for k in constructor.keywords if k.arg == "enabled"), None)
    return isinstance(enabled, ast.Constant) and enabled.value is False


@exemption("TL404", "neg_unscaled_before_clip.py")
def _unscaled_before(
    facts: Facts, calls: list[ast.Call], backward: ast.Call, clip: ast.Call
) -> bool:
    """An `unscale_()` call runs between the last scaled backward and the clip
    (`scaler.unscale_(optimizer)`): the clip sees the true gradients."""
    return any(
        position(backward) < position(c) < position(clip) and facts.method_name(c) == "unscale_"
        for c in calls
    )


@rule(
    "TL404",
    "clip-scaled-gradients",
    "E",
    "Gradient clipping on GradScaler-scaled gradients without unscale_()",
    fix="safe",
)
def clip_scaled_gradients(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    `clip_grad_norm_` / `clip_grad_value_` called between `scaler.scale(loss).backward()` and
    `scaler.step(optimizer)` with no `scaler.unscale_(optimizer)` before the clip. Also when
    the clip and the step sit in a project function (another file included, e.g. an updater
    object's method built in `__init__`) that the scaled backward's function calls next with
    the same scaler, and that function never unscales it: the finding is on that call, and
    on the clip itself when the callers of its function can be found. Also hooks that clamp
    each gradient as backward produces it (`p.register_hook(lambda g: g.clamp(-c, c))` on
    every parameter of a model, here or in a project helper handed the model), set up by
    code whose class (or function) steps through a GradScaler: they run on the scaled
    gradients, before any `unscale_` can.

    ## Why it is wrong
    After a scaled backward the gradients are multiplied by the loss scale (65536 at the
    start). Clipping them to `max_norm=1.0` compares the threshold with a norm thousands of
    times too large, so every step is clipped far too hard (and `clip_grad_value_` clips at a
    meaningless value); `scaler.step` then divides the already-clipped gradients by the scale
    again. Training crawls or diverges depending on the scale.

    ## Example
    ```python
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)   # TL404: still scaled
    scaler.step(optimizer)
    scaler.update()
    ```

    ## Fix
    Call `scaler.unscale_(optimizer)` right before clipping; `scaler.step` knows the gradients
    are already unscaled. The fix inserts it.
    """
    for clip in facts.calls_to(*CLIP_FUNCTIONS):
        if clips_nothing(facts, clip):
            continue
        scope = facts.enclosing_function(clip) or facts.tree
        calls = facts.calls_in(scope)
        here = position(clip)
        backwards = [c for c in calls if position(c) < here and scaled_backward(facts, c)]
        if not backwards:
            yield from _clip_of_scaled_callers(facts, clip)
            continue
        last_backward = backwards[-1]
        scaler = facts.receiver(facts.receiver(last_backward))  # type: ignore[arg-type]
        if _scaler_disabled(facts, scaler):
            continue
        if _unscaled_before(facts, calls, last_backward, clip):
            continue
        # The next scaled backward that always runs ends this clip's step; an optional one in
        # between (`if use_awp: scaler.scale(adv_loss).backward()`) leaves the gradients
        # scaled all the same.
        next_backward = next(
            (
                position(c)
                for c in calls
                if position(c) > here
                and scaled_backward(facts, c)
                and _path_unconditional(facts, c, _lowest_common_ancestor(facts, c, clip))
            ),
            None,
        )
        steps = [
            c
            for c in calls
            if position(c) > here
            and (next_backward is None or position(c) < next_backward)
            and is_scaler_call(facts, c, "step")
            and c.args
        ]
        if not steps:
            continue
        # An optional scaled backward between the clip and the step adds scaled gradients
        # after an unscale_() inserted here: the fix would be wrong, the finding is not.
        between = any(
            here < position(c) < position(steps[0]) and scaled_backward(facts, c) for c in calls
        )
        yield Hit(
            clip,
            f"`{facts.source.segment(clip.func)}` clips gradients that are still multiplied by "
            "the loss scale; call `scaler.unscale_(optimizer)` first",
            None if between else _insert_unscale(facts, clip, steps),
        )
    yield from _helper_clips(facts)
    yield from _clamp_hooks_under_scaler(facts)


def _clamp_hooks_under_scaler(facts: Facts) -> Iterator[Hit]:
    """Gradient-clamping hooks registered on a model's parameters by code whose class (or,
    outside classes, whose function) steps an enabled GradScaler: the hooks run during the
    scaled backward."""
    registrations = list(clamp_hook_registrations(facts))
    if not registrations:
        return
    steps = [
        c
        for c in facts.calls
        if is_scaler_call(facts, c, "step")
        and c.args
        and not _scaler_disabled(facts, facts.receiver(c))
    ]
    for call, model, owner, register in registrations:
        klass = facts.enclosing_class(call)
        step = next(
            (
                s
                for s in steps
                if (
                    facts.enclosing_class(s) is klass
                    if klass is not None
                    else facts.scope(s) is facts.scope(call)
                )
            ),
            None,
        )
        if step is None:
            continue
        scaler = facts.source.segment(facts.receiver(step))  # type: ignore[arg-type]
        filename = owner.filename if owner is not facts else None
        yield Hit(
            call,
            f"`{facts.source.segment(call.func)}` registers hooks that clamp each gradient of "
            f"`{facts.source.segment(model)}` during backward, while this code steps through "
            f"`{scaler}` (line {step.lineno}): the hooks see gradients still multiplied by the "
            "loss scale; clip after `scaler.unscale_(optimizer)` instead",
            related=(
                Related(owner.source.span(register), "hook registered here", filename),
                Related(facts.source.span(step), "scaled step here"),
            ),
        )


def _clip_of_scaled_callers(facts: Facts, clip: ast.Call) -> Iterator[Hit]:
    """A clip in a helper whose callers hand it gradients they scaled."""
    for owner, backward in scaled_by_callers(facts, clip)[:1]:
        where = Path(owner.filename).name if owner is not facts else "this file"
        yield Hit(
            clip,
            f"`{facts.source.segment(clip.func)}` clips gradients that the caller scaled "
            f"({where}, line {backward.lineno}) and that are still multiplied by the loss "
            "scale; call `scaler.unscale_(optimizer)` first",
            related=(
                Related(
                    owner.source.span(backward),
                    "loss scaled here",
                    owner.filename if owner is not facts else None,
                ),
            ),
        )


def _helper_clips(facts: Facts) -> Iterator[Hit]:
    """The scaled gradients handed to a helper that clips them before `scaler.step`."""
    for backward in facts.calls:
        if not scaled_backward(facts, backward):
            continue
        scaler = facts.receiver(facts.receiver(backward))  # type: ignore[arg-type]
        if scaler is None or _scaler_disabled(facts, scaler):
            continue
        for call, owner, clip in helpers_clipping_scaled(facts, backward, scaler):
            filename = owner.filename if owner is not facts else None
            yield Hit(
                call,
                f"`{facts.source.segment(call.func)}` clips the gradients scaled by "
                f"`{facts.source.segment(scaler)}` (line {backward.lineno}) before "
                "`scaler.step` without `unscale_()`: the clip compares the norm of "
                "gradients multiplied by the loss scale; call `scaler.unscale_(optimizer)` "
                "before clipping",
                related=(Related(owner.source.span(clip), "clipped here", filename),),
            )


def _insert_unscale(facts: Facts, clip: ast.Call, steps: list[ast.Call]) -> Fix | None:
    if len(steps) != 1:
        return None
    step = steps[0]
    clip_stmt = facts.enclosing_statement(clip)
    step_stmt = _statement_of_call(facts, step)
    if clip_stmt is None or step_stmt is None or not owns_lines(facts, clip_stmt):
        return None
    step_block = block_of(facts, step_stmt)
    current: ast.AST = clip_stmt
    while step_block is not None and not any(item is current for item in step_block):
        # Up through `if`/`with` only: the clip then runs at most once per step. A clip that
        # runs where the step is conditional (accumulation) would unscale twice and raise.
        current = facts.parents.get(current)  # type: ignore[assignment]
        if not isinstance(current, (ast.If, ast.With, ast.AsyncWith)):
            return None
    if step_block is None:
        return None
    if index_in(step_block, current) > index_in(step_block, step_stmt):  # type: ignore[arg-type]
        return None
    scaler_text = facts.source.segment(facts.receiver(step))  # type: ignore[arg-type]
    optimizer_text = facts.source.segment(step.args[0])
    return Fix(
        "safe",
        f"Insert `{scaler_text}.unscale_({optimizer_text})` before clipping",
        (insert_line_before(facts, clip_stmt, f"{scaler_text}.unscale_({optimizer_text})"),),
    )
