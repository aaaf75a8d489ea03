"""What a tensor value is: the activation it carries, the tensor an activation is applied
to, a cast to a floating dtype.

Why: the loss-contract rules (TL1xx), the numerics rules (TL5xx) and the hover's static loss
contracts all ask "is this a softmax output", "what went into that sigmoid", "is this target
cast to float"; the answer belongs to the facts layer, not to one rule module that the others
would then import.

In: a file's `Facts` and an `Origin` or an expression. Out: an activation name
("softmax", "log_softmax", "sigmoid"), the activation's input expression, the cast call, or
whether a value is cut from the autograd graph (`detached_value`).
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchls.analysis.facts import Facts, Origin

SOFTMAX_FUNCTIONS = {"torch.softmax", "torch.nn.functional.softmax", "torch.special.softmax"}
LOG_SOFTMAX_FUNCTIONS = {
    "torch.log_softmax",
    "torch.nn.functional.log_softmax",
    "torch.special.log_softmax",
}
SIGMOID_FUNCTIONS = {"torch.sigmoid", "torch.nn.functional.sigmoid", "torch.special.expit"}
ACTIVATION_OF_MODULE = {"Softmax": "softmax", "LogSoftmax": "log_softmax", "Sigmoid": "sigmoid"}
FLOAT_DTYPES = {
    "torch.float",
    "torch.float32",
    "torch.float64",
    "torch.double",
    "torch.half",
    "torch.float16",
    "torch.bfloat16",
    "torch.FloatTensor",
    "torch.DoubleTensor",
}
CAST_METHODS = {"float", "double", "half", "bfloat16"}


def activation_of(facts: Facts, origin: Origin, depth: int = 0) -> str | None:
    """ "softmax", "log_softmax" or "sigmoid" when `origin` computes that activation."""
    facts = facts.owner(origin)
    node = origin.node
    if origin.module_output and isinstance(node, ast.Call):
        return ACTIVATION_OF_MODULE.get(facts.short_name(node))
    if not isinstance(node, ast.Call):
        return None
    qualname = facts.call_qualname(node)
    method = facts.method_name(node)
    if qualname in SOFTMAX_FUNCTIONS or (qualname is None and method == "softmax"):
        return "softmax"
    if qualname in LOG_SOFTMAX_FUNCTIONS or (qualname is None and method == "log_softmax"):
        return "log_softmax"
    if qualname in SIGMOID_FUNCTIONS or (qualname is None and method == "sigmoid"):
        return "sigmoid"
    exp_argument = None
    if qualname == "torch.exp" and node.args:
        exp_argument = node.args[0]
    elif qualname is None and method == "exp":
        exp_argument = facts.receiver(node)
    if exp_argument is not None and depth < 3:
        inner = facts.origins(exp_argument)
        if inner and all(activation_of(facts, o, depth + 1) == "log_softmax" for o in inner):
            return "softmax"
    return None


def activation_input(facts: Facts, call: ast.Call) -> ast.expr | None:
    """The tensor an activation call is applied to: `z` in `F.softmax(z, 1)` / `z.softmax(1)`;
    for `exp(log_softmax(z))` the `z`."""
    qualname = facts.call_qualname(call)
    if qualname is None and facts.method_name(call) in ("softmax", "log_softmax", "sigmoid"):
        return facts.receiver(call)
    if qualname is None and facts.method_name(call) == "exp":
        inner = facts.receiver(call)
        return activation_input(facts, inner) if isinstance(inner, ast.Call) else None
    if qualname == "torch.exp" and call.args and isinstance(call.args[0], ast.Call):
        return activation_input(facts, call.args[0])
    for keyword in call.keywords:
        if keyword.arg == "input":
            return keyword.value
    return call.args[0] if call.args else None


def float_cast(facts: Facts, expr: ast.AST) -> ast.Call | None:
    """`expr` when it casts to a floating dtype: `.float()`, `.to(torch.float32)`, `.type(...)`."""
    if not isinstance(expr, ast.Call) or not isinstance(expr.func, ast.Attribute):
        return None
    method = expr.func.attr
    if method in CAST_METHODS and not expr.args:
        return expr
    if method in ("to", "type"):
        candidates = list(expr.args) + [k.value for k in expr.keywords if k.arg == "dtype"]
        for candidate in candidates:
            if (isinstance(candidate, ast.Name) and candidate.id == "float") or (
                facts.qualname(candidate) in FLOAT_DTYPES
            ):
                return expr
            if isinstance(candidate, ast.Constant) and candidate.value in (
                "torch.FloatTensor",
                "torch.cuda.FloatTensor",
            ):
                return expr
    return None


# Methods whose result is cut from the graph exactly when their receiver is.
GRAPH_PRESERVING_METHODS = frozenset(
    {"cpu", "cuda", "to", "clone", "contiguous", "float", "double", "half", "squeeze", "view"}
)
# Methods whose result is never on the graph: `.numpy()` and `.tolist()` of a tensor that
# requires grad raise or leave Python data, `.item()` is a number.
_CUTTING_METHODS = frozenset({"detach", "item", "numpy", "tolist"})


def detached_value(value: ast.expr | None) -> bool:
    """`value` is a Python number or a tensor cut from the graph: a constant, `x.detach()`,
    `x.item()`, `x.detach().cpu().numpy()`, `x.data`, `float(x)`, `int(x)` (through methods
    that keep whatever their receiver is, `x.detach().cpu()`)."""
    while (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr in GRAPH_PRESERVING_METHODS
    ):
        value = value.func.value
    if isinstance(value, ast.Constant):
        return True
    if isinstance(value, ast.Attribute):
        return value.attr == "data"
    if not isinstance(value, ast.Call):
        return False
    if isinstance(value.func, ast.Attribute):
        return value.func.attr in _CUTTING_METHODS
    return isinstance(value.func, ast.Name) and value.func.id in ("float", "int")
