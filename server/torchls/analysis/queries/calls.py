"""Calls of project functions: the callee a call runs (this file or another through the
project index), its summary bound to the call's arguments, and parameter values at call sites.

Why: design.md's interprocedural analysis: rules read a helper's summary at the call site and
never re-walk helpers; this is where a call meets `summaries.py`.

In: the index queries of the same `Facts` and its workspace. Out: the `SummaryQueries` mixin
of `Facts` (`callee`, `call_summary`, `returned_arguments`, `parameter_arguments`,
`argument_value`, ...).
"""

from __future__ import annotations

import ast
from functools import cached_property
from typing import TYPE_CHECKING, cast

from torchls.analysis.objects import ObjectModel
from torchls.analysis.queries.index import IndexQueries
from torchls.analysis.queries.vocabulary import (
    LIBRARY_ROOTS,
    FunctionNode,
    _function_of,
    argument_at,
    parameter_default,
)

if TYPE_CHECKING:
    from torchls.analysis.facts import Facts
    from torchls.analysis.summaries import Summary


class SummaryQueries(IndexQueries):
    """Mixin of `Facts` (see the module docstring); reads the state `Facts.__init__` sets."""

    def callee(self, call: ast.Call) -> tuple[Facts, FunctionNode, bool] | None:
        """(facts of its file, function, bound method?) for the project function `call` runs:
        an in-file function or `self.` method, a class's `__init__`, a function or class
        imported from another project file (`from engine import train_one_epoch`,
        `utils.save_checkpoint(...)`), or a method of an object built from a project class
        (`backend = Backend(); backend.distribute(loader)`)."""
        if call in self._callees:
            return self._callees[call]
        found = self._resolve_callee(call)
        self._callees[call] = found
        return found

    @cached_property
    def parameter_names(self) -> set[str]:
        """Every parameter name of every function in the file."""
        names: set[str] = set()
        for scope in self.assignments:
            if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = scope.args
                names.update(a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs])
        return names

    @cached_property
    def called_parameter_names(self) -> set[str]:
        """Parameter names of the functions that have a call site (or, for `__init__`, a
        construction) in this file: the only parameters whose arguments can be read here."""
        names: set[str] = set()
        for scope in self.assignments:
            if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if (
                not self.call_sites(scope)
                and not (scope.name == "__init__" and self._construction_sites(scope))
                and not self._inherited_call_sites(scope)
            ):
                continue
            args = scope.args
            names.update(a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs])
        return names

    @cached_property
    def _method_names(self) -> set[str]:
        return {name for info in self.classes.values() for name in info.methods}

    @cached_property
    def _project_imports(self) -> set[str]:
        """Local names imported from modules that may be project files."""
        if self.workspace is None:
            return set()
        return {
            local
            for local, target in self.imports.items()
            if target.split(".")[0] not in LIBRARY_ROOTS
        }

    @property
    def imports_project_modules(self) -> bool:
        """With a workspace, the file imports names that may come from project files."""
        return bool(self._project_imports)

    def _resolve_callee(self, call: ast.Call) -> tuple[Facts, FunctionNode, bool] | None:
        local = self.called_function(call)
        func = call.func
        if local is not None:
            return self, local, isinstance(func, ast.Attribute)
        # Most calls are library calls or tensor methods: reject those before any lookup.
        if isinstance(func, ast.Name):
            if func.id not in self.classes and func.id not in self._project_imports:
                return self._instance_call(func) if self._may_call_instances else None
        elif isinstance(func, ast.Attribute):
            if (
                isinstance(func.value, ast.Name)
                and func.value.id == "self"
                and self._may_call_instances
            ):
                held = self._held_instance_call(func)
                if held is not None:
                    return held
            if func.attr not in self._method_names and not self._project_imports:
                return None
        else:
            return None
        if isinstance(func, ast.Name):
            if func.id in self.classes:
                init = self.classes[func.id].methods.get("__init__")
                return (self, init, True) if init is not None else None
            definition = self.definition(func.id)
            if definition is None:
                return None
            return _function_of(definition.facts, definition.node)
        if not isinstance(func, ast.Attribute):
            return None
        if not isinstance(func.value, ast.Name):
            return self._packaged_callee(func)
        base = func.value.id
        if base in self._project_imports:
            if self.reaching_assignment(func.value) is None:
                other = self.workspace.module_facts(self, base)
                if other is not None:
                    return _module_member(other, func.attr)
                found = self._imported_classmethod(base, func.attr)
                if found is not None:
                    return found
        value = self.binding_value(func.value)
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            owner: Facts | None = None
            info = self.classes.get(value.func.id)
            if info is not None:
                owner = self
            else:
                definition = self.definition(value.func.id)
                if definition is not None and isinstance(definition.node, ast.ClassDef):
                    owner = definition.facts
                    info = owner.classes.get(definition.node.name)
            if owner is not None and info is not None and func.attr in info.methods:
                return owner, info.methods[func.attr], True
        return None

    def _imported_classmethod(
        self, name: str, attr: str
    ) -> tuple[Facts, FunctionNode, bool] | None:
        """`Trainer.from_checkpoint(...)` on a class imported from another project file:
        the `@classmethod` it runs (`cls` is bound like a method's receiver)."""
        definition = cast("Facts", self).definition(name)
        if definition is None or not isinstance(definition.node, ast.ClassDef):
            return None
        info = definition.facts.classes.get(definition.node.name)
        method = info.methods.get(attr) if info is not None else None
        if method is None or not any(
            isinstance(d, ast.Name) and d.id == "classmethod" for d in method.decorator_list
        ):
            return None
        return definition.facts, method, True

    @cached_property
    def _may_call_instances(self) -> bool:
        """An in-file class defines `__call__`, or project names are imported (a class of
        another file may): only then can a call of a plain name run an object's `__call__`."""
        return bool(self._project_imports) or any(
            "__call__" in info.methods for info in self.classes.values()
        )

    def _instance_call(self, func: ast.Name) -> tuple[Facts, FunctionNode, bool] | None:
        """`compute(out, y)` where `compute` holds an object of a project class defining
        `__call__`: built right here (`compute = LossCompute(...)`), or a parameter every
        in-file call site passes such an object of one same class for. An `nn.Module` without
        its own `__call__` is not resolved (its call runs `forward` through torch)."""
        if func.id in cast("Facts", self)._function_names:
            return None
        assignment = self.reaching_assignment(func)
        if assignment is not None:
            if assignment.index is not None or assignment.loop is not None:
                return None
            values = [assignment.value]
        else:
            arguments = self.parameter_arguments(func, unbound=True)
            if not arguments:
                return None
            values = list(arguments)
        found: tuple[Facts, FunctionNode, bool] | None = None
        for value in values:
            target = self.called_instance_method(value)
            if target is None or (found is not None and target[1] is not found[1]):
                return None
            found = target
        return found

    def _held_instance_call(self, func: ast.Attribute) -> tuple[Facts, FunctionNode, bool] | None:
        """`self.loss_fn(out, y)` where every value the class (or its nearest project base
        class that assigns it, another file included) gives `self.loss_fn` is the
        construction of one same project class defining `__call__` (`self.loss_fn =
        LossCompute(...)`), a `None` placeholder aside: that `__call__`. A method of that
        name is what the call runs instead (the caller checks methods first)."""
        facts = cast("Facts", self)
        klass = facts.enclosing_class(func)
        info = self.classes.get(klass.name) if klass is not None else None
        if info is None or func.attr in info.methods:
            return None
        values = facts.get(ObjectModel).attribute_values(func)
        found: tuple[Facts, FunctionNode, bool] | None = None
        for value in values:
            if isinstance(value.expr, ast.Constant) and value.expr.value is None:
                continue
            target = value.facts.called_instance_method(value.expr)
            if target is None or (found is not None and target[1] is not found[1]):
                return None
            found = target
        return found

    def called_instance_method(
        self, value: ast.expr | None
    ) -> tuple[Facts, FunctionNode, bool] | None:
        """What calling the object `value` constructs runs: the `__call__` of its project
        class (`LossCompute(...)`, defined here or imported from another project file)."""
        if not isinstance(value, ast.Call) or not isinstance(value.func, ast.Name):
            return None
        name = value.func.id
        facts = cast("Facts", self)
        info = self.classes.get(name)
        owner: Facts | None = facts if info is not None else None
        if info is None and name in self.imports and self.workspace is not None:
            definition = facts.definition(name)
            if definition is not None and isinstance(definition.node, ast.ClassDef):
                owner = definition.facts
                info = owner.classes.get(definition.node.name)
        if owner is None or info is None or "__call__" not in info.methods:
            return None
        return owner, info.methods["__call__"], True

    def _packaged_callee(self, func: ast.Attribute) -> tuple[Facts, FunctionNode, bool] | None:
        """`pkg.train.run(...)` after `import pkg`: the module `pkg.train` of the project,
        found by its dotted name, and the function or class `run` it defines or imports."""
        parts: list[str] = []
        value: ast.expr = func.value
        while isinstance(value, ast.Attribute):
            parts.append(value.attr)
            value = value.value
        workspace = self.workspace
        if not isinstance(value, ast.Name) or value.id not in self._project_imports:
            return None
        if workspace is None or self.reaching_assignment(value) is not None:
            return None
        dotted = ".".join([self.imports[value.id], *reversed(parts)])
        other = workspace.module_facts(cast("Facts", self), "*", dotted=dotted)
        return _module_member(other, func.attr) if other is not None else None

    def summary(self, function: FunctionNode) -> Summary:
        """What `function` (of this file) does, in terms of its parameters (`summaries.py`)."""
        from torchls.analysis.summaries import summary_of

        return summary_of(self, function)

    @cached_property
    def project_calls(self) -> list[ast.Call]:
        """The calls of this file that run a project function (`callee` is known), in file
        order: the only calls whose summary a rule can ask."""
        return [call for call in self.calls if self.callee(call) is not None]

    def call_summary(self, call: ast.Call) -> tuple[Summary, dict[str, ast.expr], Facts] | None:
        """The summary of the project function `call` runs, its parameters bound to the
        call's arguments, and the facts of the file defining it; None when unknown."""
        target = self.callee(call)
        if target is None:
            return None
        owner, function, method = target
        summary = owner.summary(function)
        return summary, summary.bind(call, method), owner

    def returned_arguments(self, call: ast.Call) -> list[ast.expr]:
        """The arguments `call` hands back as they are: a project wrapper whose summary
        returns its parameter (`backend.distribute(loader)`, `ddp_wrap(model)`)."""
        asked = self.call_summary(call)
        if asked is None:
            return []
        summary, bound, _ = asked
        return [bound[name] for name in sorted(summary.returns) if name in bound]

    def parameter_of(self, name: ast.Name, unbound: bool = False) -> FunctionNode | None:
        """The function whose parameter `name` reads (not rebound before this read; `unbound`:
        the caller already knows no local assignment reaches it)."""
        if name.id not in self.parameter_names:
            return None
        function = self.scope(name)
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return None
        names = self._function_parameters.get(function)
        if names is None:
            args = function.args
            names = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
            self._function_parameters[function] = names
        if name.id not in names:
            return None
        if unbound:
            return function
        assignment = self.reaching_assignment(name)
        return function if assignment is None or assignment.stmt is function else None

    def parameter_arguments(self, name: ast.Name, unbound: bool = False) -> list[ast.expr] | None:
        """For a read of a parameter of an in-file function: the argument passed for it at
        every call site of the function (its default when a site omits it); None when the
        name is not an unrebound parameter, the function has no call site here, or a site's
        argument cannot be told."""
        if name.id not in self.called_parameter_names:
            return None  # no function with such a parameter is called in this file
        function = self.parameter_of(name, unbound)
        if function is None:
            return None
        key = (function, name.id)
        if key not in self._parameter_arguments:
            self._parameter_arguments[key] = self._arguments_for(function, name.id)
        return self._parameter_arguments[key]

    def _arguments_for(self, function: FunctionNode, param: str) -> list[ast.expr] | None:
        # A call of an object runs its `__call__` bound to it (`compute(out, y)`), whatever
        # the call's shape.
        called = function.name == "__call__"
        sites = [
            (site, called or isinstance(site.func, ast.Attribute))
            for site in self.call_sites(function)
        ]
        if function.name == "__init__":
            sites.extend((site, True) for site in self._construction_sites(function))
        sites.extend((site, True) for site in self._inherited_call_sites(function))
        if not sites:
            return None
        found: list[ast.expr] = []
        for site, bound_method in sites:
            told, value = argument_at(site, function, param, bound_method)
            if not told:
                return None  # `f(**options)`: any parameter may come from the mapping
            if value is None:
                value = parameter_default(function, param)
            if value is None:
                return None
            found.append(value)
        return found

    def _inherited_call_sites(self, function: FunctionNode) -> list[ast.Call]:
        """`self.m(...)` in base-class methods a subclass inherits, for the subclass's `m`
        (the object model's virtual dispatch)."""
        return cast("Facts", self).get(ObjectModel).inherited_call_sites(function)

    def _construction_sites(self, init: FunctionNode) -> list[ast.Call]:
        """`Net(...)` calls in this file for the `__init__` of class `Net`."""
        klass = self.parents.get(init)
        if not isinstance(klass, ast.ClassDef):
            return []
        return self._calls_by_name.get(klass.name, [])

    def argument_value(self, name: ast.Name, unbound: bool = False) -> ast.expr | None:
        """The one value a parameter is bound to: the argument every call site passes for it
        (the same expression text everywhere); None when sites disagree or are unknown."""
        if name.id not in self.called_parameter_names:
            return None  # `torch`, `F`, `len`, globals, uncalled functions' parameters
        if name in self._argument_value_of:
            return self._argument_value_of[name]
        found = self._argument_value(name, unbound)
        self._argument_value_of[name] = found
        return found

    def _argument_value(self, name: ast.Name, unbound: bool) -> ast.expr | None:
        arguments = self.parameter_arguments(name, unbound)
        if not arguments:
            return None
        key = id(arguments)  # one list per (function, parameter): memoise the agreement
        if key in self._argument_values:
            return self._argument_values[key][1]
        value = self._agreed_value(arguments)
        self._argument_values[key] = (arguments, value)  # keeps the list alive with its id
        return value

    def _agreed_value(self, arguments: list[ast.expr]) -> ast.expr | None:
        if len(arguments) == 1:
            return arguments[0]
        # Several sites agree only on a value that means the same everywhere: the same text
        # built from imported names and constants (`nn.CrossEntropyLoss()`), never a local
        # name, which may hold something else at each site.
        first = ast.dump(arguments[0])
        if any(ast.dump(a) != first for a in arguments[1:]):
            return None
        if any(
            isinstance(n, ast.Name) and n.id not in self.imports for n in ast.walk(arguments[0])
        ):
            return None
        return arguments[0]

    def parameter_annotation(self, name: ast.Name) -> ast.expr | None:
        """The annotation of the parameter `name` still holds (`cfg: TrainConfig`)."""
        function = self.parameter_of(name)
        if function is None:
            return None
        args = function.args
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            if arg.arg == name.id:
                return arg.annotation
        return None


def _module_member(module: Facts, name: str) -> tuple[Facts, FunctionNode, bool] | None:
    """What `module.name(...)` runs: a function or class `module` defines, or one it imports
    from another project file (a package's `__init__` re-exporting it)."""
    if name in module.functions:
        return module, module.functions[name], False
    info = module.classes.get(name)
    if info is not None:
        return (module, info.methods["__init__"], True) if "__init__" in info.methods else None
    definition = module.definition(name) if name in module.imports else None
    return _function_of(definition.facts, definition.node) if definition is not None else None
