"""TL702 `fast-dev-run-hides-callbacks`: a Lightning `Trainer(fast_dev_run=...)` given
checkpoint, early-stopping or monitoring callbacks or a logger, which that flag turns off.

In: the file's `Facts`. Out: one hit at the `fast_dev_run` argument, naming what it disables.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.registry import Hit, exemption, rule
from torchls.analysis.rules._lightning import MAX_DEPTH

LIGHTNING_ROOTS = ("lightning", "pytorch_lightning")
# What `fast_dev_run` turns off (Lightning docs: checkpointing, early stopping, loggers and
# the logger-driven callbacks).
DISABLED_CALLBACKS = {
    "ModelCheckpoint",
    "EarlyStopping",
    "LearningRateMonitor",
    "DeviceStatsMonitor",
}


def _is_trainer(facts: Facts, call: ast.Call) -> bool:
    qualname = facts.call_qualname(call) or ""
    return qualname.split(".")[0] in LIGHTNING_ROOTS and qualname.endswith(".Trainer")


def _truthy_constant(expr: ast.expr) -> bool:
    return (
        isinstance(expr, ast.Constant)
        and not isinstance(expr.value, str)
        and expr.value is not None
        and bool(expr.value)
    )


@exemption("TL702", "neg_fast_dev_run_from_flag.py")
def _not_a_true_literal(flag: ast.expr) -> bool:
    """`fast_dev_run` is not a true literal: `False`, `0`, or a value decided at run time
    (`fast_dev_run=args.debug`), so the real run keeps its callbacks and loggers."""
    return not _truthy_constant(flag)


@exemption("TL702", "neg_fast_dev_run_custom_callbacks.py")
def _nothing_it_disables(disabled: list[str]) -> bool:
    """The Trainer is given no callback or logger that `fast_dev_run` turns off: only
    callbacks of the user's own (a `Callback` subclass that prints shapes) and `logger=False`."""
    return not disabled


def _resolve(facts: Facts, expr: ast.expr) -> ast.expr:
    if isinstance(expr, ast.Name):
        value = facts.binding_value(expr)
        if value is not None:
            return value
    return expr


def _constructor_name(facts: Facts, expr: ast.expr, depth: int = 0) -> str | None:
    """`ModelCheckpoint` for `ModelCheckpoint(...)` (or a name bound to it, or an in-file
    subclass of it)."""
    expr = _resolve(facts, expr)
    if not isinstance(expr, ast.Call):
        return None
    name = facts.short_name(expr)
    info = facts.classes.get(name) if isinstance(expr.func, ast.Name) else None
    if info is not None and depth < MAX_DEPTH:
        for base in info.bases:
            short = base.split(".")[-1]
            if short in DISABLED_CALLBACKS:
                return short
    return name


def _elements(facts: Facts, expr: ast.expr) -> list[ast.expr]:
    expr = _resolve(facts, expr)
    if isinstance(expr, (ast.List, ast.Tuple)):
        return [e for e in expr.elts if not isinstance(e, ast.Starred)]
    return [expr]


def _disabled_by_fast_dev_run(facts: Facts, call: ast.Call) -> list[str]:
    disabled: list[str] = []
    for keyword in call.keywords:
        if keyword.arg == "callbacks":
            for element in _elements(facts, keyword.value):
                name = _constructor_name(facts, element)
                if name in DISABLED_CALLBACKS and name not in disabled:
                    disabled.append(name)
        elif keyword.arg == "logger":
            for element in _elements(facts, keyword.value):
                name = _constructor_name(facts, element)
                if name is not None and name.endswith("Logger") and name not in disabled:
                    disabled.append(name)
    return disabled


@rule(
    "TL702",
    "fast-dev-run-hides-callbacks",
    "I",
    "Trainer(fast_dev_run=...) disables the checkpoint/early-stopping/logger it is given",
)
def fast_dev_run_hides_callbacks(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    A Lightning `Trainer(fast_dev_run=True)` (or a number of batches) built together with
    `ModelCheckpoint`, `EarlyStopping`, `LearningRateMonitor`, `DeviceStatsMonitor` callbacks
    or a logger.

    ## Why it is wrong
    `fast_dev_run` is a smoke test: it runs a batch or a few and turns off checkpointing,
    early stopping, loggers and the callbacks that depend on them. A run meant to check that
    checkpoints get written or metrics get logged passes without exercising either, so the
    problem shows up only in the real run.

    ## Example
    ```python
    trainer = L.Trainer(
        fast_dev_run=True,                               # TL702
        callbacks=[ModelCheckpoint(monitor="val_loss")],
        logger=TensorBoardLogger("logs"),
    )
    ```

    ## Fix
    To test the callbacks and loggers on a short run, use
    `limit_train_batches=2, limit_val_batches=2, max_epochs=1` instead of `fast_dev_run`.
    No automatic fix.
    """
    for call in facts.calls:
        if not _is_trainer(facts, call):
            continue
        flag = next((k for k in call.keywords if k.arg == "fast_dev_run"), None)
        if flag is None or _not_a_true_literal(flag.value):
            continue
        disabled = _disabled_by_fast_dev_run(facts, call)
        if _nothing_it_disables(disabled):
            continue
        names = ", ".join(f"`{name}`" for name in disabled)
        yield Hit(
            flag,
            f"`fast_dev_run` disables {names} in this Trainer: they are not exercised; use "
            "`limit_train_batches` / `limit_val_batches` for a short run that keeps them",
        )
