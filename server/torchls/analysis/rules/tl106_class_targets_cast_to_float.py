"""TL106 `class-targets-cast-to-float`: class-index targets straight from the data cast to
float before cross-entropy / NLL; soft labels are told apart by name and stay quiet.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from torchls.analysis.facts import Facts, Origin
from torchls.analysis.findings import Fix
from torchls.analysis.queries.tensors import float_cast
from torchls.analysis.registry import Hit, exemption, rule
from torchls.analysis.rules._edits import replace_node
from torchls.analysis.rules._losses import _short

SOFT_LABEL_HINT = re.compile(r"one_?hot|soft|smooth|mix|cutmix|prob|dist|teacher|lam", re.I)
INDEX_NAME = re.compile(
    r"^(y|ys|yb|y_batch|labels?|targets?|tgt|gt|cls|classes|class_ids?|y_true|"
    r".+_labels?|.+_targets?|labels?_.+|targets?_.+)$",
    re.I,
)


@exemption("TL106", "neg_soft_labels_by_name.py")
def _named_as_soft_labels(facts: Facts, origin: Origin) -> bool:
    """The target's source or a step on its way names soft labels (`one_hot`, `soft`,
    `smooth`, `mix`, `prob`, `dist`, `teacher`, `lam`): float targets on purpose."""
    text = " ".join(facts.source.segment(n) for n in (origin.node, *origin.via))
    return SOFT_LABEL_HINT.search(text) is not None


def is_class_index_source(facts: Facts, expr: ast.expr) -> bool:
    """True when every origin of `expr` looks like class indices straight from the data: a
    loop target or an item of a batch, with no sign of soft labels on the way."""
    origins = facts.origins(expr)
    if not origins:
        return False
    for origin in origins:
        if origin.facts is not None or not all(facts.owns(n) for n in origin.via):
            return False
        if _named_as_soft_labels(facts, origin):
            return False
        node = origin.node
        if isinstance(node, ast.Name):
            assignment = facts.reaching_assignment(node)
            if assignment is not None and assignment.loop is not None:
                if not INDEX_NAME.match(node.id):
                    return False
                continue
            if assignment is None and INDEX_NAME.match(node.id):
                continue
            return False
        if isinstance(node, ast.Subscript):
            key = node.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                if INDEX_NAME.match(key.value):
                    continue
            return False
        if isinstance(node, ast.Call) and facts.method_name(node) == "long":
            continue
        items = _stacked_items(facts, node)
        if items is not None and is_class_index_source(facts, items):
            continue
        return False
    return True


def _stacked_items(facts: Facts, node: ast.AST) -> ast.expr | None:
    """The sequence `torch.stack` batches unchanged: `xs` in `torch.stack(xs)` or in
    `torch.stack([t for t in xs])`; its items' values are the batch's."""
    if not isinstance(node, ast.Call) or facts.call_qualname(node) != "torch.stack":
        return None
    if not node.args or isinstance(node.args[0], ast.Starred):
        return None
    items = node.args[0]
    if isinstance(items, ast.Name):
        return items
    if not isinstance(items, ast.ListComp) or len(items.generators) != 1:
        return None
    loop = items.generators[0]
    if loop.ifs or loop.is_async or not isinstance(loop.target, ast.Name):
        return None
    if not (isinstance(items.elt, ast.Name) and items.elt.id == loop.target.id):
        return None
    return loop.iter


@rule(
    "TL106",
    "class-targets-cast-to-float",
    "E",
    "Class-index targets cast to float before cross-entropy / NLL",
    fix="safe",
)
def class_targets_cast_to_float(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    Integer class-index targets converted with `.float()`, `.double()`, `.half()` or
    `.to(torch.float32)` right before `CrossEntropyLoss` / `NLLLoss`, also when the targets
    are batched with `torch.stack` first, and when the loss is a lambda kept on `self` in the
    arm of an `if self.task == ...` chain that the call sits under the same test of, and
    when the cast targets are handed to an in-file helper that applies the loss to them.

    ## Why it is wrong
    With a float target, `CrossEntropyLoss` switches to its soft-label mode and expects a
    `[N, C]` probability tensor: a `[N]` float target raises a shape error at best; with
    `NLLLoss` it fails outright. Class indices must stay `int64`.

    ## Example
    ```python
    for x, y in loader:
        loss = criterion(model(x), y.float())   # TL106
    ```

    ## Fix
    Drop the cast, or use `.long()`. The fix replaces the cast with `.long()`.
    """
    seen: set[ast.Call] = set()
    for loss_call in facts.loss_calls:
        if loss_call.loss not in ("CrossEntropyLoss", "NLLLoss") or loss_call.target is None:
            continue
        for cast in _target_casts(facts, loss_call.target):
            if cast in seen:
                continue
            seen.add(cast)
            yield _hit(facts, cast, loss_call.loss)


def _target_casts(facts: Facts, target: ast.expr) -> list[ast.Call]:
    """The float casts of class indices that reach the loss as `target`: the target itself,
    what the name was last assigned, or, when the target is a parameter of the helper that
    applies the loss (`compute_loss(criterion, out, y)`), the cast argument a call site in
    this file passes for it."""
    cast = _cast_of(facts, target)
    if cast is not None:
        return [cast]
    if not isinstance(target, ast.Name) or facts.reaching_assignment(target) is not None:
        return []
    arguments = facts.parameter_arguments(target) or []
    return [c for c in (_cast_of(facts, a) for a in arguments) if c is not None]


def _cast_of(facts: Facts, target: ast.expr) -> ast.Call | None:
    cast = float_cast(facts, target)
    if cast is None and isinstance(target, ast.Name):
        assignment = facts.reaching_assignment(target)
        if assignment is not None and assignment.index is None and assignment.loop is None:
            cast = float_cast(facts, assignment.value) if assignment.value else None
    if cast is None or not is_class_index_source(facts, facts.receiver(cast)):  # type: ignore[arg-type]
        return None
    return cast


def _hit(facts: Facts, cast: ast.Call, loss: str) -> Hit:
    receiver = facts.receiver(cast)
    fix = Fix(
        "safe",
        "Keep class indices as int64 (`.long()`)",
        (replace_node(facts, cast, f"{facts.source.segment(receiver)}.long()"),),  # type: ignore[arg-type]
    )
    return Hit(
        cast,
        f"class-index target `{_short(facts, receiver)}` is cast to float before "
        f"{loss}; class indices must stay int64",
        fix,
    )
