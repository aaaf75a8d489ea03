"""TL208 `layer-created-in-forward`: a module with parameters built inside `forward` (or a
method only `forward` calls), so its weights are new on every call and never trained.

In: the file's `Facts` (its module classes). Out: one hit per constructed layer; a layer inside
an already reported `nn.Sequential(...)` is not reported again.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts, FunctionNode
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
