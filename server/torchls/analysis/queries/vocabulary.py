"""The vocabulary the file facts share: node type aliases, name patterns of training code,
tables of PyTorch calls, and the small records queries answer with.

Why: the query modules (index, kinds, values, flow, calls) and the rules all speak in these
terms (`ObjectKind`, `Origin`, `LossCall`, `EVAL_FUNCTION_RE`, ...); defining them once, apart
from any query, keeps the query modules free of import cycles.

In: nothing but `ast`. Out: constants, record classes and pure helpers over syntax nodes.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

from torchls.records import field, record

if TYPE_CHECKING:
    from torchls.analysis.facts import Facts

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef
# Expression nodes that need no bookkeeping beyond parent/scope (and the call index).
_PLAIN_TYPES = {
    ast.Call,
    ast.Name,
    ast.Attribute,
    ast.Constant,
    ast.BinOp,
    ast.Subscript,
    ast.keyword,
    ast.arg,
    ast.arguments,
    ast.Tuple,
    ast.List,
    ast.Dict,
    ast.Compare,
    ast.UnaryOp,
    ast.BoolOp,
    ast.JoinedStr,
    ast.FormattedValue,
    ast.Slice,
    ast.Starred,
    ast.comprehension,
    ast.GeneratorExp,
    ast.ListComp,
    ast.alias,
    ast.operator,
}
ScopeNode = ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
MAX_DEPTH = 6
MAX_ORIGIN_STEPS = 200_000
# Names people give to things when the constructor is out of sight (a parameter, an import).
MODEL_NAME_RE = re.compile(
    r"^(model|net|network|module|classifier|encoder|decoder|backbone|generator|discriminator|"
    r"student|teacher|.+_model|model_.+|.+_net|.+net)$",
    re.IGNORECASE,
)
OPTIMIZER_NAME_RE = re.compile(
    r"^(opt|optim|optimi[sz]er|.+_optimi[sz]er|optimi[sz]er_.+|opt_.+|.+_opt)$"
)
LOADER_NAME_RE = re.compile(r"(loader|^dl$|_dl$|^dl_|batches$|^batch_iter)", re.IGNORECASE)
LOSS_NAME_RE = re.compile(r"^(criterion|loss_fn|loss_func|lossfn|.+_criterion|criterion_.+)$")
EVAL_ROLE_RE = re.compile(
    r"(^|_)(val|valid|validation|test|eval|evaluation|dev|holdout)"
    r"(_|$|loader|set|dataloader|data_?loader|dl$)"
)
EVAL_FUNCTION_RE = re.compile(
    r"^_?(validate|validation|evaluate|evaluation|eval|test|val|valid|run_eval|run_validation|"
    r"run_test|evaluate_.+|validate_.+|eval_.+|.+_eval|.+_evaluate|.+_validation|.+_validate|"
    r"val_.+|valid_.+|test_epoch|test_model|test_loop|eval_loop|val_loop)$"
)
# Modules whose construction yields no parameters and whose output is not a model's.
ACTIVATION_MODULES = {
    "Softmax",
    "LogSoftmax",
    "Sigmoid",
    "ReLU",
    "GELU",
    "Tanh",
    "Dropout",
    "Identity",
    "Flatten",
    "LeakyReLU",
    "SiLU",
    "Softmax2d",
}
GRAD_DISABLING = {
    "torch.no_grad",
    "torch.inference_mode",
    "torch.autograd.no_grad",
    "torch.autograd.grad_mode.no_grad",
    "torch.autograd.inference_mode",
}
# `nn.Module` methods that return the module itself: `model.to(device).train()` is `model`.
RETURNS_RECEIVER = {
    "to",
    "cuda",
    "cpu",
    "xpu",
    "float",
    "double",
    "half",
    "bfloat16",
    "train",
    "eval",
    "requires_grad_",
    "share_memory",
    "to_empty",
}
# Methods whose result is plain data about a module or optimizer, never the object itself.
STATE_METHODS = {"state_dict", "parameters", "named_parameters", "buffers", "named_buffers"}
# Expressions that build a plain value (a dict, a list, a string, ...).
DATA_DISPLAYS = (
    ast.Dict,
    ast.DictComp,
    ast.List,
    ast.ListComp,
    ast.Set,
    ast.SetComp,
    ast.Tuple,
    ast.JoinedStr,
)
# Distributed autograd (RPC): gradients live in a per-context map, never in `.grad`.
DIST_AUTOGRAD = "torch.distributed.autograd."
# Methods whose result carries no autograd graph (a Python value, or a tensor cut from it).
DETACHING_METHODS = {"detach", "item", "numpy", "tolist", "cpu_numpy"}
PASS_THROUGH_METHODS = {
    "to",
    "cuda",
    "cpu",
    "float",
    "double",
    "half",
    "bfloat16",
    "contiguous",
    "squeeze",
    "unsqueeze",
    "view",
    "reshape",
    "flatten",
    "clone",
    "permute",
    "transpose",
    "resize",
    "view_as",
    "reshape_as",
}
# Functions that hand back their first argument's values, only reshaped, copied or cast:
# `torch.squeeze(p)` is still the sigmoid output `p` was.
PASS_THROUGH_FUNCTIONS = frozenset(
    f"torch.{name}"
    for name in (
        "squeeze",
        "unsqueeze",
        "flatten",
        "reshape",
        "clone",
        "permute",
        "transpose",
        "t",
        "ravel",
        "movedim",
        "swapaxes",
        "atleast_1d",
        "atleast_2d",
    )
)

# Functions whose result is made of the values of the tensors they are handed, side by side:
# `torch.cat((p, q))` of two softmax outputs is still probabilities.
JOINING_FUNCTIONS = frozenset(
    f"torch.{name}" for name in ("cat", "concat", "concatenate", "stack", "hstack", "vstack")
)


@record(frozen=True)
class ObjectKind:
    """What a name holds: `kind` is model, loss, optimizer, scheduler, scaler or loader, or
    "data" for a value known to be none of them (a dict or list display, a `state_dict()`)."""

    kind: str
    detail: str = ""  # constructor's short name: "CrossEntropyLoss", "StepLR", ...
    node: ast.AST | None = None  # the constructor call when it is in this file
    # Guessed from the variable's name alone (where the value comes from is out of sight):
    # good enough to follow a model, never enough to report one.
    by_name: bool = False


@record(frozen=True)
class Origin:
    """Where a value comes from: `node` computes it; `via` lists the steps followed to get there.

    `module_output` marks that the value is the output of calling the module built by `node`
    (so `nn.Softmax(dim=1)` as origin means "a softmax output").
    """

    node: ast.AST
    via: tuple[ast.AST, ...] = ()
    module_output: bool = False
    facts: Facts | None = None  # the file `node` belongs to, when it is not the asking file
    # When the value depends on which branch of an `if` ran (`model = A()` / `model = B()`),
    # the binding statement of the alternative this origin belongs to.
    branch: ast.AST | None = None


@record
class ClassInfo:
    """A class of the file: its node, its bases as written, its methods and `self` attributes."""

    node: ast.ClassDef
    bases: list[str]
    methods: dict[str, FunctionNode] = field(default_factory=dict)
    # self.<attr> = value assignments anywhere in the class.
    attributes: dict[str, list[ast.expr]] = field(default_factory=dict)

    @property
    def is_dataclass(self) -> bool:
        for decorator in self.node.decorator_list:
            target = decorator.func if isinstance(decorator, ast.Call) else decorator
            name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
            if name == "dataclass":
                return True
        return False


@record
class Assignment:
    """One binding of a name: `value` is the assigned expression, `index` the tuple position
    when the target was unpacked (`a, b = ...` gives index 0 and 1)."""

    stmt: ast.stmt
    value: ast.expr | None
    index: int | None = None
    loop: ast.For | ast.AsyncFor | None = None  # set when the name is a loop target


def _on_self(call: ast.Call) -> bool:
    func = call.func
    return (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and (func.value.id == "self")
    )


def parameter_default(function: FunctionNode, name: str) -> ast.expr | None:
    """The default value of parameter `name` of `function` (`criterion=nn.CrossEntropyLoss()`)."""
    args = function.args
    positional = [*args.posonlyargs, *args.args]
    offset = len(positional) - len(args.defaults)
    for index, arg in enumerate(positional):
        if arg.arg == name and index >= offset:
            return args.defaults[index - offset]
    for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=False):
        if arg.arg == name:
            return default
    return None


def argument_at(
    site: ast.Call, function: FunctionNode, param: str, bound_method: bool
) -> tuple[bool, ast.expr | None]:
    """What call `site` of `function` passes for parameter `param`: (False, None) when it
    cannot be told (`f(**options)`, or a `*args` at or before its position), else (True, the
    expression, or None when the site leaves it out). `bound_method`: the first parameter is
    the receiver, bound by attribute access."""
    if any(k.arg is None for k in site.keywords):
        return False, None
    params = [a.arg for a in [*function.args.posonlyargs, *function.args.args]]
    if bound_method and params:
        params = params[1:]
    value = next((k.value for k in site.keywords if k.arg == param), None)
    if value is None and param in params:
        position = params.index(param)
        if any(isinstance(a, ast.Starred) for a in site.args[: position + 1]):
            return False, None
        if position < len(site.args):
            value = site.args[position]
    return True, value


def _function_of(facts: Facts, node: ast.AST) -> tuple[Facts, FunctionNode, bool] | None:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return facts, node, False
    if isinstance(node, ast.ClassDef):
        info = facts.classes.get(node.name)
        init = info.methods.get("__init__") if info is not None else None
        return (facts, init, True) if init is not None else None
    return None


def _child_statements(node: ast.stmt) -> Iterator[ast.stmt]:
    """Statements nested directly in `node`'s blocks, not entering functions or classes."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return
    for name in ("body", "orelse", "finalbody"):
        for child in getattr(node, name, ()) or ():
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield child
    for handler in getattr(node, "handlers", ()) or ():
        for child in handler.body:
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield child
    for case in getattr(node, "cases", ()) or ():
        for child in case.body:
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield child


def _unwrap_iterable(expr: ast.expr) -> ast.expr | None:
    """`enumerate(loader)`, `tqdm(loader, ...)`, `zip(loader, ...)` → `loader`."""
    steps = 0
    while isinstance(expr, ast.Call) and expr.args and steps < 4:
        func = expr.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        if name in ("enumerate", "tqdm", "zip", "iter", "track", "progress_bar", "islice"):
            expr = expr.args[0]
            steps += 1
        else:
            return None
    return expr


def loader_role(name: str) -> str:
    lowered = name.lower().split(".")[-1]
    if EVAL_ROLE_RE.search(lowered):
        return "eval"
    if "train" in lowered:
        return "train"
    return ""


@record(frozen=True)
class LossCall:
    """A call computing a loss: `loss` is e.g. "CrossEntropyLoss" (module or functional)."""

    call: ast.Call
    loss: str
    input: ast.expr | None
    target: ast.expr | None
    constructor: ast.Call | None = None


# Top-level modules that are never the user's project: no need to ask jedi about them.
LIBRARY_ROOTS = {
    "torch",
    "torchvision",
    "torchaudio",
    "numpy",
    "np",
    "os",
    "sys",
    "math",
    "typing",
    "dataclasses",
    "argparse",
    "collections",
    "functools",
    "itertools",
    "pathlib",
    "logging",
    "json",
    "random",
    "time",
    "re",
    "lightning",
    "pytorch_lightning",
    "transformers",
    "timm",
    "tqdm",
    "pandas",
    "sklearn",
    "scipy",
}


# torch.nn.Module's own methods: none of them runs the forward on the data it is given.
MODULE_API = frozenset(
    {
        "add_module", "apply", "bfloat16", "buffers", "children", "compile", "cpu", "cuda",
        "double", "eval", "extra_repr", "float", "forward", "get_buffer", "get_parameter",
        "get_submodule", "half", "ipu", "load_state_dict", "modules", "named_buffers",
        "named_children", "named_modules", "named_parameters", "parameters", "register_buffer",
        "register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
        "register_module", "register_parameter", "requires_grad_", "share_memory",
        "state_dict", "to", "to_empty", "train", "type", "xpu", "zero_grad",
    }
)  # fmt: skip
