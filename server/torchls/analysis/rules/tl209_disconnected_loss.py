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


def _terms(expr: ast.AST) -> list[ast.AST]:
    """The summands of `a + b - c`, each stripped of a scalar weight (`0.5 * x`, `x * w`)."""
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Add, ast.Sub)):
        return _terms(expr.left) + _terms(expr.right)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Mult, ast.Div)):
        for side, other in ((expr.left, expr.right), (expr.right, expr.left)):
            if isinstance(other, (ast.Constant, ast.Name, ast.Subscript, ast.Attribute)):
                if isinstance(side, (ast.Call, ast.Name, ast.BinOp)):
                    return _terms(side) if isinstance(side, ast.BinOp) else [side]
    return [expr]


def _detached_term(facts: Facts, subject: ast.AST | None) -> ast.AST | None:
    """A summand of the backward()-ed loss that is a computed value detached afterwards
    (`at = criterion_at(fs, ft).detach()`, then `loss = ce + at`), while another summand
    is not: that part of the objective trains nothing."""
    value = subject
    if isinstance(subject, ast.Name):
        assignment = facts.reaching_assignment(subject)
        value = assignment.value if assignment is not None and assignment.index is None else None
    if value is None:
        return None
    terms = _terms(value)
    if len(terms) < 2:
        return None
    detached: list[ast.AST] = []
    for term in terms:
        held = facts.binding_value(term) if isinstance(term, ast.Name) else term
        if isinstance(held, ast.BinOp) and len(_terms(held)) == 1:
            held = _terms(held)[0]  # `transfer(...).detach() * beta`: the weighted value
        if not isinstance(held, ast.Call) or facts.method_name(held) != "detach":
            continue
        computed = facts.receiver(held)
        if isinstance(computed, ast.Call) and facts.method_name(computed) not in DETACHING_METHODS:
            detached.append(term)
    return detached[0] if detached and len(detached) < len(terms) else None


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
    between them and `backward()`. Also a loss summed from terms one of which was computed
    and then detached (`at = transfer(fs, ft).detach()`, `loss = ce + at`): that term adds
    to the value and trains nothing.

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
            subject = facts.receiver(call)
            term = _detached_term(facts, subject)
            if subject is not None and isinstance(term, ast.expr):
                yield Hit(
                    call,
                    f"backward() on `{facts.source.segment(subject)}`, but its term "
                    f"`{facts.source.segment(term)}` (line {term.lineno}) was detached after it "
                    "was computed: it adds to the loss value and sends no gradient to what "
                    "produced it",
                )
            continue
        node, reason = found
        yield Hit(
            call,
            f"backward() on `{facts.source.segment(facts.receiver(call))}`, which carries no "
            f"gradient to the model: {reason} (line {node.lineno})",
        )
