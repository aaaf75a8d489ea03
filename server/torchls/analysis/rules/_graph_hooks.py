"""TL206's question of which values a Lightning `training_step` keeps, step after step, in a
list attribute of its module.

Why: Lightning calls `training_step` once per batch and backward()s what it returns (the loss,
or a dict holding it under "loss"), so that value is attached to the step's autograd graph by
the hook's contract. Appending it to `self.<list>` that only an epoch-end hook empties (the
`training_step_outputs` pattern of Lightning 2) keeps every batch's graph until the epoch ends.
The loop is in the library: what is known is the hook's contract, not a loop in sight. In:
`Facts`. Out: (append statement, attribute name, the value appended) for each such store.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts, FunctionNode
from torchls.analysis.objects import ClassRef, ObjectModel
from torchls.analysis.queries.tensors import detached_value
from torchls.analysis.queries.vocabulary import ClassInfo
from torchls.analysis.registry import exemption

_STEP_HOOK = "training_step"
_EMPTYING = {"clear", "pop", "popleft"}


def _lightning_module(facts: Facts, info: ClassInfo) -> bool:
    """The class or one of its project bases subclasses Lightning's `LightningModule`."""
    for klass in facts.get(ObjectModel).lineage(ClassRef(facts, info)):
        for base in klass.info.bases:
            if base.split(".")[-1] == "LightningModule":
                return True
    return False


def _self_list(expr: ast.expr) -> str | None:
    if (
        isinstance(expr, ast.Attribute)
        and isinstance(expr.value, ast.Name)
        and expr.value.id == "self"
    ):
        return expr.attr
    return None


@exemption("TL206", "neg_lightning_step_outputs_detached.py")
def _emptied_per_step(facts: Facts, info: ClassInfo, attr: str) -> bool:
    """Some method other than `__init__` and the epoch-level hooks (`on_train_epoch_end`)
    empties or rebinds `self.<attr>`: it may run every batch, so nothing is known to pile up."""
    for name, method in info.methods.items():
        if name == "__init__" or (name.startswith("on_") and "epoch" in name):
            continue
        for node in facts.walk_local(method):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                targets = (
                    node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                )
                for target in targets:
                    inner = target.value if isinstance(target, ast.Subscript) else target
                    if _self_list(inner) == attr:
                        return True
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _EMPTYING
                and _self_list(node.func.value) == attr
            ):
                return True
    return False


def _returned(facts: Facts, step: FunctionNode, value: ast.expr) -> ast.Name | None:
    """The name in `value` (itself, or an item of a dict, tuple or list display) whose binding
    is the one `step` returns, by a `return name` with no rebinding in between."""
    candidates = [value]
    if isinstance(value, ast.Dict):
        candidates = [v for v in value.values if v is not None]
    elif isinstance(value, (ast.Tuple, ast.List)):
        candidates = list(value.elts)
    returns = [
        n.value
        for n in facts.walk_local(step)
        if isinstance(n, ast.Return) and isinstance(n.value, ast.Name)
    ]
    for candidate in candidates:
        if not isinstance(candidate, ast.Name):
            continue
        binding = facts.reaching_assignment(candidate)
        if binding is not None and binding.value is not None and detached_value(binding.value):
            continue  # `loss = loss.detach()` (manual optimization may return that)
        for returned in returns:
            if returned.id == candidate.id and facts.reaching_assignment(returned) is binding:
                return candidate
    return None


def step_output_stores(facts: Facts) -> Iterator[tuple[ast.stmt, str, ast.Name]]:
    """(statement, attribute, name) for each `self.<attr>.append(v)` in a LightningModule's
    `training_step` where `v` holds the value the step returns (so Lightning backward()s it),
    the list emptied only at an epoch's end, if at all."""
    for info in facts.classes.values():
        step = info.methods.get(_STEP_HOOK)
        if step is None or not _lightning_module(facts, info):
            continue
        for node in facts.walk_local(step):
            if not (
                isinstance(node, ast.Expr)
                and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Attribute)
                and node.value.func.attr == "append"
                and len(node.value.args) == 1
            ):
                continue
            attr = _self_list(node.value.func.value)
            if attr is None or facts.in_no_grad(node) or _emptied_per_step(facts, info, attr):
                continue
            held = _returned(facts, step, node.value.args[0])
            if held is not None:
                yield node, attr, held
