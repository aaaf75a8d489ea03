"""TL407 `plateau-step-without-metric`: the rule module.

Checks that a `ReduceLROnPlateau` is stepped with the metric it monitors. In: the file's
`Facts`. Out: hits (no fix).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.findings import Related
from torchls.analysis.registry import Hit, exemption, rule
from torchls.analysis.rules._optimization import method_calls, names_in
from torchls.analysis.rules._optimization_narrowing import narrowed_scheduler, plateau_may_reach
from torchls.analysis.schedulers import hook_plateaus, scheduler_type


@exemption("TL407", "neg_plateau_with_metric.py")
def _metric_passed(call: ast.Call) -> bool:
    """`step(...)` is given an argument (`scheduler.step(val_loss)`, `step(metrics=...)`): the
    monitored value the plateau scheduler needs."""
    return bool(call.args or call.keywords)


@exemption("TL407", "neg_plateau_stepped_by_type_checking_helper.py")
def _type_tested_around(facts: Facts, call: ast.Call) -> bool:
    """The plain `step()` sits under a branch that tests the scheduler's type (`isinstance`,
    `type(...)`, the `ReduceLROnPlateau` name) without saying it is one: the code steps
    other schedulers there, the plateau one elsewhere with its metric."""
    branches = facts.conditions_between(call, facts.scope(call))
    return any(
        {"isinstance", "ReduceLROnPlateau", "type"} & names_in(branch.test) for branch in branches
    )


@rule(
    "TL407",
    "plateau-step-without-metric",
    "E",
    "ReduceLROnPlateau.step() called without the monitored metric",
)
def plateau_step_without_metric(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    `scheduler.step()` with no argument where `scheduler` is a `ReduceLROnPlateau`: every
    binding of the name builds one, or the branch the call sits in tests that it is one
    (`isinstance(scheduler, ReduceLROnPlateau)`, or its class name compared as text), as
    happens when the scheduler's class is chosen at run time. Also a LightningModule's
    `lr_scheduler_step(self, scheduler, metric)` hook that steps the scheduler it is handed
    with `step()`, past its own type tests, when `configure_optimizers` (itself or through
    the helper whose result it returns) builds a `ReduceLROnPlateau` for some option:
    under that option Lightning hands the hook the plateau scheduler, and the metric the
    hook receives goes unused.

    ## Why it is wrong
    `ReduceLROnPlateau` decides from the value it is given: `step(metrics)` is its required
    argument. Called without it, `step()` raises a `TypeError` at the end of the first epoch,
    typically after a full epoch of training was spent, and the epoch's checkpoint is never
    written.

    ## Example
    ```python
    scheduler = ReduceLROnPlateau(optimizer, mode="min", patience=5)
    for epoch in range(epochs):
        train_one_epoch(...)
        val_loss = evaluate(...)
        scheduler.step()             # TL407: pass val_loss
    ```

    ## Fix
    Pass the monitored value: `scheduler.step(val_loss)`. No automatic fix (which metric to
    pass is the author's choice).
    """
    for call in method_calls(facts, "step"):
        if _metric_passed(call):
            continue
        hook = _hook_plateaus(facts, call)
        if hook:
            text = facts.source.segment(facts.receiver(call))  # type: ignore[arg-type]
            yield Hit(
                call,
                "`configure_optimizers` may hand this hook a ReduceLROnPlateau: "
                f"`{text}.step()` needs the monitored metric the hook receives, e.g. "
                f"`{text}.step(metric)` (without it, it raises TypeError)",
                None,
                tuple(
                    Related(
                        owner.source.span(built),
                        "plateau scheduler built here",
                        owner.filename if owner is not facts else None,
                    )
                    for owner, built in hook
                ),
            )
            continue
        text = facts.source.segment(facts.receiver(call))  # type: ignore[arg-type]
        narrowed = narrowed_scheduler(facts, call)
        if narrowed is not None:
            # The branch's own type test says what the scheduler is, whatever was chosen.
            if narrowed == "ReduceLROnPlateau":
                yield Hit(
                    call,
                    f"`{text}` is a ReduceLROnPlateau in this branch (its type is tested "
                    f"above): `step()` needs the monitored metric, e.g. `{text}.step(val_loss)` "
                    "(without it, it raises TypeError)",
                )
            continue
        found = scheduler_type(facts, facts.receiver(call))
        if found is None or found[0] != "ReduceLROnPlateau":
            continue
        if _type_tested_around(facts, call):
            continue
        yield Hit(
            call,
            f"`{text}` is a ReduceLROnPlateau: `step()` needs the monitored metric, e.g. "
            f"`{text}.step(val_loss)` (without it, it raises TypeError)",
        )


def _hook_plateaus(facts: Facts, call: ast.Call) -> list[tuple[Facts, ast.Call]]:
    """For `scheduler.step()` in a LightningModule's `lr_scheduler_step(self, scheduler,
    metric)` on the hook's own `scheduler`, reachable by a plateau scheduler past the hook's
    type tests: the plateau constructors `configure_optimizers` returns (see
    `hook_plateaus`)."""
    function = facts.enclosing_function(call)
    receiver = facts.receiver(call)
    if function is None or not isinstance(receiver, ast.Name):
        return []
    params = [a.arg for a in function.args.args]
    if len(params) < 3 or receiver.id != params[1]:
        return []
    if any(a.stmt is not function for a in facts.assignments_of(receiver.id, function)):
        return []  # rebound in the hook: not the scheduler Lightning handed over
    if not plateau_may_reach(facts, call, function):
        return []
    if any(
        isinstance(n, ast.Name) and n.id == params[2]
        for branch in facts.conditions_between(call, function)
        for n in ast.walk(branch.test)
    ):
        return []  # `if metric is None: scheduler.step()`: no metric, so no plateau monitor
    return hook_plateaus(facts, function)
