"""TL401 `scheduler-before-optimizer`: the rule module.

Checks that a loop (or a helper that is one epoch) does not step the learning-rate scheduler
before the optimizer it schedules. In: the file's `Facts`. Out: hits, with an unsafe fix that
moves the scheduler step after the last statement stepping the optimizer.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.findings import Fix
from torchls.analysis.registry import Hit, exemption, rule
from torchls.analysis.rules._edits import insert_line_after
from torchls.analysis.rules._optimization import (
    _FUNCTION_TYPES,
    _LOOP_TYPES,
    _statement_of_call,
    block_of,
    index_in,
    is_scheduler_step,
    loop_counters,
    method_calls,
    movable,
    names_in,
    owns_lines,
    statement_text,
)
from torchls.analysis.schedulers import call_argument, hand_written_scheduler, scheduler_type


def _scheduler_optimizer_key(facts: Facts, constructors: list[ast.Call]) -> str | None:
    keys = {facts.key(call_argument(c, "optimizer", 0)) for c in constructors}
    return keys.pop() if len(keys) == 1 else None


@exemption("TL401", "neg_hand_written_warmup_setter.py")
def _project_scheduler(facts: Facts, call: ast.Call, found: object) -> bool:
    """The stepped scheduler is a class of the project's own (no base outside the project),
    whose `step()` follows its author's contract: typically it writes the rate for the coming
    update into the param groups."""
    return found is None and hand_written_scheduler(facts, facts.receiver(call))


@exemption("TL401", "neg_scheduler_stepped_after_first_epoch.py")
def _skips_first_iteration(parent: ast.AST, counters: set[str]) -> bool:
    """The scheduler step sits under an `if` on the loop's counter (`if epoch > 0:`), which
    skips the first iteration on purpose."""
    return isinstance(parent, ast.If) and bool(names_in(parent.test) & counters)


@rule(
    "TL401",
    "scheduler-before-optimizer",
    "W",
    "scheduler.step() runs before the first optimizer.step() of the loop",
    fix="unsafe",
)
def scheduler_before_optimizer(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    `scheduler.step()` called in a loop before that loop's `optimizer.step()` (directly or in a
    helper such as `train_one_epoch(...)`, also one in another project module): at the top of
    the epoch loop before the batches, at the top of the batch loop before the update, or at
    the top of a helper that runs the batch loop itself.

    ## Why it is wrong
    Since PyTorch 1.1 the scheduler must be stepped *after* the optimizer. Stepping it first
    moves the learning rate on before a single update used the initial value: the first value
    of the schedule (the first epoch of a StepLR, the first warmup step) is skipped, and the
    whole schedule runs one step early. PyTorch warns about it at run time.

    ## Example
    ```python
    for epoch in range(epochs):
        scheduler.step()                 # TL401: before any optimizer.step() of the epoch
        train_one_epoch(model, loader, optimizer)
    ```

    ## Fix
    Step the scheduler after the optimizer: at the end of the epoch loop (after the batch
    loop) for epoch schedules, right after `optimizer.step()` for per-batch ones. The quick fix
    moves the call after the last statement that steps the optimizer; it is unsafe because it
    changes the learning rate of every epoch.
    """
    for call in method_calls(facts, "step"):
        if not is_scheduler_step(facts, call) or call.args or call.keywords:
            continue
        stmt = _statement_of_call(facts, call)
        loops: list[ast.AST] = list(facts.enclosing_loops(call))
        if stmt is not None and not loops:
            # At the top of a helper that runs the batch loop (`train_one_epoch`): the helper
            # is one epoch, so its body plays the part of the epoch loop's.
            function = facts.enclosing_function(call)
            if function is not None and facts.contains_training_batch_loop(function):
                loops = [function]
        if stmt is None or not loops:
            continue
        found = scheduler_type(facts, facts.receiver(call))
        if _project_scheduler(facts, call, found):
            continue  # its own step() contract: setting the rate for the coming update, say
        optimizer_key = _scheduler_optimizer_key(facts, found[1]) if found else None

        def steps_optimizer(node: ast.AST, wanted: str | None = optimizer_key) -> bool:
            def predicate(candidate: ast.Call) -> bool:
                optimizer = facts.optimizer_of_step(candidate)
                if optimizer is None:
                    return _steps_in_other_file(facts, candidate)
                key = facts.key(optimizer)
                return wanted is None or key is None or key == wanted

            return facts.node_reaches(node, predicate)

        verdict = _scheduler_position(facts, stmt, loops[0], steps_optimizer)
        if verdict is None:
            continue
        later = verdict if verdict is not stmt else None
        scheduler_text = facts.source.segment(facts.receiver(call))  # type: ignore[arg-type]
        fix = None
        deletion = movable(facts, stmt)
        if later is not None and deletion is not None and owns_lines(facts, later):
            fix = Fix(
                "unsafe",
                f"Move `{scheduler_text}.step()` after the optimizer step",
                (deletion, insert_line_after(facts, later, statement_text(facts, stmt))),
            )
        yield Hit(
            call,
            f"`{scheduler_text}.step()` runs before the optimizer is stepped in this loop: the "
            "first value of the schedule is skipped; step the scheduler after the optimizer",
            fix,
        )


def _steps_in_other_file(facts: Facts, call: ast.Call) -> bool:
    """`call` runs a function of another project file whose summary steps an optimizer
    (`engine.train_one_epoch(...)`); in-file helpers are followed by `node_reaches` itself."""
    asked = facts.call_summary(call)
    return asked is not None and asked[2] is not facts and asked[0].steps_optimizer


def _scheduler_position(
    facts: Facts, stmt: ast.stmt, loop: ast.AST, steps_optimizer: Callable[[ast.AST], bool]
) -> ast.stmt | None:
    """For a `scheduler.step()` statement inside `loop`: the last later sibling statement that
    steps the optimizer when the scheduler is stepped first in the iteration; else None."""
    counters = loop_counters(facts, loop)
    current: ast.stmt = stmt
    later_sibling: ast.stmt | None = None
    found_later = False
    while True:
        block = block_of(facts, current)
        if block is None:
            return None
        index = index_in(block, current)
        if any(steps_optimizer(earlier) for earlier in block[:index]):
            return None
        if not found_later:
            later = [s for s in block[index + 1 :] if steps_optimizer(s)]
            if later:
                found_later = True
                if current is stmt:
                    later_sibling = later[-1]
        parent = facts.parents.get(current)
        if parent is loop:
            break
        if parent is None or isinstance(parent, _FUNCTION_TYPES):
            return None
        if isinstance(parent, _LOOP_TYPES):
            return None
        if not found_later and _skips_first_iteration(parent, counters):
            return None  # `if epoch > 0: scheduler.step()` skips the first iteration on purpose
        current = parent  # type: ignore[assignment]
    if not found_later:
        return None
    return later_sibling if later_sibling is not None else stmt
