"""TL208 `layer-created-in-forward`: a module with parameters built inside `forward` (or a
method only `forward` calls), so its weights are new on every call and never trained.

In: the file's `Facts` (its module classes). Out: one hit per constructed layer; a layer inside
an already reported `nn.Sequential(...)` is not reported again.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts, FunctionNode
from torchls.analysis.objects import ClassRef, ObjectModel
from torchls.analysis.registry import Hit, exemption, rule

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


SETUP_METHODS = ("__init__", "reset_parameters", "build", "setup")

# Factories of fresh tensors: `nn.Parameter(torch.randn(...))` in forward makes new random
# (or constant) weights on every call.
FRESH_TENSORS = {
    "randn",
    "rand",
    "zeros",
    "ones",
    "empty",
    "normal",
    "full",
    "Tensor",
    "FloatTensor",
}


def _effective_methods(facts: Facts, class_name: str) -> dict[str, tuple[Facts, FunctionNode]]:
    """The methods an instance of the class runs, by name: its own, then those it inherits
    from its project base classes (in this file or another), nearest first."""
    model = facts.get(ObjectModel)
    table: dict[str, tuple[Facts, FunctionNode]] = {}
    for klass in model.lineage(ClassRef(facts, facts.classes[class_name])):
        for name, method in klass.info.methods.items():
            table.setdefault(name, (klass.facts, method))
    return table


def _forward_only_methods(facts: Facts, class_name: str) -> list[FunctionNode]:
    """The class's own methods that `forward` (its own or an inherited one) runs and that
    nothing else calls: `forward` itself, and methods reached only through `self.m(...)` calls
    from methods already chosen (a subclass's `decode()` that the base class's `forward`
    calls)."""
    table = _effective_methods(facts, class_name)
    if "forward" not in table:
        return []
    # Every `self.m(...)` in the methods an instance runs dispatches to this class's `m`.
    self_calls: dict[str, list[tuple[Facts, ast.Call]]] = {}
    for owner, method in table.values():
        for call in owner.calls_in(method):
            func = call.func
            if (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and func.value.id == "self"
            ):
                self_calls.setdefault(func.attr, []).append((owner, call))
    chosen = [table["forward"]]
    changed = True
    while changed:
        changed = False
        for name, (owner, method) in table.items():
            if any(method is m for _, m in chosen) or name in SETUP_METHODS:
                continue
            sites = [(owner, site) for site in owner.call_sites(method)]
            sites += [s for s in self_calls.get(name, []) if s not in sites]
            if sites and all(
                any(where.is_inside(site, m) for _, m in chosen) for where, site in sites
            ):
                chosen.append((owner, method))
                changed = True
    own = facts.classes[class_name].methods
    return [m for owner, m in chosen if owner is facts and own.get(m.name) is m]


@exemption("TL208", "neg_parameter_created_lazily.py")
def _kept_on_module(facts: Facts, call: ast.Call) -> bool:
    """The parameter `call` builds is stored somewhere that outlives the call (an attribute,
    a container, `register_parameter`, the caller through `return`), or handed to code we do
    not know: only one used by torch operations and dropped is certainly lost."""
    node: ast.AST = call
    parent = facts.parents.get(node)
    # `nn.Parameter(...).to(x)`: follow the method chain on the new parameter.
    while isinstance(parent, ast.Attribute) or (
        isinstance(parent, ast.Call) and parent.func is node
    ):
        node = parent
        parent = facts.parents.get(node)
    if not isinstance(parent, ast.Assign) or not all(
        isinstance(t, ast.Name) for t in parent.targets
    ):
        # `torch.einsum(..., nn.Parameter(...))` is used once and dropped; anything else
        # (an attribute target, a call of ours) may keep it.
        return not (
            isinstance(parent, ast.Call)
            and (facts.call_qualname(parent) or "").startswith("torch.")
        )
    names = {t.id for t in parent.targets}  # type: ignore[attr-defined]
    function = facts.scope(call)

    def mentions(expr: ast.AST | None) -> bool:
        return expr is not None and any(
            isinstance(n, ast.Name) and n.id in names for n in ast.walk(expr)
        )

    for other in ast.walk(function):
        if isinstance(other, (ast.Return, ast.Yield, ast.YieldFrom)) and mentions(other.value):
            return True
        if (
            isinstance(other, (ast.Assign, ast.AugAssign, ast.AnnAssign))
            and mentions(other.value)
            and any(
                not isinstance(t, ast.Name)
                for t in (other.targets if isinstance(other, ast.Assign) else [other.target])
            )
        ):
            return True
        if isinstance(other, ast.Call) and not (facts.call_qualname(other) or "").startswith(
            "torch."
        ):
            arguments = [*other.args, *(k.value for k in other.keywords)]
            if any(isinstance(a, ast.Name) and a.id in names for a in arguments):
                return True
    return False


@exemption("TL208", "neg_layer_built_on_first_call.py")
def _built_once(facts: Facts, call: ast.Call) -> bool:
    """`self.head = nn.Linear(...)` under an `if` that tests `self.head` (`is None`,
    `not hasattr(self, "head")`): the layer is built on the first call and kept."""
    node: ast.AST = call
    stmt = facts.parents.get(node)
    # `self.head = nn.Linear(...).to(x.device)`: follow the method chain on the new layer.
    while isinstance(stmt, ast.Attribute) or (isinstance(stmt, ast.Call) and stmt.func is node):
        node = stmt
        stmt = facts.parents.get(node)
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
        return False
    target = stmt.targets[0]
    if not (
        isinstance(target, ast.Attribute)
        and isinstance(target.value, ast.Name)
        and target.value.id == "self"
    ):
        return False
    current = facts.parents.get(stmt)
    while current is not None and not isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if isinstance(current, ast.If):
            for node in ast.walk(current.test):
                if isinstance(node, ast.Attribute) and node.attr == target.attr:
                    return True
                if isinstance(node, ast.Constant) and node.value == target.attr:
                    return True  # hasattr(self, "head")
        current = facts.parents.get(current)
    return False


def _fresh_parameter(facts: Facts, call: ast.Call) -> bool:
    """`nn.Parameter(torch.randn(...))` whose parameter is used and dropped in the call."""
    qualname = facts.call_qualname(call) or ""
    if qualname not in ("torch.nn.Parameter", "torch.nn.parameter.Parameter") or not call.args:
        return False
    data = call.args[0]
    if not isinstance(data, ast.Call):
        return False
    made = facts.call_qualname(data) or ""
    if not made.startswith("torch.") or made.rsplit(".", 1)[-1] not in FRESH_TENSORS:
        return False
    return not _kept_on_module(facts, call)


@exemption("TL208", "neg_block_name_reused_by_loop.py")
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
    `forward`, or inside a method that only `forward` calls, including a subclass's method
    that an inherited `forward` calls (`self.decode(...)` in the base class, in this file or
    another); also a fresh `nn.Parameter(torch.randn(...))` made in `forward` and only used
    there (one stored on the module, `self.w = nn.Parameter(...)`, or returned, is not
    reported). A layer built once and kept (`if self.head is None: self.head = nn.Linear(...)`)
    is not reported. A method under a decorator of
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
                if _fresh_parameter(facts, call):
                    where = "forward" if method.name == "forward" else f"{method.name}()"
                    yield Hit(
                        call,
                        f"`{facts.source.segment(call.func)}` is created in {where}: a new "
                        "random parameter on every call, never registered or trained; create "
                        "it in __init__ as `self.<name> = nn.Parameter(...)`",
                    )
                    continue
                if _builds_parameters(facts, call) and not _built_once(facts, call):
                    reported.append(call)
                    where = "forward" if method.name == "forward" else f"{method.name}()"
                    yield Hit(
                        call,
                        f"`{facts.source.segment(call.func)}` is constructed in {where}: its "
                        "weights are new on every call and never trained; build it in __init__",
                    )
