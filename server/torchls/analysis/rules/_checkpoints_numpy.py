"""Whether a value saved in a checkpoint is a NumPy scalar or array (for TL301,
checkpoint-config-not-plain-data).

Why a module of its own: following a value back to the NumPy call it comes from (through
names, in-file helpers' returns and `max()`/`min()` of such values) is a cohesive analysis of
its own, and it would push the rule's module past its size limit.
In: `Facts` and an expression. Out: the NumPy call it comes from, or None.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

from torchls.analysis.facts import Facts

# NumPy functions whose result is a NumPy scalar or array (never a Python number): saved in a
# checkpoint, it needs numpy's own classes to unpickle, which weights_only loading refuses.
_NUMPY_PRODUCERS = frozenset(
    {
        "mean",
        "nanmean",
        "average",
        "median",
        "nanmedian",
        "sum",
        "nansum",
        "prod",
        "std",
        "nanstd",
        "var",
        "nanvar",
        "max",
        "min",
        "nanmax",
        "nanmin",
        "amax",
        "amin",
        "argmax",
        "argmin",
        "percentile",
        "quantile",
        "array",
        "asarray",
        "zeros",
        "ones",
        "full",
        "arange",
        "linspace",
        "concatenate",
        "stack",
        "vstack",
        "hstack",
        "float64",
        "float32",
        "int64",
        "int32",
        "sqrt",
        "exp",
        "log",
        "round",
        "around",
        "dot",
        "trace",
        "cumsum",
    }
)
# Methods of a NumPy array that still return NumPy values.
_ARRAY_REDUCTIONS = frozenset(
    {
        "mean",
        "sum",
        "max",
        "min",
        "std",
        "var",
        "prod",
        "argmax",
        "argmin",
        "round",
        "copy",
        "astype",
        "reshape",
        "flatten",
    }
)


def _numpy_value(facts: Facts, value: ast.expr, depth: int = 0) -> ast.Call | None:
    """The NumPy call `value` comes from, when every place it may come from is one
    (`best = np.mean(scores)`, `acc = evaluate()` whose every return is one, `max(acc, best)`
    of such values and numeric constants) and at least one is: a NumPy scalar or array, not
    a Python number. `float(x)`, `x.item()` and `x.tolist()` are Python values and stop it."""
    if depth > 3:
        return None
    origins = facts.origins(value)
    if not origins or any(o.facts is not None for o in origins):
        return None
    return _numpy_among(facts, [o.node for o in origins], depth, _numpy_call)


def _numpy_among(
    facts: Facts,
    nodes: list[ast.AST],
    depth: int,
    judge: Callable[[Facts, ast.expr, int], ast.Call | None],
) -> ast.Call | None:
    """The first NumPy call `judge` finds among `nodes` when every node is one or a numeric
    constant (the initial `best = 0` a NumPy value replaces); None otherwise."""
    found: ast.Call | None = None
    for node in nodes:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            continue
        produced = judge(facts, node, depth) if isinstance(node, ast.expr) else None
        if produced is None:
            return None
        found = found or produced
    return found


def _numpy_of_expression(facts: Facts, node: ast.expr, depth: int) -> ast.Call | None:
    """What `_numpy_value` says of an argument or a returned expression, one level deeper."""
    return _numpy_value(facts, node, depth + 1)


def _numpy_call(facts: Facts, call: ast.expr, depth: int) -> ast.Call | None:
    if not isinstance(call, ast.Call):
        return None
    qualname = facts.call_qualname(call) or ""
    head, _, last = qualname.rpartition(".")
    if head == "numpy" and last in _NUMPY_PRODUCERS:
        return call
    method = facts.method_name(call)
    receiver = facts.receiver(call)
    if method in _ARRAY_REDUCTIONS and receiver is not None and isinstance(receiver, ast.expr):
        return _numpy_value(facts, receiver, depth + 1)  # `np.array(losses).mean()`
    if isinstance(call.func, ast.Name) and call.func.id in ("max", "min"):
        if call.func.id in facts.functions or call.func.id in facts.imports:
            return None
        arguments = [a for a in call.args if not isinstance(a, ast.Starred)]
        if len(arguments) < 2 or len(arguments) != len(call.args) or call.keywords:
            return None  # `max(values)` of an iterable: its elements are out of sight
        return _numpy_among(facts, arguments, depth, _numpy_of_expression)
    function = facts.called_function(call)
    if function is not None and facts.scope(function) is facts.tree:
        returned = [
            r.value
            for r in facts.walk_local(function)
            if isinstance(r, ast.Return) and r.value is not None
        ]
        return _numpy_among(facts, returned, depth, _numpy_of_expression)
    return None
