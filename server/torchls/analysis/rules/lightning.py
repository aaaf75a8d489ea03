"""TL7xx: PyTorch Lightning, where the Trainer owns the training loop.

In: the file's `Facts`. Out: hits for a `LightningModule.training_step` that runs backward /
step / zero_grad itself while Lightning's automatic optimization does the same, and for a
`Trainer(fast_dev_run=...)` that silently disables the callbacks and loggers it is given.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import ClassInfo, Facts, FunctionNode
from torchls.analysis.registry import Hit, rule

LIGHTNING_ROOTS = ("lightning", "pytorch_lightning")
# What `fast_dev_run` turns off (Lightning docs: checkpointing, early stopping, loggers and
# the logger-driven callbacks).
DISABLED_CALLBACKS = {
    "ModelCheckpoint",
    "EarlyStopping",
    "LearningRateMonitor",
    "DeviceStatsMonitor",
}
MAX_DEPTH = 6


def _is_lightning_base(base: str) -> bool:
    return base.split(".")[-1] == "LightningModule"


def _class_chain(facts: Facts, info: ClassInfo, depth: int = 0) -> list[ClassInfo] | None:
    """The class and its in-file ancestors when every base is either LightningModule or an
    in-file class leading to it; None when a base is unknown (it could switch automatic
    optimization off) or the class is not a LightningModule."""
    if depth > MAX_DEPTH:
        return None
    chain = [info]
    reaches_lightning = False
    for base in info.bases:
        if _is_lightning_base(base):
            reaches_lightning = True
            continue
        parent = facts.classes.get(base)
        if parent is None or parent is info:
            return None
        above = _class_chain(facts, parent, depth + 1)
        if above is None:
            return None
        chain.extend(above)
        reaches_lightning = True
    return chain if reaches_lightning else None


def _subclasses(facts: Facts, name: str, depth: int = 0) -> list[ClassInfo]:
    if depth > MAX_DEPTH:
        return []
    found = []
    for info in facts.classes.values():
        if name in info.bases:
            found.append(info)
            found.extend(_subclasses(facts, info.node.name, depth + 1))
    return found


def _sets_automatic_optimization(info: ClassInfo) -> bool:
    """Any sign that the class controls automatic optimization (other than setting it True)."""
    for value in info.attributes.get("automatic_optimization", []):
        if not (isinstance(value, ast.Constant) and value.value is True):
            return True
    if "automatic_optimization" in info.methods:
        return True
    for stmt in info.node.body:
        targets = []
        if isinstance(stmt, ast.Assign):
            targets = stmt.targets
        elif isinstance(stmt, ast.AnnAssign):
            targets = [stmt.target]
        if any(isinstance(t, ast.Name) and t.id == "automatic_optimization" for t in targets):
            return True
    return False


def _optimizer_expression(facts: Facts, expr: ast.expr | None) -> bool:
    """`self.optimizers()`, a name bound from it, or anything the facts call an optimizer."""
    if expr is None:
        return False
    if isinstance(expr, ast.Subscript):
        expr = expr.value
    if isinstance(expr, ast.Call) and facts.method_name(expr) == "optimizers":
        return True
    if isinstance(expr, ast.Name):
        assignment = facts.reaching_assignment(expr)
        value = assignment.value if assignment is not None else None
        if isinstance(value, ast.Subscript):
            value = value.value
        if isinstance(value, ast.Call) and facts.method_name(value) == "optimizers":
            return True
    return facts.is_kind(expr, "optimizer")


def _inner_optimizer(facts: Facts, expr: ast.expr | None) -> bool:
    """`expr` names an optimizer its own function builds over modules that are not this
    LightningModule's (`inner = SGD(task_copy.parameters())` for a meta-learning inner loop):
    Lightning never sees it, so stepping and clearing it by hand is the only way it runs."""
    if not isinstance(expr, ast.Name):
        return False
    function = facts.enclosing_function(expr)
    if function is None:
        return False
    assignments = facts.assignments_of(expr.id, function)
    if not assignments:
        return False
    for assignment in assignments:
        value = assignment.value
        kind = facts.kind_of(value) if isinstance(value, ast.Call) else None
        if kind is None or kind.kind != "optimizer" or kind.node is not value:
            return False
        if facts.method_name(value) == "optimizers":
            return False
    owners = facts.optimizer_parameter_owners(expr)
    return bool(owners) and not any(o == "self" or o.startswith("self.") for o in owners)


def _inner_loop_backward(facts: Facts, call: ast.Call) -> bool:
    """A `backward()` inside a loop that steps an inner optimizer (see `_inner_optimizer`):
    the gradients of that loop's own update."""
    loops = facts.enclosing_loops(call)
    if not loops:
        return False
    return any(
        facts.method_name(inner) == "step" and _inner_optimizer(facts, facts.receiver(inner))
        for inner in facts.calls_in(loops[0])
    )


def _manual_optimization_call(facts: Facts, call: ast.Call) -> str | None:
    """What `call` does by hand: "backward", "manual_backward", "step" or "zero_grad"."""
    method = facts.method_name(call)
    if method == "manual_backward":
        return "manual_backward"
    if facts.is_backward(call):
        return None if _inner_loop_backward(facts, call) else "backward"
    if method in ("step", "zero_grad") and _inner_optimizer(facts, facts.receiver(call)):
        return None
    if method == "step" and _optimizer_expression(facts, facts.receiver(call)):
        return "step"
    if method == "zero_grad":
        return "zero_grad"
    return None


def _helpers_of(facts: Facts, function: FunctionNode, depth: int = 0) -> list[FunctionNode]:
    """`function` and the in-file methods/functions it calls (a few levels deep)."""
    found = [function]
    if depth >= 2:
        return found
    for call in facts.calls_in(function):
        called = facts.called_function(call)
        if called is not None and called is not function and called not in found:
            found.extend(f for f in _helpers_of(facts, called, depth + 1) if f not in found)
    return found


@rule(
    "TL701",
    "manual-backward-in-automatic-optimization",
    "E",
    "training_step runs backward/step/zero_grad under automatic optimization",
)
def manual_backward_in_automatic_optimization(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    A `LightningModule` whose `training_step` (or a method it calls) runs `loss.backward()`,
    `self.manual_backward(loss)`, `optimizer.step()` or `zero_grad()` itself, while the class
    never sets `self.automatic_optimization = False`. Classes with a base defined outside the
    file are skipped (the base may switch it off). An inner loop's own optimizer, built in
    the method over modules that are not the LightningModule's (a head fitted per episode, a
    task copy adapted in meta-learning), is not Lightning's to run: its backward, step and
    zero_grad are not reported.

    ## Why it is wrong
    With automatic optimization (the default) Lightning runs backward, the optimizer step and
    `zero_grad` around `training_step` using the loss it returns. Doing it by hand as well
    means two backward passes (or a "graph already freed" error), two steps per batch, or
    gradients cleared before Lightning's step, and it bypasses precision plugins, gradient
    accumulation and clipping configured on the Trainer. `manual_backward` is only for manual
    optimization.

    ## Example
    ```python
    class Model(L.LightningModule):
        def training_step(self, batch, batch_idx):
            loss = self.compute_loss(batch)
            loss.backward()                 # TL701
            self.optimizers().step()        # TL701
            return loss
    ```

    ## Fix
    Return the loss and let Lightning optimize; or opt in to manual optimization with
    `self.automatic_optimization = False` in `__init__` and use `self.manual_backward(loss)`,
    `opt.step()` and `opt.zero_grad()`. No automatic fix.
    """
    for info in facts.classes.values():
        training_step = info.methods.get("training_step")
        if training_step is None:
            continue
        chain = _class_chain(facts, info)
        if chain is None:
            continue
        related = chain + _subclasses(facts, info.node.name)
        if any(_sets_automatic_optimization(member) for member in related):
            continue
        own_classes = [member.node for member in chain]
        seen: set[int] = set()
        for function in _helpers_of(facts, training_step):
            if not any(facts.enclosing_class(function) is klass for klass in own_classes):
                continue  # a free function may serve plain loops too: only the class's methods
            for call in facts.calls_in(function):
                what = _manual_optimization_call(facts, call)
                if what is None or id(call) in seen:
                    continue
                seen.add(id(call))
                where = (
                    "in `training_step`"
                    if function is training_step
                    else f"in `{function.name}` (called from `training_step`)"
                )
                yield Hit(
                    call,
                    f"`{facts.source.segment(call)}` {where} while automatic optimization is on: "
                    f"Lightning already runs {_lightning_does(what)}; return the loss, or set "
                    "`self.automatic_optimization = False`",
                )


def _lightning_does(what: str) -> str:
    return {
        "backward": "backward() on the returned loss",
        "manual_backward": "backward() on the returned loss (manual_backward is for manual "
        "optimization)",
        "step": "the optimizer step",
        "zero_grad": "zero_grad()",
    }[what]


# ---------------------------------------------------------------------- TL702
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
        if flag is None or not _truthy_constant(flag.value):
            continue
        disabled = _disabled_by_fast_dev_run(facts, call)
        if not disabled:
            continue
        names = ", ".join(f"`{name}`" for name in disabled)
        yield Hit(
            flag,
            f"`fast_dev_run` disables {names} in this Trainer: they are not exercised; use "
            "`limit_train_batches` / `limit_val_batches` for a short run that keeps them",
        )
