"""TL207-TL209: autograd misuse — double backward, layers built in forward, detached losses."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import DETACHING_METHODS, MAX_DEPTH, Facts, FunctionNode
from torchls.analysis.registry import Hit, rule

PARAMETERISED_MODULES = {
    "Linear",
    "LazyLinear",
    "Bilinear",
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
    "LazyConv1d",
    "LazyConv2d",
    "LazyConv3d",
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "SyncBatchNorm",
    "LayerNorm",
    "GroupNorm",
    "RMSNorm",
    "Embedding",
    "EmbeddingBag",
    "RNN",
    "LSTM",
    "GRU",
    "RNNCell",
    "LSTMCell",
    "GRUCell",
    "MultiheadAttention",
    "Transformer",
    "TransformerEncoder",
    "TransformerDecoder",
    "TransformerEncoderLayer",
    "TransformerDecoderLayer",
    "PReLU",
}


def _retains_graph(call: ast.Call) -> bool:
    for keyword in call.keywords:
        if keyword.arg in ("retain_graph", "create_graph"):
            return not (isinstance(keyword.value, ast.Constant) and not keyword.value.value)
    return len(call.args) >= 2


def _exclusive_branches(facts: Facts, first: ast.AST, second: ast.AST) -> bool:
    """True when the two nodes sit in different branches of one `if`/`try`."""
    ancestors = []
    current = facts.parents.get(first)
    while current is not None:
        ancestors.append(current)
        current = facts.parents.get(current)
    for ancestor in ancestors:
        if isinstance(ancestor, ast.If) and facts.is_inside(second, ancestor):
            in_body_first = any(facts.is_inside(first, s) for s in ancestor.body)
            in_body_second = any(facts.is_inside(second, s) for s in ancestor.body)
            return in_body_first != in_body_second
    return False


@rule(
    "TL207",
    "backward-twice",
    "E",
    "Two backward() calls through the same graph without retain_graph",
)
def backward_twice(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    Two `backward()` calls in one iteration whose losses both depend on the same model call
    (the same forward pass), when the first call does not pass `retain_graph=True`. Calls on
    exclusive paths (an `if`/`else`, or a branch that ends with `continue`/`break`/`return`)
    are not paired, and building or moving a module is not a forward pass. What a project
    function under `@torch.no_grad()` returns carries no graph (a statistic of the first
    forward's output fed to the next step, say), nor does an input that a project module's
    `forward` only reads detached (a self-training loss taking pseudo-labels from it).
    Two different items of one returned container (`parts["loss"]`, then
    `parts["stop_loss"]`) are not paired: whether they share a graph is decided where they
    were built (a head fed detached features shares none); the same item twice is.

    ## Why it is wrong
    `backward()` frees the graph's saved tensors. The second call raises "Trying to backward
    through the graph a second time" — often only on the code path that runs rarely (an
    auxiliary loss enabled late, a logging branch). With `retain_graph=True` it runs but
    gradients of the shared part are added twice, which is rarely intended either.

    ## Example
    ```python
    out = model(x)
    ce_loss = criterion(out, y)
    ce_loss.backward()
    reg_loss = out.pow(2).mean()
    reg_loss.backward()          # TL207
    ```

    ## Fix
    Sum the losses and call `backward()` once: `(ce_loss + reg_loss).backward()`. No automatic
    fix: where the sum belongs depends on the code.
    """
    backwards = facts.method_calls("backward")
    by_place: dict[tuple[int, int], list[ast.Call]] = {}
    for call in backwards:
        loops = facts.enclosing_loops(call)
        place = loops[0] if loops else facts.scope(call)
        by_place.setdefault((id(place), id(facts.scope(call))), []).append(call)
    for calls in by_place.values():
        calls.sort(key=lambda c: (c.lineno, c.col_offset))
        # Forward call -> the earlier backward() that freed its graph: one pass, not all pairs
        # (a generated file can hold tens of thousands of backward() calls).
        freed_by: dict[ast.Call, ast.Call] = {}
        for call in calls:
            graph = facts.graph_forwards(facts.receiver(call))  # type: ignore[arg-type]
            for forward in sorted(graph, key=lambda c: (c.lineno, c.col_offset)):
                earlier = freed_by.get(forward)
                if (
                    earlier is not None
                    and not _exclusive_branches(facts, earlier, call)
                    and not facts.exits_before(earlier, call)
                    and not _other_items_of_one_value(facts, earlier, call)
                ):
                    yield Hit(
                        call,
                        f"second backward() through the graph of "
                        f"`{facts.source.segment(forward)}` (line {forward.lineno}); the first "
                        f"backward() on line {earlier.lineno} already freed it",
                    )
                    break
            if not _retains_graph(call):
                for forward in graph:
                    freed_by.setdefault(forward, call)


def _item_backpropagated(facts: Facts, call: ast.Call) -> tuple[int, object] | None:
    """(binding, key) when `call` backpropagates one item of a container bound once,
    `parts["stop"].backward()` or `scaler.scale(parts["stop"]).backward()`; else None."""
    target = facts.receiver(call)
    if isinstance(target, ast.Call) and facts.method_name(target) == "scale" and target.args:
        target = target.args[0]  # a GradScaler scales what it is given, graph and all
    if not (
        isinstance(target, ast.Subscript)
        and isinstance(target.value, ast.Name)
        and isinstance(target.slice, ast.Constant)
    ):
        return None
    assignment = facts.reaching_assignment(target.value)
    if assignment is None or assignment.value is None:
        return None
    return id(assignment.stmt), target.slice.value


def _other_items_of_one_value(facts: Facts, earlier: ast.Call, later: ast.Call) -> bool:
    """The two backward() calls take different items of one container a call returned (a
    loss dict: `parts["loss"]`, then `parts["stopnet_loss"]`). Whether those items share a
    graph is decided inside whoever built them (a stop head fed detached features shares
    none): a second backward there is not a definite error, so it is not reported."""
    first = _item_backpropagated(facts, earlier)
    second = _item_backpropagated(facts, later)
    return first is not None and second is not None and first[0] == second[0] and first != second


def _forward_only_methods(facts: Facts, class_name: str) -> list[FunctionNode]:
    """`forward` and the methods of the class that only `forward` (transitively) calls."""
    info = facts.classes[class_name]
    forward = info.methods.get("forward")
    if forward is None:
        return []
    result = [forward]
    changed = True
    while changed:
        changed = False
        for name, method in info.methods.items():
            if method in result or name in ("__init__", "reset_parameters", "build", "setup"):
                continue
            sites = facts.call_sites(method)
            if sites and all(
                any(facts.is_inside(site, chosen) for chosen in result) for site in sites
            ):
                result.append(method)
                changed = True
    return result


def _rebound_here(facts: Facts, call: ast.Call) -> bool:
    """The name `call` calls is bound in its own function (a parameter, a loop target, an
    assignment): `for i, (code, GBlock) in enumerate(zip(codes, self.GBlock)): GBlock(h, c)`
    runs a registered block held under the class's name, not the class itself."""
    func = call.func
    while isinstance(func, ast.Attribute):
        func = func.value
    if not isinstance(func, ast.Name):
        return False
    scope = facts.scope(call)
    return scope is not facts.tree and bool(facts.assignments_of(func.id, scope))


def _builds_parameters(facts: Facts, call: ast.Call, depth: int = 0) -> bool:
    if depth == 0 and _rebound_here(facts, call):
        return False
    qualname = facts.call_qualname(call) or ""
    short = facts.short_name(call)
    if qualname.startswith("torch.nn.") and short in PARAMETERISED_MODULES:
        return True
    if qualname.startswith("torch.nn.") and short in ("Sequential", "ModuleList"):
        inner = [a for a in call.args if isinstance(a, ast.Call)]
        for argument in call.args:
            if isinstance(argument, (ast.List, ast.Tuple)):
                inner.extend(e for e in argument.elts if isinstance(e, ast.Call))
        return any(_builds_parameters(facts, c, depth + 1) for c in inner)
    if isinstance(call.func, ast.Name) and depth < 3 and facts.module_class(call.func.id):
        init = facts.classes[call.func.id].methods.get("__init__")
        if init is not None:
            return any(_builds_parameters(facts, c, depth + 1) for c in facts.calls_in(init))
    return False


@rule(
    "TL208",
    "layer-created-in-forward",
    "E",
    "A layer with parameters is constructed inside forward()",
)
def layer_created_in_forward(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    A module with parameters (`nn.Linear`, convolutions, norms, embeddings, RNNs, an
    `nn.Sequential` of them, or an in-file module that builds them) constructed inside
    `forward`, or inside a method that only `forward` calls. A method under a decorator of
    the project's own (one that may build the layer once and cache it on the module, like
    `@singleton("projector")`) is not reported.

    ## Why it is wrong
    Each call creates fresh, randomly initialised weights that are not registered with the
    model: the optimizer never sees them, they never learn, and every forward pass uses
    different random weights. Parameter-free modules such as `nn.ReLU()`, `nn.Dropout()` or
    `nn.Upsample()` are harmless and are not reported.

    ## Example
    ```python
    def forward(self, x):
        return nn.Linear(x.size(-1), 10)(x)     # TL208
    ```

    ## Fix
    Build the layer once in `__init__` (`self.head = nn.Linear(...)`) and call it in
    `forward`; use `nn.LazyLinear` if the input size is only known at run time.
    """
    for name in facts.classes:
        if not facts.module_class(name):
            continue
        for method in _forward_only_methods(facts, name):
            if facts.under_unknown_decorator(method.body[0]):
                # A decorator we cannot read may build the layer once and keep it
                # (`@singleton("projector")` storing the result on `self`).
                continue
            reported: list[ast.Call] = []
            for call in facts.calls_in(method):
                if any(facts.is_inside(call, outer) for outer in reported):
                    continue  # a layer inside an already reported nn.Sequential(...)
                if _builds_parameters(facts, call):
                    reported.append(call)
                    where = "forward" if method.name == "forward" else f"{method.name}()"
                    yield Hit(
                        call,
                        f"`{facts.source.segment(call.func)}` is constructed in {where}: its "
                        "weights are new on every call and never trained; build it in __init__",
                    )


LEAF_CONSTRUCTORS = {"torch.tensor", "torch.as_tensor", "torch.from_numpy", "torch.Tensor"}


def _detached_reason(facts: Facts, expr: ast.AST, depth: int = 0) -> tuple[ast.AST, str] | None:
    """Why `expr` carries no gradient from the model: (node, reason), else None."""
    if depth > MAX_DEPTH:
        return None
    if isinstance(expr, ast.Name):
        assignment = facts.reaching_assignment(expr)
        if assignment is None or assignment.value is None or assignment.loop is not None:
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
    qualname = facts.call_qualname(expr)
    if qualname in LEAF_CONSTRUCTORS and expr.args and _was_detached(facts, expr.args[0]):
        return (expr, f"`{qualname}(...)` of a detached value builds a new leaf tensor")
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
    `backward()` on a loss rebuilt from a detached value: `torch.tensor(loss.item())`,
    `loss.detach()`, `.numpy()` or `.data` on the way from the model to `backward()`.

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
