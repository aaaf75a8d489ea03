"""Whether a model behaves differently in train() and eval() mode.

Why: `model.eval()` only changes layers that read `self.training` (dropout, batch-norm and
the like). A model built only from linear, convolution, recurrent (without dropout) and
activation layers computes the same thing in both modes, so a missing or misplaced `eval()`
changes nothing; mode rules stay quiet for such models. Any layer we cannot see (a class
from an installed package, a factory, `torchvision.models.resnet18()`) counts as sensitive.

In: a `Facts` and the expression that names the model. Out: `mode_sensitive(facts, expr)`:
False only when every layer of the model is known and none depends on the mode;
`built_mode_sensitive(facts, call)`, the same for the module a constructor call builds;
`runs_no_module(facts, call)`: the module a constructor builds runs nothing it holds.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from torchls.analysis.queries.vocabulary import argument_at

if TYPE_CHECKING:
    from torchls.analysis.facts import Facts
    from torchls.analysis.queries.vocabulary import ClassInfo

# torch.nn layers whose output does not depend on the mode.
MODE_FREE = frozenset(
    {
        "Linear",
        "Bilinear",
        "LazyLinear",
        "Conv1d",
        "Conv2d",
        "Conv3d",
        "ConvTranspose1d",
        "ConvTranspose2d",
        "ConvTranspose3d",
        "Embedding",
        "EmbeddingBag",
        "LayerNorm",
        "GroupNorm",
        "RMSNorm",
        "Identity",
        "Flatten",
        "Unflatten",
        "ReLU",
        "ReLU6",
        "LeakyReLU",
        "PReLU",
        "ELU",
        "SELU",
        "CELU",
        "GELU",
        "SiLU",
        "Mish",
        "Sigmoid",
        "Tanh",
        "Softplus",
        "Softsign",
        "Hardtanh",
        "Hardswish",
        "Hardsigmoid",
        "Softmax",
        "LogSoftmax",
        "Softmax2d",
        "MaxPool1d",
        "MaxPool2d",
        "MaxPool3d",
        "AvgPool1d",
        "AvgPool2d",
        "AvgPool3d",
        "AdaptiveAvgPool1d",
        "AdaptiveAvgPool2d",
        "AdaptiveAvgPool3d",
        "AdaptiveMaxPool1d",
        "AdaptiveMaxPool2d",
        "AdaptiveMaxPool3d",
        "Upsample",
        "PixelShuffle",
        "ZeroPad2d",
        "ConstantPad2d",
        "ReflectionPad2d",
        "ReplicationPad2d",
    }
)
# Recurrent layers: mode-free unless built with dropout between their layers.
RECURRENT = frozenset({"RNN", "LSTM", "GRU"})
# Containers: as sensitive as what they hold.
CONTAINERS = frozenset({"Sequential", "ModuleList", "ModuleDict"})
MAX_DEPTH = 4


def mode_sensitive(facts: Facts, expr: ast.AST | None) -> bool:
    """True unless every layer of the model `expr` names is known to ignore the mode. A
    parameter of a function only other project files call is what they pass for it."""
    kind = facts.kind_of(expr)
    if kind is None or kind.kind != "model" or not isinstance(kind.node, ast.Call):
        passed = _passed_from_elsewhere(facts, expr)
        if not passed:
            return True
        return any(_call_sensitive(other, node, 0) is not False for other, node in passed)
    return _call_sensitive(facts, kind.node, 0) is not False


def _passed_from_elsewhere(facts: Facts, expr: ast.AST | None) -> list[tuple[Facts, ast.Call]]:
    """For a parameter of a function with no call site in this file: the module constructions
    that the calls of it in the project's other files pass for that parameter (every one of
    them must be known, else nothing)."""
    if not isinstance(expr, ast.Name):
        return []
    function = facts.parameter_of(expr)
    found = facts.calls_from_other_files(function) if function is not None else []
    if not found:
        return []
    # A method is called bound (`trainer.fit(model)`); a function through its module is not
    # (`engine.fit(model)`).
    method = facts.enclosing_class(function) is not None
    built: list[tuple[Facts, ast.Call]] = []
    for other, call in found:
        bound = method and isinstance(call.func, ast.Attribute)
        told, argument = argument_at(call, function, expr.id, bound)
        module = other.module_object(argument) if told and argument is not None else None
        if module is None:
            return []
        built.append((other, module[2]))
    return built


def built_mode_sensitive(facts: Facts, call: ast.Call) -> bool:
    """True unless every layer of the module that the constructor call `call` builds is known
    to ignore the mode (`nn.Upsample(...)`, a loss class holding only `nn.MSELoss()`)."""
    return _call_sensitive(facts, call, 0) is not False


def _call_sensitive(facts: Facts, call: ast.Call, depth: int) -> bool | None:
    """Whether the module built by `call` depends on the mode; None when it cannot be told."""
    if depth > MAX_DEPTH:
        return None
    qualname = facts.call_qualname(call) or ""
    if qualname.startswith("torch.nn.") and qualname.count(".") == 2:
        short = qualname.rsplit(".", 1)[1]
        if short in MODE_FREE or short == "Parameter" or short.endswith("Loss"):
            return False  # torch's loss modules never read the mode either
        if short in RECURRENT:
            return _recurrent_dropout(call)
        if short in CONTAINERS:
            return _any_sensitive(facts, _held_modules(call), depth)
        return None  # dropout, batch-norm, transformer layers, or a layer we do not list
    if facts.returns_receiver(call):
        receiver = facts.receiver(call)  # `Net().to(device)` is `Net()`
        if isinstance(receiver, ast.Call):
            return _call_sensitive(facts, receiver, depth + 1)
        value = facts.binding_value(receiver) if receiver is not None else None
        return _call_sensitive(facts, value, depth + 1) if isinstance(value, ast.Call) else None
    found = facts.module_class_of_call(call)
    if found is None:
        return False if _not_a_module(facts, call, qualname) else None
    owner, info = found
    return _class_sensitive(owner, info, depth + 1)


def _not_a_module(facts: Facts, call: ast.Call, qualname: str) -> bool:
    """`self.scale = math.sqrt(d)`, `nn.Parameter(torch.zeros(n))`, `int(size)`: values that
    are not layers and so carry no mode."""
    if qualname in ("torch.nn.Parameter", "torch.nn.parameter.Parameter"):
        return True
    if qualname.startswith(("math.", "numpy.")) or (
        qualname.startswith("torch.") and not qualname.startswith("torch.nn.")
    ):
        return True
    func = call.func
    return (
        isinstance(func, ast.Name)
        and not qualname
        and func.id not in facts.bound_names
        and func.id in BUILTIN_VALUES
    )


BUILTIN_VALUES = frozenset(
    {"int", "float", "bool", "str", "len", "range", "list", "dict", "tuple", "set", "max", "min"}
)


def _class_sensitive(facts: Facts, info: ClassInfo, depth: int) -> bool | None:
    for base in info.bases:
        if base in ("torch.nn.Module", "torch.nn.modules.module.Module") or base.endswith(
            "nn.Module"
        ):
            continue
        base_info = facts.classes.get(base)
        if base_info is None:
            return None  # a base class out of sight may add layers
        inherited = _class_sensitive(facts, base_info, depth + 1)
        if inherited is not False:
            return inherited
    for node in ast.walk(info.node):
        if isinstance(node, ast.Attribute) and node.attr == "training":
            return True  # reads the mode itself (`F.dropout(x, training=self.training)`)
        if isinstance(node, ast.Call):
            qualname = facts.call_qualname(node) or ""
            if qualname.startswith("torch.nn.functional.") and (
                "dropout" in qualname or "batch_norm" in qualname
            ):
                return True
    verdicts = []
    for values in info.attributes.values():
        for value in values:
            if isinstance(value, ast.Call):
                verdicts.append(_call_sensitive(facts, value, depth))
            elif isinstance(value, (ast.List, ast.Tuple)):
                verdicts.append(_any_sensitive(facts, value.elts, depth))
    if True in verdicts:
        return True
    if None in verdicts:
        return None
    return False


def _held_modules(call: ast.Call) -> list[ast.expr]:
    held: list[ast.expr] = list(call.args)
    for argument in call.args:
        if isinstance(argument, (ast.List, ast.Tuple)):
            held.extend(argument.elts)
    return held


def _any_sensitive(facts: Facts, modules: list[ast.expr], depth: int) -> bool | None:
    verdicts = []
    for module in modules:
        if isinstance(module, (ast.List, ast.Tuple)):
            continue  # its elements were added by the caller
        if isinstance(module, ast.Starred) or not isinstance(module, ast.Call):
            return None  # `Sequential(*layers)`, a name: what it holds is out of sight
        verdicts.append(_call_sensitive(facts, module, depth + 1))
    if True in verdicts:
        return True
    if None in verdicts:
        return None
    return False


def _recurrent_dropout(call: ast.Call) -> bool | None:
    for keyword in call.keywords:
        if keyword.arg == "dropout":
            if isinstance(keyword.value, ast.Constant) and isinstance(
                keyword.value.value, (int, float)
            ):
                return keyword.value.value > 0
            return None
    if len(call.args) > 5:
        return None  # dropout passed by position
    return False


def runs_no_module(facts: Facts, call: ast.Call) -> bool:
    """The module the constructor call `call` builds (a project `nn.Module` subclass) runs
    nothing it holds: its `forward`, and the methods of its own that `forward` calls, never
    call a held object (`self.net(x)`, a local bound to one), never read `self.training`
    and use no functional dropout or batch-norm. Such a module (a target smoother, a mask
    builder written as a module) computes the same thing in train and eval mode whatever
    it holds; it is a function in module form, not a model."""
    found = facts.module_class_of_call(call)
    if found is None:
        return False
    owner, info = found
    if any(
        not (base.endswith("nn.Module") or base == "torch.nn.modules.module.Module")
        for base in info.bases
    ):
        return False  # an in-file or library base may run layers of its own in forward
    forward = info.methods.get("forward")
    return forward is not None and _method_runs_nothing(owner, info, forward, set())


def _method_runs_nothing(facts: Facts, info: ClassInfo, method: ast.AST, seen: set) -> bool:
    if id(method) in seen:
        return True
    if len(seen) > MAX_DEPTH:
        return False
    seen.add(id(method))
    bindings = facts.assignments.get(method, {})  # parameters and locals of the method
    for node in facts.walk_local(method):
        if isinstance(node, ast.Attribute) and node.attr == "training":
            return False
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        qualname = facts.call_qualname(node) or ""
        if qualname.startswith("torch.nn.functional.") and (
            "dropout" in qualname or "batch_norm" in qualname
        ):
            return False
        if isinstance(func, ast.Name):
            if func.id in bindings or facts.called_function(node) is not None:
                return False  # a parameter, a local or a project function: may run a module
            continue
        if not isinstance(func, ast.Attribute):
            return False  # `self.blocks[i](x)`, `getattr(self, name)(x)`: out of sight
        receiver = func.value
        if isinstance(receiver, ast.Name) and receiver.id == "self":
            own = info.methods.get(func.attr)
            if own is None or not _method_runs_nothing(facts, info, own, seen):
                return False  # `self.net(x)`: a held object runs
            continue
        root = receiver
        while isinstance(root, (ast.Attribute, ast.Subscript, ast.Call)):
            root = root.func if isinstance(root, ast.Call) else root.value
        if not isinstance(root, ast.Name):
            if any(isinstance(n, ast.Call) for n in ast.walk(root)):
                return False
            continue  # `(gold == self.pad_id).unsqueeze(1)`: a method of a computed tensor
        if root.id == "self":
            return False  # `self.net.encode(x)`: a method of something held
        if func.attr in ("forward", "__call__"):
            return False  # `block.forward(x)` on whatever a local holds
        for binding in bindings.get(root.id, ()):
            value = binding.value
            if value is None or binding.loop is not None:
                continue  # an input of the method (or a loop over one): its tensor methods
            if isinstance(value, ast.Call) and _builds_tensor(facts, value):
                continue  # `out = torch.zeros(...)`: a tensor of its own
            if any(isinstance(n, ast.Name) and n.id == "self" for n in ast.walk(value)):
                return False  # `net = self.net; net.encode(x)`: a method of something held
    return True


def _builds_tensor(facts: Facts, call: ast.Call) -> bool:
    qualname = facts.call_qualname(call) or ""
    return qualname.startswith("torch.") and not qualname.startswith("torch.nn.")
