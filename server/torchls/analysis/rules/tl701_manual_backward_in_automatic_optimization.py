"""TL701 `manual-backward-in-automatic-optimization`: a `LightningModule.training_step` (or a
method it calls) that runs backward / step / zero_grad itself while Lightning's automatic
optimization does the same.

In: the file's `Facts` (its classes, read up the in-file class chain). Out: one hit per manual
optimization call; an inner loop's own optimizer is left alone.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import ClassInfo, Facts, FunctionNode
from torchls.analysis.registry import Hit, exemption, rule
from torchls.analysis.rules._lightning import MAX_DEPTH


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


@exemption("TL701", "neg_manual_optimization_in_order.py")
def _sets_automatic_optimization(info: ClassInfo) -> bool:
    """The class controls automatic optimization itself (any assignment or property of
    `automatic_optimization` other than setting it True): its backward calls are its own."""
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


@exemption("TL701", "neg_inner_loop_optimizer.py")
def _inner_loop_backward(facts: Facts, call: ast.Call) -> bool:
    """A `backward()` inside a loop that steps an inner optimizer the function builds itself
    (a meta-learning or adversarial inner loop): the gradients of that loop's own update, not
    of the training step Lightning runs."""
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
