"""What objects names hold: models, losses, optimizers, schedulers, scalers, loaders.

Why: rules ask `facts.kind_of(expr)` instead of matching names; the answer comes from
constructors, annotations, factories in the project and, last, the variable's name.

In: the index queries of the same `Facts`. Out: the `KindQueries` mixin of `Facts`
(`kind_of`, `is_kind`, `loss_calls`, `constructs_module`, `optimizer_parameter_owners`, ...).
"""

from __future__ import annotations

import ast
from functools import cached_property, lru_cache

from torchls.analysis.objects import ObjectModel
from torchls.analysis.queries.index import IndexQueries
from torchls.analysis.queries.vocabulary import (
    ACTIVATION_MODULES,
    DATA_DISPLAYS,
    LOADER_NAME_RE,
    LOSS_NAME_RE,
    MAX_DEPTH,
    MODEL_NAME_RE,
    OPTIMIZER_NAME_RE,
    RETURNS_RECEIVER,
    STATE_METHODS,
    ClassInfo,
    LossCall,
    ObjectKind,
    _on_self,
)

TORCH_LOADERS = ("torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader")
# Library classes that subclass torch's DataLoader and keep its `sampler` / `shuffle` contract.
LIBRARY_LOADERS = ("torch_geometric.loader.DataLoader", "torch_geometric.data.DataLoader")


class KindQueries(IndexQueries):
    """Mixin of `Facts` (see the module docstring); reads the state `Facts.__init__` sets."""

    def module_class(self, name: str, depth: int = 0) -> ClassInfo | None:
        """The in-file class `name` when it is (transitively) an `nn.Module` subclass."""
        info = self.classes.get(name)
        if info is None or depth > MAX_DEPTH:
            return None
        for base in info.bases:
            if base in ("torch.nn.Module", "torch.nn.modules.module.Module") or base.endswith(
                ("LightningModule", "nn.Module")
            ):
                return info
            if base in self.classes and self.module_class(base, depth + 1):
                return info
        return None

    def _loader_class(self, call: ast.Call) -> bool:
        """True when `call` builds a class of this file or another project file that
        subclasses torch's `DataLoader` (so it batches, samples and shuffles like one)."""
        if not isinstance(call.func, ast.Name):
            return False
        owner: KindQueries = self
        info = self.classes.get(call.func.id)
        if info is None:
            definition = self.definition(call.func.id)  # type: ignore[attr-defined]
            if definition is None or not isinstance(definition.node, ast.ClassDef):
                return False
            owner = definition.facts
            info = owner.classes.get(definition.node.name)
        seen: set[str] = set()
        while info is not None and info.node.name not in seen:
            seen.add(info.node.name)
            if any(base in TORCH_LOADERS for base in info.bases):
                return True
            local = [base for base in info.bases if base in owner.classes]
            info = owner.classes[local[0]] if len(local) == 1 else None
        return False

    def kind_of(self, expr: ast.AST | None, depth: int = 0) -> ObjectKind | None:
        """What kind of training object `expr` holds, or None if unknown."""
        if expr is None or depth > MAX_DEPTH:
            return None
        try:
            return self._kinds[expr]
        except KeyError:
            found = self._kinds[expr] = self._kind_of(expr, depth)
            return found

    def _kind_of(self, expr: ast.AST, depth: int) -> ObjectKind | None:
        if isinstance(expr, ast.Call):
            return self._kind_of_call(expr, depth)
        if isinstance(expr, (ast.Name, ast.Attribute)):
            value = self.binding_value(expr)
            if value is not None:
                found = self.kind_of(value, depth + 1)
                if found is not None:
                    return found
            if isinstance(expr, ast.Attribute):
                # `self.criterion` assigned only by a base class (maybe in another file).
                inherited = self.get(ObjectModel).kind_of(expr)  # type: ignore[attr-defined]
                if inherited is not None:
                    return inherited
            annotated = self._annotated_kind(expr)
            if annotated is not None:
                return annotated
            name = expr.id if isinstance(expr, ast.Name) else expr.attr
            return _kind_from_name(name)
        if isinstance(expr, DATA_DISPLAYS) or (
            isinstance(expr, ast.Constant) and expr.value is not None
        ):
            return ObjectKind("data", type(expr).__name__, expr)
        return None

    def _annotated_kind(self, expr: ast.Name | ast.Attribute) -> ObjectKind | None:
        """`model` in `def fit(model: nn.Module)`: a parameter typed as a module."""
        if not isinstance(expr, ast.Name):
            return None
        function = self.scope(expr)
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return None
        args = function.args
        annotation = None
        for group in (args.args, args.kwonlyargs, args.posonlyargs):
            for arg in group:
                if arg.arg == expr.id:
                    annotation = arg.annotation
                    break
        if annotation is None:
            return None
        kind = None
        qualname = self.qualname(annotation) or ""
        if qualname in ("torch.nn.Module", "torch.nn.modules.module.Module"):
            kind = ObjectKind("model", "Module")
        elif isinstance(annotation, ast.Name) and self.module_class(annotation.id):
            kind = ObjectKind("model", annotation.id)
        if kind is None or self.reaching_assignment(expr) is not None:
            return None  # not a module type, or rebound: the annotation no longer applies
        return kind

    def _kind_of_call(self, call: ast.Call, depth: int) -> ObjectKind | None:
        qualname = self.call_qualname(call) or ""
        short = self.short_name(call)
        method = self.method_name(call)
        if qualname == "torch.optim.swa_utils.AveragedModel":
            return ObjectKind("model", short, call)
        if qualname.startswith("torch.optim.lr_scheduler.") or qualname in (
            "torch.optim.swa_utils.SWALR",
            "transformers.get_linear_schedule_with_warmup",
            "transformers.get_cosine_schedule_with_warmup",
            "transformers.get_scheduler",
        ):
            return ObjectKind("scheduler", short, call)
        if qualname.startswith(("torch.optim.", "torch.distributed.optim.")) or (
            qualname.endswith(("optim.AdamW", "optim.Adam", "optim.SGD")) and qualname
        ):
            return ObjectKind("optimizer", short, call)
        if short == "GradScaler" and qualname.startswith("torch"):
            return ObjectKind("scaler", short, call)
        if qualname in TORCH_LOADERS or qualname in LIBRARY_LOADERS or self._loader_class(call):
            return ObjectKind("loader", short, call)
        if qualname.startswith("torch.nn.") and short.endswith("Loss"):
            return ObjectKind("loss", short, call)
        if qualname.startswith("torch.nn.") and short[:1].isupper():
            if short in ("DataParallel", "DistributedDataParallel") and call.args:
                return self.kind_of(call.args[0], depth + 1) or ObjectKind("model", short, call)
            if short in ACTIVATION_MODULES:
                return ObjectKind("layer", short, call)
            return ObjectKind("model", short, call)
        if qualname == "torch.nn.parallel.DistributedDataParallel" and call.args:
            return self.kind_of(call.args[0], depth + 1)
        if qualname == "torch.compile" and call.args:
            return self.kind_of(call.args[0], depth + 1)
        if qualname.startswith(("torchvision.models.", "timm.create_model")) or (
            method == "from_pretrained" and "Model" in (self.key(self.receiver(call)) or "")
        ):
            return ObjectKind("model", short, call)
        if isinstance(call.func, ast.Name) and self.module_class_of_call(call) is not None:
            return ObjectKind("model", call.func.id, call)
        if isinstance(call.func, ast.Name) and call.func.id in self.classes:
            # An optimizer or a scheduler written here (`class Lookahead(torch.optim.Optimizer)`,
            # `class FindLR(_LRScheduler)`).
            bases = self.classes[call.func.id].bases
            if any(base.startswith("torch.optim.lr_scheduler.") for base in bases):
                return ObjectKind("scheduler", call.func.id, call)
            if any(base.startswith("torch.optim.") for base in bases):
                return ObjectKind("optimizer", call.func.id, call)
        for owner, returned in (self.function_returns(call) or ())[:1]:
            # A factory (`build_model()`, `make_criterion()`): what its return builds.
            found = owner.kind_of(returned, depth + 1)
            if found is not None:
                return found
        if method in STATE_METHODS and not call.args:
            return ObjectKind("data", method, call)
        if method == "optimizers" and _on_self(call) and not call.args:
            # Lightning: `opt = self.optimizers()` under manual optimization.
            return ObjectKind("optimizer", "optimizers", call)
        if qualname in ("copy.deepcopy", "copy.copy") and len(call.args) == 1:
            return self.kind_of(call.args[0], depth + 1)
        if self.returns_receiver(call):
            return self.kind_of(self.receiver(call), depth + 1)
        return None

    def scheduler_cadence(self, expr: ast.AST | None) -> str | None:
        """How the scheduler `expr` holds is meant to be stepped: "epoch", "batch", or None
        when its constructor arguments do not say (warmup `LambdaLR`, unknown lengths)."""
        from torchls.analysis.schedulers import scheduler_cadence

        return scheduler_cadence(self, expr)

    def is_kind(self, expr: ast.AST | None, kind: str) -> bool:
        found = self.kind_of(expr)
        return found is not None and found.kind == kind

    @cached_property
    def loss_calls(self) -> list[LossCall]:
        """Every call that computes a loss whose kind we know, with its input and target."""
        from torchls.analysis.losses import find_loss_calls

        return find_loss_calls(self)

    @cached_property
    def loss_call_nodes(self) -> set[ast.Call]:
        return {loss_call.call for loss_call in self.loss_calls}

    def constructs_module(self, call: ast.Call) -> bool:
        """`call` yields a module object, not a forward pass's output: the constructor of an
        `nn.Module` (torch, in-file or project class, a model factory), or a module method that
        returns the module (`net.cuda()`, `net.to(device)`, `copy.deepcopy(net)`). Known from
        where the value comes from; a name that merely looks like a model is not enough."""
        func = call.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr not in RETURNS_RECEIVER
            and func.attr != "from_pretrained"
            and not (isinstance(func.value, ast.Name) and func.value.id in self.imports)
            and not (self.call_qualname(call) or "").startswith(("torch", "timm", "copy."))
        ):
            return False  # `out.pow(2)`, `self.head(x)`: a method or a forward, never a build
        kind = self.kind_of(call)
        if kind is not None and kind.kind in ("model", "layer") and not kind.by_name:
            return True
        # `Discriminator(shape)` with `Discriminator` imported (a star import included): a
        # module-level object of another file is a class or a factory, not an instance this
        # file built, so calling it builds a module rather than running one (`nets.D(...)`,
        # an attribute of an imported module, too).
        if isinstance(func, ast.Attribute):
            return self.is_kind(func, "model")  # only imported modules pass the filter above
        return (
            isinstance(func, ast.Name)
            and (func.id in self.imports or not self._bound_in_file(func))
            and func.id not in self.functions
            and self.is_kind(func, "model")
        )

    def _bound_in_file(self, name: ast.Name) -> bool:
        """`name` is assigned, a parameter or a loop target in its scope or a scope around it."""
        scope: ast.AST | None = self.scope(name)
        while scope is not None:
            if name.id in self.assignments.get(scope, {}):
                return True
            if scope is self.tree:
                return False
            scope = self.scope(scope)
        return False

    def module_root(self, expr: ast.AST | None) -> str | None:
        """The key of the module object `expr` ends up being: `net = model.to(device)` and
        `ddp = DistributedDataParallel(model)` both give `model`."""
        for _ in range(MAX_DEPTH):
            expr = self.same_object(expr)
            if isinstance(expr, ast.Call):
                qualname = self.call_qualname(expr) or ""
                wrapper = qualname == "torch.compile" or self.short_name(expr) in (
                    "DataParallel",
                    "DistributedDataParallel",
                )
                if not (wrapper and expr.args):
                    return None
                expr = expr.args[0]
                continue
            if isinstance(expr, ast.Name):
                value = self.binding_value(expr)
                if isinstance(value, (ast.Name, ast.Call)) and self.module_root(value) is not None:
                    return self.module_root(value)
            return self.key(expr)
        return None

    def optimizer_parameter_owners(self, optimizer: ast.AST, depth: int = 0) -> set[str] | None:
        """Root keys of the modules whose parameters `optimizer` updates, from every binding
        of the optimizer's name (`SGD(model.parameters())`, param-group dicts, a wrapper such
        as `SWA(optimizer)`); None when some binding's parameters cannot be told."""
        if not isinstance(optimizer, ast.Name) or depth > 3:
            return None
        assignments = self.assignments_of(optimizer.id, self.scope(optimizer))
        if not assignments:
            assignments = self.assignments_of(optimizer.id, self.tree)  # a module-level one
        values = [a.value for a in assignments if isinstance(a.value, ast.Call)]
        if not values or len(values) != len(assignments):
            return None  # a parameter, an unpacked value: where it comes from is out of sight
        owners: set[str] = set()
        for value in values:
            inner = [a for a in value.args if isinstance(a, ast.Name) and a.id == optimizer.id]
            if inner or (value.args and self.is_kind(value.args[0], "optimizer")):
                # A wrapper around another optimizer (SWA, Lookahead): its parameters.
                found = self.optimizer_parameter_owners(value.args[0], depth + 1)
                if found is None and not inner:
                    return None
                owners |= found or set()
                continue
            params = value.args[0] if value.args else None
            params = params or next((k.value for k in value.keywords if k.arg == "params"), None)
            found = self._parameter_owners(params, depth) if params is not None else None
            if not found:
                return None
            owners |= found
        return owners

    def _parameter_owners(self, expr: ast.AST, depth: int) -> set[str] | None:
        """Root keys of the modules whose `.parameters()` (or named/`filter`ed) feed `expr`."""
        owners: set[str] = set()
        for node in ast.walk(expr):
            if isinstance(node, ast.Call) and self.method_name(node) in (
                "parameters",
                "named_parameters",
            ):
                receiver = self.receiver(node)
                root = self.module_root(receiver) or self.key(receiver)
                if root is None:
                    return None
                owners.add(root)
            elif isinstance(node, ast.Name) and depth < 3 and node is expr:
                value = self.binding_value(node)
                if value is None:
                    return None
                found = self._parameter_owners(value, depth + 1)
                if found is None:
                    return None
                owners |= found
        return owners or None


@lru_cache(maxsize=4096)
def _kind_from_name(name: str) -> ObjectKind | None:
    """The last resort of `kind_of`: what a name says it holds (the same for every file,
    hence cached by the name alone)."""
    if "sched" in name.lower():
        return ObjectKind("scheduler", by_name=True)
    if "scaler" in name.lower():
        return ObjectKind("scaler", by_name=True)
    if OPTIMIZER_NAME_RE.match(name):
        return ObjectKind("optimizer", by_name=True)
    if LOSS_NAME_RE.match(name):
        return ObjectKind("loss", by_name=True)
    if LOADER_NAME_RE.search(name):
        return ObjectKind("loader", by_name=True)
    if MODEL_NAME_RE.match(name):
        return ObjectKind("model", by_name=True)
    return None
