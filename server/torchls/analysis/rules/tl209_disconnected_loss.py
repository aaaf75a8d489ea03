"""TL209 `disconnected-loss`: `backward()` on a loss rebuilt from a detached value (`.item()`,
`.detach()`, `.data`, `.numpy()`), which carries no gradient to the model.

In: the file's `Facts`. Out: one hit per such `backward()`, saying where and how the value was
detached.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import DETACHING_METHODS, MAX_DEPTH, Facts
from torchls.analysis.registry import Hit, exemption, rule

LEAF_CONSTRUCTORS = {"torch.tensor", "torch.as_tensor", "torch.from_numpy", "torch.Tensor"}


@exemption("TL209", "neg_detached_target.py")
def _computed_from_its_inputs(facts: Facts, call: ast.Call) -> bool:
    """The loss is computed by a call on tensors (a loss function, a tensor method), not
    copied into a new leaf by `torch.tensor(...)`: a detached input to it, such as a target
    from a frozen network (`F.smooth_l1_loss(q, target.detach())`), is a constant, and the
    gradient reaches the model through its other inputs."""
    return facts.call_qualname(call) not in LEAF_CONSTRUCTORS


def _detached_reason(facts: Facts, expr: ast.AST, depth: int = 0) -> tuple[ast.AST, str] | None:
    """Why `expr` carries no gradient from the model: (node, reason), else None."""
    if depth > MAX_DEPTH:
        return None
    if isinstance(expr, ast.Name):
        assignment = facts.reaching_assignment(expr)
        # A loop target is bound with no value, so it stops here too.
        if assignment is None or assignment.value is None:
            return None
        if assignment.index is not None:
            return None
        return _detached_reason(facts, assignment.value, depth + 1)
    if isinstance(expr, ast.Attribute) and expr.attr == "data":
        return (expr, "`.data` detaches it from the graph")
    if not isinstance(expr, ast.Call):
        return None
    method = facts.method_name(expr)
    if method in ("requires_grad_", "float", "to", "cuda", "mean", "sum") and facts.receiver(expr):
        return _detached_reason(facts, facts.receiver(expr), depth + 1)  # type: ignore[arg-type]
    if method == "detach":
        return (expr, "`.detach()` cuts it from the graph")
    if _computed_from_its_inputs(facts, expr):
        return None
    qualname = facts.call_qualname(expr)
    if qualname in LEAF_CONSTRUCTORS:
        if expr.args and _was_detached(facts, expr.args[0]):
            return (expr, f"`{qualname}(...)` of a detached value builds a new leaf tensor")
        return None
    inputs = [*expr.args, *(k.value for k in expr.keywords)]
    detached = next((value for value in inputs if _was_detached(facts, value)), None)
    if detached is not None:
        return (detached, "it is computed from a detached value")
    return None


def _was_detached(facts: Facts, expr: ast.AST, depth: int = 0) -> bool:
    """True when `expr` is (or was assigned from) `.item()`, `.detach()`, `.numpy()`, `.data`."""
    for node in ast.walk(expr):
        if isinstance(node, ast.Call) and facts.method_name(node) in DETACHING_METHODS:
            return True
        if isinstance(node, ast.Attribute) and node.attr == "data":
            return True
        if isinstance(node, ast.Name) and depth < 3:
            value = facts.binding_value(node)
            if value is not None and _was_detached(facts, value, depth + 1):
                return True
    return False


@rule(
    "TL209",
    "disconnected-loss",
    "E",
    "The loss passed to backward() was rebuilt from a detached value",
)
def disconnected_loss(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    `backward()` on a loss that is a copy of a detached value: `torch.tensor(loss.item())`,
    `torch.from_numpy(out.numpy())`, `loss.detach()` or `.data`, also through
    `.requires_grad_()`, casts, device moves, `.mean()` / `.sum()` and the assignments
    between them and `backward()`.

    ## Why it is wrong
    The rebuilt tensor is a new leaf: `backward()` runs without error (add
    `requires_grad=True` and it even stops complaining), but no gradient reaches a single
    model parameter. The optimizer steps with zero or stale gradients and the loss never moves.

    ## Example
    ```python
    loss = torch.tensor(criterion(out, y).item(), requires_grad=True)
    loss.backward()               # TL209: the model gets no gradient
    ```

    ## Fix
    Call `backward()` on the loss tensor the criterion returned; use `.item()` only for
    logging. No automatic fix.
    """
    for call in facts.method_calls("backward"):
        found = _detached_reason(facts, facts.receiver(call))  # type: ignore[arg-type]
        if found is None:
            continue
        node, reason = found
        yield Hit(
            call,
            f"backward() on `{facts.source.segment(facts.receiver(call))}`, which carries no "
            f"gradient to the model: {reason} (line {node.lineno})",
        )
