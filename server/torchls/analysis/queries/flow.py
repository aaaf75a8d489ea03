"""Control flow and effects: gradient-disabled regions, what a call or loop reaches, and the
training vocabulary of loops (batch, epoch and training loops, backward, steps, zero_grad).

Why: rules about modes, gradients and schedules ask "does this loop train", "is this under
no_grad", "does this run before that"; answering those once keeps every rule precise.

In: the index, kind and value queries of the same `Facts`. Out: the `FlowQueries` mixin of
`Facts` (`in_no_grad`, `node_reaches`, `batch_loops`, `training_loops`, `optimizer_of_step`,
`exits_before`, `trains_model`, ...).
"""

from __future__ import annotations

import ast
from functools import cached_property
from typing import TYPE_CHECKING

from torchls.analysis.queries.index import IndexQueries
from torchls.analysis.queries.vocabulary import (
    DIST_AUTOGRAD,
    GRAD_DISABLING,
    LOADER_NAME_RE,
    ClassInfo,
    FunctionNode,
    _on_self,
    _unwrap_iterable,
    argument_at,
    loader_role,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    from torchls.analysis.facts import Facts
    from torchls.analysis.queries.vocabulary import Assignment, ObjectKind, Origin, ScopeNode
    from torchls.analysis.resolver import CachedView, Workspace
    from torchls.analysis.summaries import Summary

# Decorators whose effect on gradients is known (none, or the grad-disabling ones).
_PLAIN_DECORATORS = frozenset({"staticmethod", "classmethod", "property"})
_KNOWN_DECORATOR_MODULES = ("torch.", "functools.", "abc.", "typing.", "contextlib.")
# Experiment and command-line libraries whose decorators (`@ex.main` of a sacred
# `Experiment`, `@hydra.main`, `@click.command()`, `@app.command()` of a `typer.Typer`) only
# register the function and inject its arguments: they never touch autograd.
_REGISTERING_DECORATOR_MODULES = ("sacred.", "hydra.", "click.", "typer.")

# Where walking up from a node stops: its function, lambda, class or module.
_SCOPE_TYPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.Module)


class FlowQueries(IndexQueries):
    """Mixin of `Facts` (see the module docstring); reads the state `Facts.__init__` sets."""

    if TYPE_CHECKING:
        # What this mixin reads of `Facts` and of its sibling mixins, declared for the type
        # checker only (the definitions are in facts.py and the other query modules).
        tree: ast.Module
        parents: dict[ast.AST, ast.AST]
        functions: dict[str, FunctionNode]
        classes: dict[str, ClassInfo]
        calls: list[ast.Call]
        loops: list[ast.For | ast.AsyncFor | ast.While]
        assignments: dict[ast.AST, dict[str, list[Assignment]]]
        local_functions: dict[ast.AST, dict[str, FunctionNode]]
        workspace: Workspace | CachedView | None
        _called: dict[ast.Call, FunctionNode | None]

        @staticmethod
        def method_name(call: ast.Call) -> str | None: ...
        @staticmethod
        def receiver(call: ast.Call) -> ast.expr | None: ...
        def key(self, expr: ast.AST | None) -> str | None: ...
        def is_inside(self, node: ast.AST, ancestor: ast.AST) -> bool: ...
        def scope(self, node: ast.AST) -> ScopeNode: ...
        def kind_of(self, expr: ast.AST | None, depth: int = 0) -> ObjectKind | None: ...
        def calls_in(self, node: ast.AST) -> list[ast.Call]: ...
        def same_object(self, expr: ast.AST | None) -> ast.AST | None: ...
        def qualname(self, expr: ast.AST | None) -> str | None: ...
        def call_qualname(self, call: ast.Call) -> str | None: ...
        def module_root(self, expr: ast.AST | None) -> str | None: ...
        def enclosing_loops(self, node: ast.AST) -> list[ast.For | ast.AsyncFor | ast.While]: ...
        def enclosing_class(self, node: ast.AST) -> ast.ClassDef | None: ...
        def walk_local(self, node: ast.AST) -> Iterator[ast.AST]: ...
        def reaching_assignment(self, name: ast.Name) -> Assignment | None: ...
        def assignments_of(self, name: str, scope: ScopeNode) -> list[Assignment]: ...
        def origins(
            self, expr: ast.AST, depth: int = 0, via: tuple[ast.AST, ...] = ()
        ) -> list[Origin]: ...
        def optimizer_parameter_owners(
            self, optimizer: ast.AST, depth: int = 0
        ) -> set[str] | None: ...
        def call_summary(
            self, call: ast.Call
        ) -> tuple[Summary, dict[str, ast.expr], Facts] | None: ...
        def _arguments_for(self, function: FunctionNode, param: str) -> list[ast.expr] | None: ...

    @cached_property
    def cuda_only_scopes(self) -> set[ast.AST]:
        """Scopes (module level, functions) that move a model to CUDA unconditionally."""
        from torchls.analysis.devices import cuda_only_scopes

        return cuda_only_scopes(self)

    def requires_cuda(self, node: ast.AST) -> bool:
        """`node` runs where the script cannot work without CUDA anyway (its scope, module
        level or every caller moves the model to CUDA unconditionally)."""
        from torchls.analysis.devices import requires_cuda

        return requires_cuda(self, node)

    @cached_property
    def mentions_cuda(self) -> bool:
        """The file refers to CUDA anywhere (`.cuda()`, `"cuda"`, `torch.cuda`)."""
        from torchls.analysis.devices import mentions_cuda

        return mentions_cuda(self)

    def rank_dependent(self, test: ast.AST) -> bool:
        """True when the condition `test` is true on some ranks of a distributed run and false
        on others (`rank == 0`, `local_rank in (-1, 0)`); `local_rank != -1`, `world_size > 1`
        and `dist.is_initialized()` hold on every rank alike."""
        from torchls.analysis.ranks import rank_dependent

        return rank_dependent(self, test)

    def restricts_ranks(self, test: ast.AST) -> bool:
        """The body of `if test:` runs on a subset of ranks (an `and` keeps the restriction)."""
        from torchls.analysis.ranks import restricts_ranks

        return restricts_ranks(self, test)

    def grad_disabling_with(self, with_node: ast.With | ast.AsyncWith) -> bool:
        for item in with_node.items:
            context = item.context_expr
            if isinstance(context, ast.Call):
                qualname = self.call_qualname(context) or ""
                if qualname in GRAD_DISABLING:
                    return True
                if qualname in ("torch.set_grad_enabled", "torch.autograd.set_grad_enabled"):
                    if context.args and isinstance(context.args[0], ast.Constant):
                        return context.args[0].value is False
            elif (self.qualname(context) or "") in GRAD_DISABLING:
                return True
        return False

    def grad_disabling_decorator(self, function: FunctionNode) -> bool:
        for decorator in function.decorator_list:
            target = decorator.func if isinstance(decorator, ast.Call) else decorator
            if (self.qualname(target) or "") in GRAD_DISABLING:
                return True
        return False

    def under_unknown_decorator(self, node: ast.AST) -> bool:
        """Some function around `node` has a decorator we cannot read (a project's
        `@smart_inference_mode()`, a library's wrapper): it may disable gradients itself, or
        cache what the function returns."""
        current = self.parents.get(node)
        while current is not None:
            if isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for decorator in current.decorator_list:
                    target = decorator.func if isinstance(decorator, ast.Call) else decorator
                    qualname = self.qualname(target) or ""
                    if isinstance(target, ast.Name) and target.id in _PLAIN_DECORATORS:
                        continue
                    if qualname.startswith(_KNOWN_DECORATOR_MODULES):
                        continue
                    if not self._registering_decorator(target, qualname):
                        return True
            current = self.parents.get(current)
        return False

    def _registering_decorator(self, target: ast.expr, qualname: str) -> bool:
        """`target` is a decorator of an experiment or command-line library: the library's
        own (`hydra.main`), or a method of a module-level object every binding of which that
        library built (`ex.main` with `ex = Experiment(name)` from sacred)."""
        if qualname.startswith(_REGISTERING_DECORATOR_MODULES):
            return True
        if not isinstance(target, ast.Attribute) or not isinstance(target.value, ast.Name):
            return False
        bindings = self.assignments_of(target.value.id, self.tree)
        return bool(bindings) and all(
            isinstance(b.value, ast.Call)
            and (self.call_qualname(b.value) or "").startswith(_REGISTERING_DECORATOR_MODULES)
            for b in bindings
        )

    def _in_no_grad_block(self, node: ast.AST) -> bool:
        """Inside a `with torch.no_grad():` (or similar) block of its own function."""
        current = self.parents.get(node)
        stops = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
        while current is not None and not isinstance(current, stops):
            if isinstance(current, (ast.With, ast.AsyncWith)) and self.grad_disabling_with(current):
                return True
            current = self.parents.get(current)
        return False

    def in_no_grad(self, node: ast.AST, depth: int = 0) -> bool:
        """True when `node` always runs with gradients disabled: inside a no_grad/inference_mode
        block or decorated function, or in a function whose every in-file call site is."""
        current = self.parents.get(node)
        while current is not None:
            if isinstance(current, (ast.With, ast.AsyncWith)) and self.grad_disabling_with(current):
                return True
            if isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if self.grad_disabling_decorator(current):
                    return True
                sites = self.call_sites(current)
                if sites and depth < 3:
                    return all(self.in_no_grad(site, depth + 1) for site in sites)
                return False
            if isinstance(current, ast.Lambda):
                return False
            current = self.parents.get(current)
        return False

    def forward_may_disable_grad(self, call: ast.Call) -> bool:
        """`call` runs a project module (its construction in sight, here or in another file)
        whose `forward` returns, on some path, a value computed with gradients disabled: a
        `return` inside `with torch.no_grad():`, or the result of one of its own methods
        decorated with `@torch.no_grad()` (`if not self.trainable: return self.inference(x)`).
        Whether gradients are on then depends on the module's own state, not on the caller."""
        built = [(o.facts or self, o.node) for o in self.origins(call.func)]
        for owner, node in list(built):
            # A factory (`build_model(args)`, here or in another file) whose returned name
            # is bound to one of several classes, one per branch: each class counts.
            if isinstance(node, ast.Call) and owner.module_class_of_call(node) is None:
                for factory, returned in owner.function_returns(node) or ():
                    built += [(o.facts or factory, o.node) for o in factory.origins(returned)]
        for owner, node in built:
            if isinstance(node, ast.Call):
                found = owner.module_class_of_call(node)
                if found is not None and _forward_returns_without_grad(*found):
                    return True
        return False

    def calls_from_other_files(self, function: FunctionNode) -> list[tuple[Facts, ast.Call]]:
        """The calls of `function`, which has no call site in this file, in the project's
        other files (`Workspace.calls_elsewhere`); empty when there is none, when the project
        cannot be searched, or in a view that does not read other files (the editor's
        keystroke pass: only a check or the editor's second pass asks them)."""
        if self.call_sites(function):
            return []
        workspace = self.workspace
        if workspace is None or not getattr(workspace, "complete", True):
            return []
        project = getattr(workspace, "workspace", workspace)
        return project.calls_elsewhere(self, function) or []

    def constructions_from_other_files(
        self, init: FunctionNode
    ) -> list[tuple[Facts, ast.Call]] | None:
        """The constructions (`Runner(cfg=cfg, ...)`) of the class whose `__init__` is `init`
        in the project's other files, when this file builds it nowhere; None when the
        project cannot be searched or a possible construction cannot be told (callers then
        cannot be known), empty in a view that reads no other file."""
        klass = self.parents.get(init)
        if not isinstance(klass, ast.ClassDef) or init.name != "__init__":
            return None
        if self._construction_sites(init) or self.call_sites(init):  # type: ignore[attr-defined]
            return None
        workspace = self.workspace
        if workspace is None or not getattr(workspace, "complete", True):
            return []
        project = getattr(workspace, "workspace", workspace)
        return project.calls_elsewhere(self, init, named=klass.name)  # type: ignore[union-attr, arg-type]

    def callers_elsewhere_disable_grad(self, function: FunctionNode) -> bool:
        """`function` has no call site in this file, and every call of it in the project's
        other files runs with gradients disabled (`with torch.no_grad(): validate(...)` in
        train.py)."""
        found = self.calls_from_other_files(function)
        return bool(found) and all(other.in_no_grad(call) for other, call in found)

    def parameters_frozen_before(self, key: str, node: ast.AST, depth: int = 0) -> bool:
        """Before `node`, in its own function (or module), every parameter of the module
        `key` names is frozen: `model.requires_grad_(False)`, or a loop over
        `model.parameters()` / `model.named_parameters()` setting `requires_grad = False` on
        each. A forward of it then records no graph unless its input asks for one. For a
        parameter of the function, every in-file caller froze what it passes."""
        scope = self.scope(node)
        for found in self.walk_local(scope):
            if getattr(found, "lineno", node.lineno) >= node.lineno:  # type: ignore[attr-defined]
                continue
            if isinstance(found, ast.Call) and self.method_name(found) == "requires_grad_":
                argument = found.args[0] if found.args else None
                if (
                    isinstance(argument, ast.Constant)
                    and argument.value is False
                    and self.key(self.same_object(self.receiver(found))) == key
                ):
                    return True
            if isinstance(found, ast.For) and self._freezes_each(found, key):
                return True
        return depth < 2 and self._frozen_by_every_caller(key, scope, depth)

    def _frozen_by_every_caller(self, key: str, function: ast.AST, depth: int) -> bool:
        """`key` is a parameter of `function` that it never rebinds, and every in-file call
        site hands over a module whose parameters were all frozen before that call
        (`model.requires_grad_(False)` in the script, then `evaluate(images, model)`)."""
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) or "." in key:
            return False
        positional = [a.arg for a in [*function.args.posonlyargs, *function.args.args]]
        if key not in positional + [a.arg for a in function.args.kwonlyargs]:
            return False
        if any(a.stmt is not function for a in self.assignments_of(key, function)):
            return False  # rebound inside: the caller's module may not be what runs
        sites = self.call_sites(function)
        if not sites:
            return False
        for site in sites:
            bound = isinstance(site.func, ast.Attribute) and positional[:1] == ["self"]
            told, argument = argument_at(site, function, key, bound)
            passed = self.key(self.same_object(argument)) if argument is not None else None
            if not told or passed is None:
                return False
            if not self.parameters_frozen_before(passed, site, depth + 1):
                return False
        return True

    def _freezes_each(self, loop: ast.For, key: str) -> bool:
        """`for p in model.parameters(): p.requires_grad = False` (or `for name, p in
        model.named_parameters(): ...`)."""
        source = loop.iter
        if not isinstance(source, ast.Call) or self.method_name(source) not in (
            "parameters",
            "named_parameters",
        ):
            return False
        if self.key(self.same_object(self.receiver(source))) != key:
            return False
        target = loop.target
        if isinstance(target, ast.Tuple) and target.elts:
            target = target.elts[-1]
        if not isinstance(target, ast.Name):
            return False
        return any(
            isinstance(statement, ast.Assign)
            and isinstance(statement.value, ast.Constant)
            and statement.value.value is False
            and any(
                isinstance(t, ast.Attribute)
                and t.attr == "requires_grad"
                and isinstance(t.value, ast.Name)
                and t.value.id == target.id
                for t in statement.targets
            )
            for statement in loop.body
        )

    def called_function(self, call: ast.Call) -> FunctionNode | None:
        """The in-file function or method a call runs (`helper(...)`, `self.step(...)`)."""
        if call in self._called:
            return self._called[call]
        found = self._resolve_called_function(call)
        self._called[call] = found
        return found

    def _resolve_called_function(self, call: ast.Call) -> FunctionNode | None:
        func = call.func
        if isinstance(func, ast.Name):
            if func.id not in self._function_names:
                # `len(...)`, `model(...)`: no function of this file has the name, unless it
                # holds an object of an in-file class run through its `__call__`.
                return self._called_instance(func) if self._call_classes else None
            # A nested function (an LBFGS closure, say) shadows a module-level one.
            nested = self.local_functions.get(self.scope(call), {}).get(func.id)
            return nested or self.functions.get(func.id)
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            if func.value.id == "self":
                klass = self.enclosing_class(call)
                info = self.classes.get(klass.name) if klass else None
                if info is not None:
                    found = info.methods.get(func.attr)
                    if found is None and self._call_classes:
                        # `self.loss_fn(out, y)` of an in-file object with `__call__`.
                        held = self.held_instance(func)
                        name = held.func.id if held is not None else None  # type: ignore[attr-defined]
                        if name in self._call_classes:
                            return self.classes[name].methods["__call__"]
                    return found
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Attribute):
            # `self.hook.after_step()`: a method of the one in-file object `self.hook` holds.
            held = self.held_instance(func.value)
            if held is not None:
                return self.classes[held.func.id].methods.get(func.attr)  # type: ignore[union-attr]
        if isinstance(func, ast.Attribute) and func.attr in self._in_file_method_names:
            # `Trainer(args).train()`, or `trainer.train()` after `trainer = Trainer(args)`.
            built: ast.AST | None = func.value
            if isinstance(built, ast.Name) and built.id != "self":
                built = self._sole_binding(built)
            if (
                isinstance(built, ast.Call)
                and isinstance(built.func, ast.Name)
                and built.func.id in self.classes
            ):
                return self.classes[built.func.id].methods.get(func.attr)
        return None

    @cached_property
    def _call_classes(self) -> frozenset[str]:
        return frozenset(n for n, info in self.classes.items() if "__call__" in info.methods)

    def _called_instance(self, func: ast.Name) -> FunctionNode | None:
        """`compute(out, y)` after `compute = LossCompute(...)` (the one binding of the name)
        of an in-file class defining `__call__`: that method."""
        built = self._sole_binding(func)
        if (
            isinstance(built, ast.Call)
            and isinstance(built.func, ast.Name)
            and built.func.id in self._call_classes
        ):
            return self.classes[built.func.id].methods["__call__"]
        return None

    def _sole_binding(self, name: ast.Name) -> ast.expr | None:
        """The value of the one assignment to `name` in its scope (or, for a name that scope
        never binds, at module level); None when there are several or none. Read from the
        binding tables alone: the value queries themselves ask which function a call runs."""
        scope = self.scope(name)
        table = self.assignments.get(scope, {})
        if name.id not in table and scope is not self.tree:
            if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                args = scope.args
                every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
                if any(a is not None and a.arg == name.id for a in every):
                    return None  # a parameter: whatever the callers pass
            table = self.assignments.get(self.tree, {})
        bindings = table.get(name.id, ())
        if len(bindings) != 1 or bindings[0].index is not None or bindings[0].loop is not None:
            return None
        return bindings[0].value

    @cached_property
    def _in_file_method_names(self) -> frozenset[str]:
        return frozenset(name for info in self.classes.values() for name in info.methods)

    def held_instance(self, attribute: ast.Attribute) -> ast.Call | None:
        """The construction `Hook(...)` of an in-file class that `self.<attr>` is bound to,
        when the class assigns that attribute exactly once."""
        if not (isinstance(attribute.value, ast.Name) and attribute.value.id == "self"):
            return None
        values = self.self_attribute_values(attribute)  # type: ignore[attr-defined]
        if len(values) != 1:
            return None
        value = values[0]
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            if value.func.id in self.classes:
                return value
        return None

    @cached_property
    def _function_names(self) -> frozenset[str]:
        return frozenset(name for local in self.local_functions.values() for name in local)

    @cached_property
    def _call_sites(self) -> dict[ast.AST, list[ast.Call]]:
        sites: dict[ast.AST, list[ast.Call]] = {}
        for call in self.calls:
            function = self.called_function(call)
            if function is not None:
                sites.setdefault(function, []).append(call)
        return sites

    def call_sites(self, function: FunctionNode) -> list[ast.Call]:
        return self._call_sites.get(function, [])

    def function_reaches(self, function: FunctionNode, predicate, depth: int = 0) -> bool:
        """True if `predicate(call)` holds for a call in `function` or in what it calls."""
        return any(self.reaches(call, predicate, depth) for call in self.calls_in(function))

    def reaches(self, call: ast.Call, predicate, depth: int = 0) -> bool:
        """`predicate(call)`, or true for a call inside the in-file function `call` runs."""
        if predicate(call):
            return True
        if depth >= 3:
            return False
        function = self.called_function(call)
        if function is None:
            # A function passed as an argument (LBFGS `optimizer.step(closure)`) runs too.
            names = self._function_names
            for argument in call.args:
                if isinstance(argument, ast.Name) and argument.id in names:
                    passed = self._passed_function(argument.id)
                    if passed is not None and self.function_reaches(passed, predicate, depth + 1):
                        return True
            return False
        return self.function_reaches(function, predicate, depth + 1)

    def _passed_function(self, name: str) -> FunctionNode | None:
        """The function a name passed as an argument runs: a module-level one, else the
        first function of that name anywhere in the file (a closure defined in a loop)."""
        return self.local_functions.get(self.tree, {}).get(name) or self.functions.get(name)

    def node_reaches(self, node: ast.AST, predicate) -> bool:
        """True if a call under `node` (or a function it calls) satisfies `predicate`."""
        return any(self.reaches(call, predicate) for call in self.calls_in(node))

    def is_backward(self, call: ast.Call) -> bool:
        func = call.func  # `method_name` inlined: asked of every call by several rules
        method = func.attr if isinstance(func, ast.Attribute) else None
        if method == "backward":
            return True
        if method == "manual_backward" and _on_self(call):
            return True  # Lightning manual optimization: `self.manual_backward(loss)`
        return (self.call_qualname(call) or "") in ("torch.autograd.backward",)

    def backward_subject(self, call: ast.Call) -> ast.expr | None:
        """The tensor `x.backward()` differentiates: `x`, and `loss` for a gradient scaler's
        `scaler.scale(loss).backward()` (scaling keeps `loss`'s graph under the product);
        None for a call that is not a bare `.backward()`."""
        if self.method_name(call) != "backward" or call.args:
            return None
        receiver = self.receiver(call)
        if (
            isinstance(receiver, ast.Call)
            and self.method_name(receiver) == "scale"
            and len(receiver.args) == 1
            and not receiver.keywords
        ):
            kind = self.kind_of(self.receiver(receiver))
            if kind is not None and kind.kind == "scaler":
                return receiver.args[0]
        return receiver

    def accumulates_grad(self, call: ast.Call) -> bool:
        """A backward() whose gradients are added into the parameters' `.grad` (so someone has
        to clear them): `loss.backward()`, `torch.autograd.backward(...)`. Distributed
        autograd (`dist_autograd.backward(context_id, [loss])`) keeps its gradients in the
        context instead, which is discarded when the `with dist_autograd.context()` ends."""
        if not self.is_backward(call):
            return False
        return not (self.call_qualname(call) or "").startswith(DIST_AUTOGRAD)

    def optimizer_of_step(self, call: ast.Call) -> ast.expr | None:
        """For `opt.step()` or `scaler.step(opt)`, the optimizer expression; else None."""
        func = call.func  # `method_name` and `receiver` inlined: asked of every call
        if not isinstance(func, ast.Attribute) or func.attr != "step":
            return None
        receiver = func.value
        kind = self.kind_of(receiver)
        if kind is not None and kind.kind == "optimizer":
            return receiver
        if kind is not None and kind.kind == "scaler" and call.args:
            return call.args[0]
        return None

    @staticmethod
    def is_zero_grad(call: ast.Call) -> bool:
        return isinstance(call.func, ast.Attribute) and call.func.attr == "zero_grad"

    def clears_gradients(self, node: ast.AST) -> bool:
        """`x.grad = None`, `x.grad.zero_()`, `x.grad.data.zero_()` and friends."""
        if isinstance(node, ast.Assign):
            return any(
                isinstance(target, ast.Attribute) and target.attr == "grad"
                for target in node.targets
            )
        if isinstance(node, ast.Call) and self.method_name(node) in ("zero_", "detach_", "fill_"):
            chain = self.key(self.receiver(node)) or ""
            return ".grad" in chain or chain.endswith("grad")
        return False

    @cached_property
    def batch_loops(self) -> dict[ast.AST, str]:
        """Loops over a data loader → their role: "train", "eval" or "" (unknown)."""
        found: dict[ast.AST, str] = {}
        for loop in self.loops:
            if not isinstance(loop, (ast.For, ast.AsyncFor)):
                continue
            iterable = self.loop_source(loop)
            kind = self.kind_of(iterable) if iterable is not None else None
            name = self.key(iterable) or ""
            if (kind is not None and kind.kind == "loader") or LOADER_NAME_RE.search(name):
                found[loop] = loader_role(name)
        return found

    def loop_source(self, loop: ast.For | ast.AsyncFor) -> ast.expr | None:
        """What a `for` loop iterates under its wrappers: `enumerate(tqdm(loader))` →
        `loader`, and through a local name bound once to such a wrapper before the loop
        (`pbar = tqdm(iter(loader)); for i, b in enumerate(pbar)` → `loader`)."""
        iterable = _unwrap_iterable(loop.iter)
        for _ in range(3):
            if not isinstance(iterable, ast.Name):
                break
            kind = self.kind_of(iterable)
            if kind is not None and kind.kind == "loader":
                break
            assignment = self.reaching_assignment(iterable)
            if (
                assignment is None
                or assignment.index is not None
                or assignment.loop is not None
                or not isinstance(assignment.value, ast.Call)
            ):
                break
            inner = _unwrap_iterable(assignment.value)
            if inner is None or inner is assignment.value:
                break  # not a wrapper (`tqdm(...)`, `iter(...)`, `enumerate(...)`) of a value
            iterable = inner
        return iterable

    @cached_property
    def epoch_loops(self) -> list[ast.AST]:
        """Loops around a batch loop (directly or through a helper that runs one), or a
        `for epoch in ...` loop: one iteration per pass over the data."""
        batch = set(self.batch_loops)

        def runs_batch_loop(call: ast.Call) -> bool:
            function = self.called_function(call)
            return function is not None and any(
                loop in batch and self.is_inside(loop, function) for loop in self.batch_loops
            )

        found = []
        for loop in self.loops:
            target = getattr(loop, "target", None)
            named = isinstance(target, ast.Name) and "epoch" in target.id.lower()
            nested = any(other is not loop and self.is_inside(other, loop) for other in batch)
            if named or nested or self.node_reaches(loop, runs_batch_loop):
                found.append(loop)
        return found

    @cached_property
    def training_loops(self) -> list[ast.AST]:
        """Loops whose body (directly or through helpers) calls `backward()`; innermost ones
        only, so an epoch loop around a batch loop is not itself a training loop."""
        result = []
        for loop in self.loops:
            if not self.node_reaches(loop, self.is_backward):
                continue
            inner = [
                other
                for other in self.loops
                if other is not loop
                and self.is_inside(other, loop)
                and self.node_reaches(other, self.is_backward)
            ]
            if not inner:
                result.append(loop)
        return result

    def exits_before(self, first: ast.AST, second: ast.AST) -> bool:
        """True when no path runs `second` after `first` within one iteration: after `first`,
        its block (or a block around it that does not hold `second`) ends with `return`,
        `raise`, or a `continue`/`break` of a loop that also holds `second` (the warm-up
        branch `if warmup: loss.backward(); continue`)."""
        node: ast.AST | None = first
        while node is not None:
            parent = self.parents.get(node)
            if parent is None or self.is_inside(second, node):
                return False
            for name in ("body", "orelse", "finalbody"):
                block = getattr(parent, name, None)
                if not isinstance(block, list) or not any(item is node for item in block):
                    continue
                index = next(i for i, item in enumerate(block) if item is node)
                for later in block[index + 1 :]:
                    if self.is_inside(second, later):
                        break
                    if isinstance(later, (ast.Return, ast.Raise)):
                        return True
                    if isinstance(later, (ast.Continue, ast.Break)):
                        loops = self.enclosing_loops(later)
                        return bool(loops) and self.is_inside(second, loops[0])
            if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                return False
            node = parent
        return False

    def trains_model(self, loop: ast.AST, model: ast.expr) -> bool:
        """Whether `loop` trains the module `model` (called in it): the loop calls its
        `train()`, or steps an optimizer over its parameters. A module only run under
        `no_grad` in the loop, or outside every optimizer the loop steps (a frozen teacher),
        is not trained there. When the optimizers cannot be told, any model counts."""
        root = self.module_root(model) or self.key(model)
        if root is None:
            return True

        def related(other: str | None) -> bool:
            return other is not None and (
                other == root or other.startswith(root + ".") or root.startswith(other + ".")
            )

        calls = self.calls_in(loop)
        if any(
            self.method_name(c) == "train" and related(self.module_root(self.receiver(c)))
            for c in calls
        ):
            return True
        runs = [c for c in calls if related(self.module_root(c.func) or self.key(c.func))]
        if runs and all(self.in_no_grad(c) for c in runs):
            return False
        optimizers = [o for c in calls if (o := self.optimizer_of_step(c)) is not None]
        if not optimizers:
            return True
        for optimizer in optimizers:
            owners = self.optimizer_parameter_owners(optimizer)
            if owners is None or any(related(owner) for owner in owners):
                return True
        return False

    def after_training(self, node: ast.AST, depth: int = 0) -> bool:
        """`node` runs once, after training has finished: it is in no loop of its scope and
        follows a loop there that trains (reaches `backward()`, here or in a function of
        another project file it calls: `train_epoch` from `loops.py`), or it sits in a helper whose
        every in-file call site does (a final export, not a periodic checkpoint)."""
        if self.enclosing_loops(node):
            return False
        scope = self.scope(node)
        line = getattr(node, "lineno", 0)
        for loop in self.loops:
            if (
                (loop.end_lineno or loop.lineno) < line
                and self.scope(loop) is scope
                and not self.enclosing_loops(loop)
                and (
                    self.node_reaches(loop, self.is_backward)
                    or self.node_reaches(loop, self.backwards_in_other_file)
                )
            ):
                return True
        if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) or depth >= 3:
            return False
        sites = self.call_sites(scope)
        return bool(sites) and all(self.after_training(site, depth + 1) for site in sites)

    # ------------------------------------------------------------------ training loops
    # The loop vocabulary of the optimization rules (TL4xx), kept here so no rule module has
    # to import another one for it.
    def is_training_batch_loop(self, loop: ast.AST) -> bool:
        """A loop over a (non-evaluation) data loader that trains: it reaches backward()."""
        role = self.batch_loops.get(loop)
        if role is None or role == "eval":
            return False
        return self.node_reaches(loop, self.is_backward) or self.node_reaches(
            loop, self.backwards_in_other_file
        )

    def backwards_in_other_file(self, call: ast.Call) -> bool:
        """`call` runs a function of another project file that runs `backward()` (a
        `train_step` in `engine.py`), as its summary says."""
        asked = self.call_summary(call)
        return asked is not None and asked[2] is not self and asked[0].backwards

    def contains_training_batch_loop(self, node: ast.AST) -> bool:
        """A training batch loop other than `node` is nested in `node`."""
        return any(
            other is not node and self.is_training_batch_loop(other) and self.is_inside(other, node)
            for other in self.loops
        )

    def calls_training_helper(self, node: ast.AST) -> bool:
        """`node` calls an in-file function that runs a training batch loop
        (`train_one_epoch`)."""

        def predicate(call: ast.Call) -> bool:
            function = self.called_function(call)
            return function is not None and self.contains_training_batch_loop(function)

        return self.node_reaches(node, predicate)

    def conditions_between(self, node: ast.AST, stop: ast.AST) -> list[ast.If]:
        """The `if` statements `node` sits in, below `stop` (not leaving its function)."""
        found = []
        current = self.parents.get(node)
        while current is not None and current is not stop and not isinstance(current, _SCOPE_TYPES):
            if isinstance(current, ast.If):
                found.append(current)
            current = self.parents.get(current)
        return found

    def evaluating_sites(self, function: FunctionNode) -> list[tuple[ast.Call, str, ast.expr]]:
        """(call site, parameter, argument) for each call of `function` that runs it without
        training, because every backward() and optimizer step in it sits under a test of one
        parameter that the site's constant argument makes false:
        `run_epoch(model, loader, train=False)` for `if train: loss.backward(); opt.step()`,
        `mode="val"` for `if mode == "train":`, an omitted `optimizer=None` for
        `if optimizer is not None:`. Empty when any training call is unguarded, guarded by
        something else, or the sites' arguments are not constants."""
        cache = self.__dict__.setdefault("_evaluating_cache", {})
        if function not in cache:
            cache[function] = self._evaluating_sites(function)
        return cache[function]

    def _evaluating_sites(self, function: FunctionNode) -> list[tuple[ast.Call, str, ast.expr]]:
        if not any(
            isinstance(node, ast.If) and guard_of(self, function, node.test, True) is not None
            for node in self.scope_nodes.get(function, ())
        ):
            return []  # no `if` tests a parameter: nothing can switch training off

        def trains(call: ast.Call) -> bool:
            return self.is_backward(call) or self.optimizer_of_step(call) is not None

        # Calls of helpers that train count too: each must sit under the same test.
        trainers = [call for call in self.calls_in(function) if self.reaches(call, trains)]
        if not trainers:
            return []
        guards = {_parameter_guard(self, function, call) for call in trainers}
        if len(guards) != 1 or None in guards:
            return []
        guard = guards.pop()
        assert guard is not None
        param = guard[0]
        arguments = self._arguments_for(function, param)
        sites = self.call_sites(function)
        if arguments is None or len(arguments) < len(sites):
            return []
        found = []
        for site, argument in zip(sites, arguments, strict=False):
            if isinstance(argument, ast.Constant) and not guard_holds(guard, argument.value):
                found.append((site, param, argument))
        return found


# (parameter, test, constant): "truthy" trains when the parameter is truthy, "eq" when it equals
# the constant, "ne" when it differs from it.
Guard = tuple[str, str, object]


def _parameter_guard(facts: FlowQueries, function: FunctionNode, call: ast.Call) -> Guard | None:
    """The test of one parameter of `function` that `call` runs under (the nearest `if`)."""
    child: ast.AST = call
    current = facts.parents.get(call)
    while current is not None and current is not function:
        if isinstance(current, ast.If):
            in_body = any(child is stmt for stmt in current.body)
            guard = guard_of(facts, function, current.test, in_body)
            if guard is not None:
                return guard
        if isinstance(current, _SCOPE_TYPES):
            return None
        child, current = current, facts.parents.get(current)
    return None


def guard_of(
    facts: FlowQueries, function: FunctionNode, test: ast.expr, in_body: bool
) -> Guard | None:
    """The test `test` (seen from its body when `in_body`, else from its `else`) as a guard
    on one parameter of `function`: `if train:`, `if not train:`, `if phase == "val":`,
    also through a name bound once at the top (`is_train = optimizer is not None`)."""
    negated = False
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, negated = test.operand, True
    positive = in_body != negated  # the call runs where the test (without `not`) is true
    if isinstance(test, ast.Name) and facts.parameter_of(test) is not function:  # type: ignore[attr-defined]
        # `is_train = optimizer is not None` once at the top, then `if is_train:`.
        bound = facts.assignments_of(test.id, function)
        if len(bound) == 1 and bound[0].value is not None and bound[0].index is None:
            if facts.parents.get(bound[0].stmt) is function:
                return guard_of(facts, function, bound[0].value, positive)
        return None
    name: ast.expr | None = None
    guard: tuple[str, object] | None = None
    if isinstance(test, ast.Name):
        name, guard = test, ("truthy" if positive else "falsy", None)
    elif (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.left, ast.Name)
        and isinstance(test.comparators[0], ast.Constant)
    ):
        name, op, value = test.left, test.ops[0], test.comparators[0].value
        if isinstance(op, (ast.Eq, ast.Is)):
            guard = ("eq" if positive else "ne", value)
        elif isinstance(op, (ast.NotEq, ast.IsNot)):
            guard = ("ne" if positive else "eq", value)
    if not isinstance(name, ast.Name) or guard is None:
        return None
    if facts.parameter_of(name) is not function:  # type: ignore[attr-defined]
        return None  # a local, or a parameter rebound before the test
    return (name.id, guard[0], guard[1])


def guard_holds(guard: Guard, value: object) -> bool:
    """Whether the guarded code runs when its parameter is `value`."""
    _, test, constant = guard
    if test == "truthy":
        return bool(value)
    if test == "falsy":
        return not value
    if test == "eq":
        return value == constant
    return value != constant


def _forward_returns_without_grad(facts: Facts, info: ClassInfo) -> bool:
    """The module class's `forward` (or an in-file base's) returns, on some path, what a
    `no_grad` block or one of its own `@torch.no_grad()` methods computed."""
    forward, depth = info.methods.get("forward"), 0
    while forward is None and depth < 3:
        bases = [facts.classes[b] for b in info.bases if b in facts.classes]
        if not bases:
            return False
        info, depth = bases[0], depth + 1
        forward = info.methods.get("forward")
    if forward is None:
        return False
    for node in facts.walk_local(forward):
        if not isinstance(node, ast.Return) or node.value is None:
            continue
        if facts._in_no_grad_block(node):
            return True
        value = node.value
        if (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute)
            and isinstance(value.func.value, ast.Name)
            and value.func.value.id == "self"
        ):
            method = info.methods.get(value.func.attr)
            if method is not None and facts.grad_disabling_decorator(method):
                return True
    return False
