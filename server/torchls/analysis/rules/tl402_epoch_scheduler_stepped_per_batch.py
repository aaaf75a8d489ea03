"""TL402 `epoch-scheduler-stepped-per-batch`: the rule module.

Checks that a scheduler is stepped at the rate its schedule is sized in: epoch schedules once
per epoch, batch-sized ones once per batch. In: the file's `Facts`. Out: hits pointing at the
constructor, with an unsafe fix moving a per-batch step of an epoch schedule after the loop.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.findings import Fix
from torchls.analysis.objects import ObjectModel
from torchls.analysis.registry import Hit, exemption, rule
from torchls.analysis.rules._edits import insert_line_after
from torchls.analysis.rules._optimization import (
    _optimizer_step_inside,
    _statement_of_call,
    is_scheduler_step,
    loop_counters,
    method_calls,
    movable,
    names_in,
    owns_lines,
    statement_text,
)
from torchls.analysis.rules._optimization_narrowing import (
    TYPE_DESIGNS,
    narrowed_scheduler,
    tests_only_scheduler,
)
from torchls.analysis.schedulers import (
    constructor_related,
    schedule_design,
    scheduler_constructors,
)


def _per_batch_loop(facts: Facts, call: ast.Call) -> ast.AST | None:
    """The outermost training batch loop `call` runs in, in its own function."""
    loops = [loop for loop in facts.enclosing_loops(call) if facts.is_training_batch_loop(loop)]
    return loops[-1] if loops else None


@exemption("TL402", "neg_matching_rates.py")
def _counted_branch(facts: Facts, condition: ast.If, counters: set[str]) -> bool:
    """The step inside the batch loop sits under a test of the loop's counter or of a `len()`
    (`if (i + 1) % len(loader) == 0:`), with no optimizer step in that branch: it runs once
    per epoch or per evaluation, not once per batch."""
    mentions_len = any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "len"
        for n in ast.walk(condition.test)
    )
    return bool(names_in(condition.test) & counters or mentions_len) and not (
        _optimizer_step_inside(facts, condition)
    )


def _stepped_per_batch(facts: Facts, call: ast.Call) -> tuple[bool, ast.AST | None]:
    """(True, batch loop) when `call` runs once per training batch (the loop is None when the
    call sits in a helper called from batch loops)."""
    loop = _per_batch_loop(facts, call)
    if loop is not None:
        counters = loop_counters(facts, loop)
        for condition in facts.conditions_between(call, loop):
            if tests_only_scheduler(facts, condition.test, facts.receiver(call)):
                continue
            if _counted_branch(facts, condition, counters):
                return False, None  # once per epoch / per evaluation, not per batch
        return True, loop
    function = facts.enclosing_function(call)
    if function is None or facts.enclosing_loops(call):
        return False, None
    sites = facts.call_sites(function)
    if not sites or not all(_per_batch_loop(facts, site) is not None for site in sites):
        return False, None
    receiver = facts.receiver(call)
    if any(
        not _optimizer_step_inside(facts, c) and not tests_only_scheduler(facts, c.test, receiver)
        for c in facts.conditions_between(call, function)
    ):
        return False, None
    return True, None


def _stepped_per_epoch(facts: Facts, call: ast.Call) -> bool:
    """True when `call` runs once per epoch: after (not inside) the training batch loop."""
    if _per_batch_loop(facts, call) is not None:
        return False
    loops = facts.enclosing_loops(call)
    if loops:
        loop = loops[0]
        if facts.is_training_batch_loop(loop) or loop in facts.batch_loops:
            return False
        return facts.contains_training_batch_loop(loop) or facts.calls_training_helper(loop)
    function = facts.enclosing_function(call)
    if function is None or not facts.contains_training_batch_loop(function):
        return False
    sites = facts.call_sites(function)
    return bool(sites) and all(
        facts.enclosing_loops(site) and _per_batch_loop(facts, site) is None for site in sites
    )


@rule(
    "TL402",
    "epoch-scheduler-stepped-per-batch",
    "W",
    "Scheduler stepped at the wrong rate (epoch schedule per batch, or the reverse)",
    fix="unsafe",
)
def epoch_scheduler_stepped_per_batch(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    An epoch-based scheduler (`StepLR`, `MultiStepLR`, `ExponentialLR`, `ReduceLROnPlateau`,
    or a `CosineAnnealingLR` whose `T_max` is a number of epochs) stepped inside the training
    batch loop; or a per-batch schedule (`OneCycleLR` sized with `steps_per_epoch` or a step
    count, `CyclicLR`) stepped once per epoch. Warmup `LambdaLR`s, HF schedules and any
    schedule sized in steps (`T_max=epochs * len(loader)`) are per-batch by design and are not
    reported; when the unit of the schedule cannot be told, nothing is reported. A scheduler
    that a training function receives as a parameter is the one its in-file callers pass; one
    chosen among several types (`StepLR` or `MultiStepLR` by a config branch) is reported when
    every type is stepped at the same, wrong, rate. A step inside a branch that tests the
    scheduler's type (`isinstance(s, ReduceLROnPlateau)`, or the class name as text) is
    judged for that type alone, even when the class is chosen at run time and no constructor
    is in sight (a plateau stepped in a helper called once per batch); a condition that only
    tests whether the scheduler is set, or its type, does not change how often it steps.

    ## Why it is wrong
    A schedule's length is counted in calls to `step()`. A `StepLR(step_size=30)` meant as
    "every 30 epochs" stepped every batch decays the learning rate every 30 *batches*: after a
    few hundred batches the learning rate is effectively zero and training stalls. The
    reverse, a `OneCycleLR` sized in batches stepped once per epoch, never leaves its warmup.

    ## Example
    ```python
    scheduler = StepLR(optimizer, step_size=30, gamma=0.1)
    for epoch in range(epochs):
        for x, y in train_loader:
            ...
            optimizer.step()
            scheduler.step()        # TL402: epoch schedule stepped per batch
    ```

    ## Fix
    Step epoch schedules once per epoch, after the batch loop; step per-batch schedules right
    after `optimizer.step()`. For an epoch schedule stepped per batch, the quick fix moves the
    call after the batch loop; it is unsafe because it changes the learning rate.
    """
    for call in method_calls(facts, "step"):
        if not is_scheduler_step(facts, call):
            continue
        # Every binding must be a known scheduler; several types (chosen by a config
        # branch) count when they are all meant to be stepped at the same rate.
        constructors = scheduler_constructors(facts, facts.receiver(call))
        narrowed = narrowed_scheduler(facts, call)
        if constructors and narrowed is not None:
            # Among the types a configuration may build, the branch steps only this one.
            model = facts.get(ObjectModel)
            constructors = [c for c in constructors if model.owner_of(c).short_name(c) == narrowed]
            if not constructors:
                continue
        if constructors:
            model = facts.get(ObjectModel)
            name = "/".join(sorted({model.owner_of(c).short_name(c) for c in constructors}))
            designs = {schedule_design(facts, c) for c in constructors}
        else:
            # Chosen at run time: a type test around the step can still say what it is.
            name = narrowed or ""
            designs = {TYPE_DESIGNS[name]} if name in TYPE_DESIGNS else set()
        if len(designs) != 1:
            continue
        design = designs.pop()
        scheduler_text = facts.source.segment(facts.receiver(call))  # type: ignore[arg-type]
        if design == "epoch":
            per_batch, loop = _stepped_per_batch(facts, call)
            if not per_batch:
                continue
            yield Hit(
                call,
                f"`{scheduler_text}` ({name}) is an epoch schedule, but it is stepped every "
                "batch: the schedule runs as many times too fast as there are batches per "
                "epoch; step it once per epoch, after the batch loop",
                _move_after_loop(facts, call, loop),
                constructor_related(facts, constructors),
            )
        elif design == "batch":
            if not _stepped_per_epoch(facts, call):
                continue
            yield Hit(
                call,
                f"`{scheduler_text}` ({name}) is sized in batches, but it is stepped once per "
                "epoch: the schedule barely moves; step it after every `optimizer.step()`",
                related=constructor_related(facts, constructors),
            )


def _move_after_loop(facts: Facts, call: ast.Call, loop: ast.AST | None) -> Fix | None:
    stmt = _statement_of_call(facts, call)
    if stmt is None or not isinstance(loop, ast.stmt) or not owns_lines(facts, loop):
        return None
    deletion = movable(facts, stmt)
    if deletion is None:
        return None
    text = statement_text(facts, stmt)
    return Fix(
        "unsafe",
        "Move the scheduler step after the batch loop",
        (deletion, insert_line_after(facts, loop, text)),
    )
