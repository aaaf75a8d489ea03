"""TL105 `regression-shape-broadcast`: a `[N, 1]` tensor against a `[N]` one in a regression
loss or a hand-written difference, which broadcasts to `[N, N]`; the unsafe fix squeezes.

A small, conservative shape tracer: it only answers "column vector `[N, 1]`" or "flat `[N]`"
when the code makes it certain (a `Linear(_, 1)` output, `unsqueeze(-1)`, `view(-1)`, a 1-D
tensor given to a `TensorDataset`, ...). Anything else is unknown and the rule stays quiet.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import MAX_DEPTH, Facts, Origin
from torchls.analysis.findings import Fix
from torchls.analysis.registry import Hit, exemption, rule
from torchls.analysis.rules._edits import insert_at

COLUMN = "[N, 1]"
FLAT = "[N]"
REGRESSION_LOSSES = {"MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss"}
SHAPE_CHANGING = {"squeeze", "unsqueeze", "view", "reshape", "flatten", "permute", "transpose"}
CREATION = {"torch.randn", "torch.rand", "torch.zeros", "torch.ones", "torch.empty"}


def _int_constant(node: ast.AST) -> int | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int_constant(node.operand)
        return -inner if inner is not None else None
    return None


def _shape_from_dims(dims: list[ast.expr]) -> str | None:
    if len(dims) == 1 and isinstance(dims[0], (ast.Tuple, ast.List)):
        dims = list(dims[0].elts)
    if len(dims) == 1:
        return FLAT
    if len(dims) == 2 and _int_constant(dims[1]) == 1:
        return COLUMN
    return None


def shape_of(facts: Facts, expr: ast.AST | None, depth: int = 0) -> str | None:
    """COLUMN, FLAT or None (unknown) for the tensor `expr` evaluates to."""
    if expr is None or depth > MAX_DEPTH:
        return None
    if isinstance(expr, ast.Name):
        assignment = facts.reaching_assignment(expr)
        if assignment is None:
            return None
        if assignment.loop is not None:
            return _loader_element_shape(facts, assignment.loop, assignment.index, depth)
        if assignment.index is not None or assignment.value is None:
            return None
        return shape_of(facts, assignment.value, depth + 1)
    if isinstance(expr, ast.Attribute):
        values = facts.self_attribute_values(expr)
        return shape_of(facts, values[0], depth + 1) if len(values) == 1 else None
    if not isinstance(expr, ast.Call):
        return None
    method = facts.method_name(expr)
    receiver = facts.receiver(expr)
    qualname = facts.call_qualname(expr)
    if qualname in CREATION:
        return _shape_from_dims(list(expr.args))
    if qualname is None and method is not None and receiver is not None:
        return _method_shape(facts, expr, method, receiver, depth)
    return _module_output_shape(facts, expr, depth)


def _method_shape(
    facts: Facts, call: ast.Call, method: str, receiver: ast.expr, depth: int
) -> str | None:
    args = call.args
    if method == "unsqueeze" and args and _int_constant(args[0]) in (1, -1):
        return COLUMN if shape_of(facts, receiver, depth + 1) == FLAT else None
    if method == "squeeze" and args and _int_constant(args[0]) in (1, -1):
        return FLAT if shape_of(facts, receiver, depth + 1) == COLUMN else None
    if method in ("view", "reshape") and args:
        if len(args) == 1 and _int_constant(args[0]) == -1:
            return FLAT
        if len(args) == 2 and _int_constant(args[1]) == 1:
            return COLUMN
        return None
    if method == "flatten" and not args:
        return FLAT
    if method in ("to", "float", "double", "cuda", "cpu", "detach", "clone", "contiguous"):
        return shape_of(facts, receiver, depth + 1)
    return None


@exemption("TL105", "neg_matching_shapes.py")
def _reshaped_after_layer(facts: Facts, origin: Origin) -> bool:
    """A shape-changing step runs between the traced layer and the value
    (`self.head(h).squeeze(-1)` in `forward`): the `Linear(_, 1)` output is not what the loss
    compares, so its `[N, 1]` shape says nothing."""
    return any(
        isinstance(step, ast.Call) and facts.method_name(step) in SHAPE_CHANGING
        for step in origin.via
    )


def _module_output_shape(facts: Facts, call: ast.Call, depth: int) -> str | None:
    """`model(x)` whose output is a `Linear(_, 1)` (directly, as a Sequential's last layer, or
    as every return of an in-file module's forward)."""
    shapes = set()
    for origin in facts.origins(call):
        node = origin.node
        if _reshaped_after_layer(facts, origin):
            shapes.add(None)
        elif origin.module_output and isinstance(node, ast.Call):
            if facts.owner(origin).short_name(node) == "Linear":
                out_features = node.args[1] if len(node.args) > 1 else None
                for keyword in node.keywords:
                    if keyword.arg == "out_features":
                        out_features = keyword.value
                shapes.add(
                    COLUMN
                    if out_features is not None and _int_constant(out_features) == 1
                    else None
                )
            else:
                shapes.add(None)
        elif node is not call:
            shapes.add(shape_of(facts.owner(origin), node, depth + 1))
        else:
            shapes.add(None)
    return shapes.pop() if len(shapes) == 1 else None


def _loader_element_shape(
    facts: Facts, loop: ast.For | ast.AsyncFor, index: int | None, depth: int
) -> str | None:
    """For `for x, y in DataLoader(TensorDataset(X, Y))`: the batched shape of X or Y."""
    if index is None:
        return None
    iterable = loop.iter
    if isinstance(iterable, ast.Call) and facts.short_name(iterable) == "enumerate":
        return None  # `for i, (x, y) in enumerate(...)` binds nested tuples; not traced here
    loader = facts.binding_value(iterable) if isinstance(iterable, ast.Name) else iterable
    if not isinstance(loader, ast.Call) or facts.short_name(loader) != "DataLoader":
        return None
    dataset = loader.args[0] if loader.args else None
    dataset = facts.binding_value(dataset) if isinstance(dataset, ast.Name) else dataset
    if not isinstance(dataset, ast.Call) or facts.short_name(dataset) != "TensorDataset":
        return None
    if index >= len(dataset.args):
        return None
    return shape_of(facts, dataset.args[index], depth + 1)


def _squeeze_fix(facts: Facts, column_side: ast.expr) -> Fix:
    text = facts.source.segment(column_side)
    span = facts.source.span(column_side)
    if isinstance(column_side, (ast.Name, ast.Call, ast.Attribute, ast.Subscript)):
        edits = (insert_at(span.end.row, span.end.column, ".squeeze(-1)"),)
    else:
        edits = (
            insert_at(span.start.row, span.start.column, "("),
            insert_at(span.end.row, span.end.column, ").squeeze(-1)"),
        )
    return Fix("unsafe", f"Squeeze the `[N, 1]` side: `{text}.squeeze(-1)`", edits)


def _mismatch(facts: Facts, left: ast.expr, right: ast.expr) -> ast.expr | None:
    """The `[N, 1]` side when one side is `[N, 1]` and the other `[N]`."""
    shapes = (shape_of(facts, left), shape_of(facts, right))
    if shapes == (COLUMN, FLAT):
        return left
    if shapes == (FLAT, COLUMN):
        return right
    return None


@rule(
    "TL105",
    "regression-shape-broadcast",
    "W",
    "[N, 1] prediction against [N] target broadcasts to [N, N]",
    fix="unsafe",
)
def regression_shape_broadcast(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    `MSELoss` / `L1Loss` / `SmoothL1Loss` / `HuberLoss`, or a hand-written `pred - target`,
    where one side is statically `[N, 1]` (e.g. the output of `nn.Linear(_, 1)`) and the other
    `[N]`.

    ## Why it is wrong
    Broadcasting turns `[N, 1] - [N]` into an `[N, N]` matrix of every prediction against every
    target. The loss is a number, training runs, and the model learns to predict the mean.
    PyTorch warns for the loss modules only; the hand-written form is completely silent.

    ## Example
    ```python
    head = nn.Linear(64, 1)
    loss = F.mse_loss(head(features), y)      # y is [N]: TL105
    ```

    ## Fix
    Make the shapes equal: `head(features).squeeze(-1)` (or `y.unsqueeze(-1)`). Offered as an
    unsafe fix.
    """
    for loss_call in facts.loss_calls:
        if loss_call.loss not in REGRESSION_LOSSES or not (loss_call.input and loss_call.target):
            continue
        column_side = _mismatch(facts, loss_call.input, loss_call.target)
        if column_side is not None:
            yield Hit(
                loss_call.call,
                f"{loss_call.loss} compares a `[N, 1]` tensor with a `[N]` one: broadcasting "
                "makes an `[N, N]` loss",
                _squeeze_fix(facts, column_side),
            )
    scopes = [facts.scope_nodes.get(facts.tree, [])]
    scopes += [nodes for scope, nodes in facts.scope_nodes.items() if scope is not facts.tree]
    for node in (node for nodes in scopes for node in nodes if type(node) is ast.BinOp):
        if isinstance(node.op, ast.Sub):
            column_side = _mismatch(facts, node.left, node.right)
            if column_side is not None:
                yield Hit(
                    node,
                    "`[N, 1] - [N]` broadcasts to `[N, N]`: every prediction is compared with "
                    "every target",
                    _squeeze_fix(facts, column_side),
                )
