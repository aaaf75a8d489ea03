"""Where a value comes from: origins through assignments, wrappers, `forward` returns and
project functions, and the activation a value carries.

Why: the loss-contract rules and the hover need "this is a softmax output" wherever the
softmax happened (another method, another file); provenance is followed once here.

In: the index and kind queries of the same `Facts`. Out: the `ValueQueries` mixin of `Facts`
(`origins`, `binding_value`, `same_object`, `graph_forwards`, `function_returns`, ...).
"""

from __future__ import annotations

import ast
from functools import cached_property
from typing import TYPE_CHECKING

from torchls.analysis.objects import ObjectModel
from torchls.analysis.queries.index import IndexQueries
from torchls.analysis.queries.tensors import activation_of
from torchls.analysis.queries.vocabulary import (
    DETACHING_METHODS,
    JOINING_FUNCTIONS,
    MAX_DEPTH,
    MAX_ORIGIN_STEPS,
    PASS_THROUGH_FUNCTIONS,
    PASS_THROUGH_METHODS,
    RETURNS_RECEIVER,
    Assignment,
    ClassInfo,
    FunctionNode,
    Origin,
    argument_at,
)
from torchls.analysis.registry import exemption
from torchls.records import replace

if TYPE_CHECKING:
    from collections.abc import Iterator

    from torchls.analysis.facts import Facts
    from torchls.analysis.queries.vocabulary import ScopeNode
    from torchls.analysis.resolver import CachedView, Definition, Workspace


class ValueQueries(IndexQueries):
    """Mixin of `Facts` (see the module docstring); reads the state `Facts.__init__` sets."""

    if TYPE_CHECKING:
        # What this mixin reads of `Facts` and of its sibling mixins, declared for the type
        # checker only (the definitions are in facts.py and the other query modules; a
        # declaration that disagrees with its definition is an error there).
        tree: ast.Module
        parents: dict[ast.AST, ast.AST]
        imports: dict[str, str]
        functions: dict[str, FunctionNode]
        classes: dict[str, ClassInfo]
        workspace: Workspace | CachedView | None
        _definitions: dict[str, Definition | None]
        _origin_steps: int
        _project_imports: set[str]

        def binding_alternatives(self, name: ast.Name) -> list[Assignment] | None: ...
        def call_qualname(self, call: ast.Call) -> str | None: ...
        def call_sites(self, function: FunctionNode) -> list[ast.Call]: ...
        def enclosing_class(self, node: ast.AST) -> ast.ClassDef | None: ...
        def parameter_of(self, name: ast.Name, unbound: bool = False) -> FunctionNode | None: ...
        @staticmethod
        def receiver(call: ast.Call) -> ast.expr | None: ...
        def reaching_assignment(self, name: ast.Name) -> Assignment | None: ...
        def constructs_module(self, call: ast.Call) -> bool: ...
        def short_name(self, call: ast.Call) -> str: ...
        @staticmethod
        def method_name(call: ast.Call) -> str | None: ...
        def module_class(self, name: str, depth: int = 0) -> ClassInfo | None: ...
        def walk_local(self, node: ast.AST) -> Iterator[ast.AST]: ...
        def is_inside(self, node: ast.AST, ancestor: ast.AST) -> bool: ...
        def callee(self, call: ast.Call) -> tuple[Facts, FunctionNode, bool] | None: ...
        def assignments_of(self, name: str, scope: ScopeNode) -> list[Assignment]: ...
        def parameter_arguments(
            self, name: ast.Name, unbound: bool = False
        ) -> list[ast.expr] | None: ...
        def argument_value(self, name: ast.Name, unbound: bool = False) -> ast.expr | None: ...
        def is_kind(self, expr: ast.AST | None, kind: str) -> bool: ...
        def key(self, expr: ast.AST | None) -> str | None: ...
        def _in_no_grad_block(self, node: ast.AST) -> bool: ...

    def returns_receiver(self, expr: ast.AST | None) -> bool:
        """`expr` is a call of a method that returns the object it is called on (for a module:
        `.to()`, `.cuda()`, `.float()`, `.train()`, `.eval()`, `.requires_grad_()`, ...)."""
        return (
            isinstance(expr, ast.Call)
            and isinstance(expr.func, ast.Attribute)
            and expr.func.attr in RETURNS_RECEIVER
        )

    def same_object(self, expr: ast.AST | None) -> ast.AST | None:
        """The object a chain of receiver-returning calls starts from: `model` for
        `model.to(device).train()` or `model.eval().cpu()`; `expr` itself otherwise."""
        if not isinstance(expr, ast.Call):
            return expr
        steps = 0
        while self.returns_receiver(expr) and steps < MAX_DEPTH * 4:
            expr = expr.func.value  # type: ignore[union-attr]
            steps += 1
        return expr

    def self_attribute_values(self, expr: ast.Attribute) -> list[ast.expr]:
        """Values assigned to `self.<attr>` in the class that `expr` is in."""
        if not isinstance(expr.value, ast.Name) or expr.value.id != "self":
            return []  # checked first: finding the enclosing class walks up the tree
        klass = self.enclosing_class(expr)
        if klass is None:
            return []
        info = self.classes.get(klass.name)
        return info.attributes.get(expr.attr, []) if info else []

    def binding_value(self, expr: ast.AST) -> ast.expr | None:
        """The single expression a name or `self.attr` was bound to, when there is one."""
        if isinstance(expr, ast.Name):
            assignment = self.reaching_assignment(expr)
            if assignment is not None and assignment.index is None and assignment.loop is None:
                return assignment.value
            if assignment is None:
                return self.argument_value(expr, unbound=True)
            return None
        if isinstance(expr, ast.Attribute):
            values = self.self_attribute_values(expr)
            return values[-1] if len(values) == 1 else None
        return None

    def origins(self, expr: ast.AST, depth: int = 0, via: tuple[ast.AST, ...] = ()) -> list[Origin]:
        """Where the value of `expr` is computed, following local assignments, `self`
        attributes, calls of modules (their `forward` returns; an `nn.Sequential`'s last layer;
        a factory function's returned module — in this file or, through the workspace, in
        another) and shape/device-only methods. Unknown ends (parameters, loop targets) are
        returned as themselves; callers decide what an unknown origin means. An origin found
        in another file carries that file's facts in `Origin.facts`."""
        if depth > MAX_DEPTH or self._origin_steps > MAX_ORIGIN_STEPS:
            return [Origin(expr, via)]
        self._origin_steps += 1
        if isinstance(expr, ast.Name):
            alternatives = self.binding_alternatives(expr) if depth < MAX_DEPTH else None
            if alternatives is not None:
                return self._alternative_origins(expr, alternatives, depth, via)
            assignment = self.reaching_assignment(expr)
            if assignment is None and depth < MAX_DEPTH:
                arguments = self.parameter_arguments(expr, unbound=True)
                if arguments:
                    # A parameter comes from what its call sites pass (every one of them).
                    return self._argument_origins(expr, arguments, depth, via)
            if assignment is not None and assignment.loop is not None and depth < MAX_DEPTH:
                return self._loop_target_origins(expr, assignment, depth, via)
            if assignment is None or assignment.value is None or assignment.loop is not None:
                return [Origin(expr, via)]
            value = assignment.value
            if assignment.index is not None:
                return self._indexed_origins(value, assignment.index, depth, (*via, expr))
            return self.origins(value, depth + 1, (*via, expr))
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            values = self.self_attribute_values(expr)
            if len(values) == 1:
                return self.origins(values[0], depth + 1, (*via, expr))
            if not values:
                # Assigned only by a base class, maybe in another file: follow it there.
                inherited = self.get(ObjectModel).inherited_attribute_values(expr)  # type: ignore[attr-defined]
                if len(inherited) == 1:
                    only = inherited[0]
                    return self._origins_in(only.facts, only.expr, depth, (*via, expr))
            return [Origin(expr, via)]
        if isinstance(expr, ast.Subscript) and _selects_elements(expr.slice):
            # `probs[mask == 1]`, `probs[:, :k]`: a selection of the values it is cut from.
            return self.origins(expr.value, depth, (*via, expr))
        if isinstance(expr, ast.Call):
            method = self.method_name(expr)
            receiver = self.receiver(expr)
            if (
                expr.args
                and not isinstance(expr.args[0], ast.Starred)
                and (self.call_qualname(expr) or "") in PASS_THROUGH_FUNCTIONS
            ):
                # A step into the same expression (`torch.squeeze(p)`, `p.view(-1)`, a join)
                # is no hop: the depth counts names, calls and files followed.
                return self.origins(expr.args[0], depth, (*via, expr))
            joined = self._joined_pieces(expr)
            if joined:
                # `torch.cat((probs_a, probs_b))`: every value comes from one of the pieces.
                return [o for piece in joined for o in self.origins(piece, depth, (*via, expr))]
            if receiver is not None and method in PASS_THROUGH_METHODS:
                return self.origins(receiver, depth, (*via, expr))
            if receiver is not None and (
                (method == "type" and bool(expr.args or expr.keywords))  # a cast
                or self.returns_receiver(expr)
            ):
                return self.origins(receiver, depth + 1, (*via, expr))
            if isinstance(expr.func, ast.Name) and depth < MAX_DEPTH:
                alternatives = self.binding_alternatives(expr.func)
                if alternatives is not None:
                    # `model(x)` where `model` is `A()` on one path and `B()` on another.
                    return self._alternative_calls(expr, alternatives, depth, via)
                chosen = self.binding_value(expr.func)
                if (
                    isinstance(chosen, ast.IfExp)
                    and isinstance(chosen.body, ast.Call)
                    and isinstance(chosen.orelse, ast.Call)
                ):
                    # `model = MLP() if kind == "mlp" else CNN()`: each side is one path.
                    found: list[Origin] = []
                    for side in (chosen.body, chosen.orelse):
                        inner = self._module_call_origins(expr, depth, via, side)
                        found.extend(_in_branch(inner or [Origin(expr, via)], side))
                    return found
            module_origins = self._module_call_origins(expr, depth, via)
            if module_origins is None and method == "forward":
                alias = self._forward_as_call(expr)
                if alias is not None:
                    module_origins = self._module_call_origins(alias, depth, via)
            if module_origins is not None:
                return module_origins
            if isinstance(expr.func, ast.Name) and depth < MAX_DEPTH:
                handed = self._module_handed_from_other_files(expr, depth, via)
                if handed is not None:
                    return handed
        return [Origin(expr, via)]

    def _argument_origins(
        self, name: ast.Name, arguments: list[ast.expr], depth: int, via: tuple[ast.AST, ...]
    ) -> list[Origin]:
        """Origins of what the call sites pass for the parameter `name`; for a method that
        base-class methods call on `self`, followed as on an object of its class (the
        base's `self.forward(x)` runs this class's `forward` there)."""
        model = self.get(ObjectModel)  # type: ignore[attr-defined]
        function = self.parameter_of(name, unbound=True)
        dispatch = model.parameter_dispatch(function) if function is not None else None
        if dispatch is None:
            return [o for a in arguments for o in self.origins(a, depth + 1, (*via, name))]
        with model.dispatching_as(dispatch):
            found = [o for a in arguments for o in self.origins(a, depth + 1, (*via, name))]
        return model.dispatched_only(found, dispatch)

    def _joined_pieces(self, call: ast.Call) -> list[ast.expr] | None:
        """The tensors `torch.cat((a, b), dim)` (or `torch.stack`) joins, when they are
        written out, leaving out an empty start (`torch.tensor([])`, the seed of a tensor
        grown in a loop: `acc = torch.cat((acc, piece))`); None for any other call."""
        if not call.args or (self.call_qualname(call) or "") not in JOINING_FUNCTIONS:
            return None
        pieces = call.args[0]
        if not isinstance(pieces, (ast.Tuple, ast.List)) or any(
            isinstance(piece, ast.Starred) for piece in pieces.elts
        ):
            return None
        kept = [piece for piece in pieces.elts if not self._empty_tensor(piece)]
        return kept or None

    def _empty_tensor(self, expr: ast.expr) -> bool:
        """`torch.tensor([])` (also `torch.Tensor([])`, `torch.empty(0)`), directly or as the
        one value a local name reaching here holds."""
        if isinstance(expr, ast.Name):
            assignment = self.reaching_assignment(expr)
            if assignment is None or assignment.index is not None or assignment.loop is not None:
                return False
            expr = assignment.value  # type: ignore[assignment]
        if not isinstance(expr, ast.Call) or not expr.args:
            return False
        name = self.call_qualname(expr) or ""
        first = expr.args[0]
        if name in ("torch.tensor", "torch.Tensor"):
            return isinstance(first, (ast.List, ast.Tuple)) and not first.elts
        return (
            name in ("torch.empty", "torch.zeros")
            and len(expr.args) == 1
            and isinstance(first, ast.Constant)
            and first.value == 0
        )

    def _forward_as_call(self, call: ast.Call) -> ast.Call | None:
        """`model.forward(x)` written as the call `model(x)` it stands for (hooks aside), so
        the module's output is followed the same way; one per call, placed where the call is
        (same position, same parent); `self.forward(x)` stands for `self(x)` (a Lightning
        `training_step` running its own network). None for `super().forward(...)`."""
        receiver = self.receiver(call)
        if not isinstance(receiver, (ast.Name, ast.Attribute)):
            return None
        aliases = self._forward_aliases
        if call not in aliases:
            alias = ast.Call(func=receiver, args=call.args, keywords=call.keywords)
            ast.copy_location(alias, call)
            alias.end_lineno, alias.end_col_offset = call.end_lineno, call.end_col_offset
            parent = self.parents.get(call)
            if parent is not None:
                self.parents[alias] = parent
            aliases[call] = alias
        return aliases[call]

    @cached_property
    def _forward_aliases(self) -> dict[ast.Call, ast.Call]:
        return {}

    def _module_handed_from_other_files(
        self, call: ast.Call, depth: int, via: tuple[ast.AST, ...]
    ) -> list[Origin] | None:
        """`net(images)` with `net` a parameter of a function that no call in this file runs:
        the outputs of the modules its callers in the project's other files pass for it
        (`local.train(net=copy.deepcopy(net_glob))` in the script, `net_glob` built as one
        of several networks). None when a caller's argument cannot be told or is no module
        whose output can be followed."""
        func = call.func
        assert isinstance(func, ast.Name)
        function = self.parameter_of(func)
        if function is None or self.call_sites(function):
            return None
        sites = self.calls_from_other_files(function)  # type: ignore[attr-defined]
        if not sites:
            return None
        found: list[Origin] = []
        for other, site in sites:
            told, argument = argument_at(
                site, function, func.id, isinstance(site.func, ast.Attribute)
            )
            if not told or argument is None:
                return None
            inner = other._origins_of_module_value(call, argument, depth + 1, (*via, site))
            if inner is None:
                return None
            found.extend(replace(o, facts=o.facts or other) for o in inner)
        return found

    def _origins_of_module_value(
        self, call: ast.Call, value: ast.expr, depth: int, via: tuple[ast.AST, ...]
    ) -> list[Origin] | None:
        """Origins of running the module `value` (an expression of this file) holds, through
        copies and moves (`copy.deepcopy(net).to(device)`) and an `if` choosing the module
        (`net = A()` / `net = B()`); None when no module output can be followed."""
        steps = 0
        while isinstance(value, ast.Call) and steps < MAX_DEPTH:
            if self.returns_receiver(value) and self.receiver(value) is not None:
                value = self.receiver(value)  # type: ignore[assignment]
            elif (self.call_qualname(value) or "") in ("copy.deepcopy", "copy.copy") and value.args:
                value = value.args[0]
            else:
                break
            steps += 1
        if isinstance(value, ast.Name):
            alternatives = self.binding_alternatives(value)
            if alternatives is not None:
                if any(a.value is None or a.index is not None or a.loop for a in alternatives):
                    return None
                found: list[Origin] = []
                for alternative in alternatives:
                    inner = self._module_call_origins(call, depth, via, alternative.value)
                    if inner is None:
                        return None
                    found.extend(_in_branch(inner, alternative.stmt))
                return found
        return self._module_call_origins(call, depth, via, value)

    def _loop_target_origins(
        self, expr: ast.Name, assignment: Assignment, depth: int, via: tuple[ast.AST, ...]
    ) -> list[Origin]:
        """`for row in probs:` with `probs` an activation's output (every origin of it):
        iterating a tensor yields slices of it, each still that activation's output. Any
        other loop target (a loader's batch, an element of a list) is its own origin."""
        loop = assignment.loop
        if loop is None or not isinstance(loop.target, ast.Name):
            return [Origin(expr, via)]
        inner = self.origins(loop.iter, depth + 1, (*via, expr))
        if inner and all(activation_of(self, o) is not None for o in inner):  # type: ignore[arg-type]
            return inner
        return [Origin(expr, via)]

    def _alternative_origins(
        self, expr: ast.Name, alternatives: list[Assignment], depth: int, via: tuple[ast.AST, ...]
    ) -> list[Origin]:
        found: list[Origin] = []
        for alternative in alternatives:
            if alternative.value is None or alternative.loop is not None:
                found.append(Origin(expr, via, branch=alternative.stmt))
                continue
            if alternative.index is not None:
                inner = self._indexed_origins(
                    alternative.value, alternative.index, depth, (*via, expr)
                )
            else:
                inner = self.origins(alternative.value, depth + 1, (*via, expr))
            found.extend(_in_branch(inner, alternative.stmt))
        return found

    def _alternative_calls(
        self, call: ast.Call, alternatives: list[Assignment], depth: int, via: tuple[ast.AST, ...]
    ) -> list[Origin]:
        found: list[Origin] = []
        for alternative in alternatives:
            inner = None
            if alternative.value is not None and alternative.index is None and not alternative.loop:
                inner = self._module_call_origins(call, depth, via, alternative.value)
            found.extend(_in_branch(inner or [Origin(call, via)], alternative.stmt))
        return found

    def owner(self, origin: Origin) -> Facts:
        """The facts of the file `origin` was found in."""
        return origin.facts or self

    def owns(self, node: ast.AST) -> bool:
        return node is self.tree or node in self.parents

    def _origins_in(
        self, owner: Facts, expr: ast.AST, depth: int, via: tuple[ast.AST, ...]
    ) -> list[Origin]:
        if owner is self:
            return self.origins(expr, depth + 1, via)
        return [
            Origin(o.node, (*via, *o.via), o.module_output, o.facts or owner, o.branch)
            for o in owner.origins(expr, depth + 1)
        ]

    def _indexed_origins(
        self, value: ast.expr, index: int, depth: int, via: tuple[ast.AST, ...]
    ) -> list[Origin]:
        if isinstance(value, ast.Call):
            returns = self._forward_returns_of_call(value, depth)
            if returns is None and depth < MAX_DEPTH:
                # `opts, ds_init = get_args()` of a plain function: when every return hands
                # back a tuple long enough, the element comes from the same position of each.
                plain = self.function_returns(value)
                if plain and all(
                    isinstance(r, ast.Tuple) and index < len(r.elts) for _, r in plain
                ):
                    returns = plain
            if returns is not None:
                out = []
                for owner, returned in returns:
                    if isinstance(returned, ast.Tuple) and index < len(returned.elts):
                        out.extend(
                            self._origins_in(owner, returned.elts[index], depth, (*via, value))
                        )
                    else:
                        out.append(Origin(value, via))
                return out
            dispatched = self.get(ObjectModel).dispatched_returns(value)  # type: ignore[attr-defined]
            if dispatched is not None and depth < MAX_DEPTH:
                # `pred, aux = self.forward(x)` in a base class's method: each class's own
                # definition is a path of its own (virtual dispatch).
                out = []
                for owner, returned, klass in dispatched:
                    if isinstance(returned, ast.Tuple) and index < len(returned.elts):
                        inner = self._origins_in(owner, returned.elts[index], depth, (*via, value))
                    else:
                        inner = [Origin(value, via)]
                    out.extend(_in_branch(inner, klass) if klass is not None else inner)
                return out
        return [Origin(value, via)]

    def _module_call_origins(
        self, call: ast.Call, depth: int, via: tuple[ast.AST, ...], bound: ast.expr | None = None
    ) -> list[Origin] | None:
        """Origins of `module(x)`: the module's forward returns, or its last layer. `bound`:
        the value the called name holds on the path asked about (else its one binding)."""
        if bound is None and isinstance(call.func, ast.Attribute):
            several = self.self_attribute_values(call.func)
            if len(several) > 1:
                return self._several_module_origins(call, depth, via, several)
            bound = self._sibling_attribute_value(call.func)
        built = self._module_constructor(call.func, depth, bound)
        if built is not None:
            owner, constructor = built
            outputs = owner._constructor_output(constructor, depth, ())
            return [
                Origin(o.node, (*via, call, *o.via), o.module_output, o.facts or owner, o.branch)
                if owner is not self
                else Origin(o.node, (*via, call, *o.via), o.module_output, o.facts, o.branch)
                for o in outputs
            ]
        returns = self._forward_returns_of_call(call, depth, bound)
        overrides = self._forward_overrides(call)
        if returns is None and not overrides:
            return None
        out: list[Origin] = []
        for owner, returned in returns or ():
            out.extend(self._origins_in(owner, returned, depth, (*via, call)))
        if overrides:
            # `self(x)` in a base class's method runs the `forward` of the object's class: one
            # path per class, so a subclass whose `forward` breaks a contract is its own choice.
            klass = self.enclosing_class(call)
            out = _in_branch(out, klass) if klass is not None else out
            for ref, forward in overrides:
                for node in ref.facts.walk_local(forward):
                    if isinstance(node, ast.Return) and node.value is not None:
                        inner = self._origins_in(ref.facts, node.value, depth, (*via, call))
                        out.extend(_in_branch(inner, ref.info.node))
        instance = self._module_instance(call, bound)
        if instance is not None:
            out = self._bind_forward_parameters(call, depth, via, out, *instance)
            kept = [o for o in out if not _arm_off_at_construction(self, o, *instance)]
            out = kept or out
        return out

    def _bind_forward_parameters(
        self,
        call: ast.Call,
        depth: int,
        via: tuple[ast.AST, ...],
        origins: list[Origin],
        owner: Facts,
        info: ClassInfo,
        constructor: ast.Call,
    ) -> list[Origin]:
        """A wrapper module's forward returns the output of a module it is handed
        (`def forward(self, x, layer): return layer(self.drop(x))`): at the call `call` of it,
        that output is the output of the module passed for `layer` there
        (`self.wrap(x, nn.Sequential(self.fc, self.softmax))`)."""
        forward = info.methods.get("forward")
        if forward is None or not self.owns(call) or depth >= MAX_DEPTH:
            return origins
        bound: list[Origin] = []
        for origin in origins:
            node = origin.node
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and not origin.module_output
                and (origin.facts or self) is owner
                and owner.parameter_of(node.func) is forward
            ):
                told, argument = argument_at(call, forward, node.func.id, True)
                if told and argument is not None:
                    inner = self._module_call_origins(node, depth + 1, (*via, call), argument)
                    if inner is not None:
                        bound.extend(inner)
                        continue
            bound.append(origin)
        return bound

    def _several_module_origins(
        self, call: ast.Call, depth: int, via: tuple[ast.AST, ...], values: list[ast.expr]
    ) -> list[Origin] | None:
        """Origins of `self.head(x)` when the class assigns `self.head` more than once (one
        `nn.Sequential` per arm of an `if` in `__init__`): the outputs of every module it may
        hold, untagged, so a contract holds only when every one of them breaks it; None when
        one of them is not a module whose output can be followed."""
        found: list[Origin] = []
        for value in values:
            inner = self._module_call_origins(call, depth + 1, via, value)
            if inner is None:
                return None
            found.extend(inner)
        return found

    def _sibling_attribute_value(self, expr: ast.Attribute) -> ast.expr | None:
        """What `module.head` holds when read on a parameter `module` of a method, and the
        only assignment of a `.head` in this file is `module.head = ...` on a parameter of
        the same name in a method of the same class (a callback that attaches a head to the
        module it is handed in one hook and runs it in the others)."""
        owner = expr.value
        if not isinstance(owner, ast.Name) or owner.id == "self":
            return None
        assigned = self._attribute_assignments.get(expr.attr)
        if assigned is None or len(assigned) != 1:
            return None
        target, value = assigned[0]
        if not (isinstance(target.value, ast.Name) and target.value.id == owner.id):
            return None
        if self.parameter_of(owner) is None or self.parameter_of(target.value) is None:
            return None
        klass = self.enclosing_class(expr)
        if klass is None or klass is not self.enclosing_class(target):
            return None
        return value

    @cached_property
    def _attribute_assignments(self) -> dict[str, list[tuple[ast.Attribute, ast.expr | None]]]:
        """Every `obj.attr = value` of the file (on any object, `self` included), by
        attribute name; a target of a tuple, augmented or annotated assignment, or a `del`,
        records no value."""
        found: dict[str, list[tuple[ast.Attribute, ast.expr | None]]] = {}
        # The index's parent table holds every node of the tree: no walk needed.
        for node, parent in self.parents.items():
            if type(node) is ast.Attribute and not isinstance(node.ctx, ast.Load):
                value = parent.value if isinstance(parent, ast.Assign) else None
                if isinstance(parent, ast.Assign) and len(parent.targets) != 1:
                    value = None
                found.setdefault(node.attr, []).append((node, value))
        return found

    def _flag_at_construction(
        self, test: ast.expr, info: ClassInfo, constructor: ast.Call
    ) -> bool | None:
        """The truth of `self.flag` / `not self.flag` for the instance `constructor` builds,
        or None when it cannot be told from constants."""
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            inner = self._flag_at_construction(test.operand, info, constructor)
            return None if inner is None else not inner
        if not (
            isinstance(test, ast.Attribute)
            and isinstance(test.value, ast.Name)
            and test.value.id == "self"
        ):
            return None
        stored = info.attributes.get(test.attr, [])
        init = info.methods.get("__init__")
        if len(stored) != 1 or not isinstance(stored[0], ast.Name) or init is None:
            return None
        if not self.is_inside(stored[0], init):
            return None
        name = stored[0].id
        arguments = init.args
        if arguments.vararg is not None or arguments.kwarg is not None:
            return None
        if self.assignments_of(name, init)[1:]:
            return None  # rebound in __init__ after it arrived as a parameter
        positional = [*arguments.posonlyargs, *arguments.args][1:]
        names = [a.arg for a in positional]
        value: ast.expr | None = None
        if name in names:
            index = names.index(name)
            if any(isinstance(a, ast.Starred) for a in constructor.args) or any(
                k.arg is None for k in constructor.keywords
            ):
                return None
            if index < len(constructor.args):
                value = constructor.args[index]
            defaults = arguments.defaults
            first_default = len(positional) - len(defaults)
            if value is None and index >= first_default:
                value = defaults[index - first_default]
        else:
            kwonly = [a.arg for a in arguments.kwonlyargs]
            if name not in kwonly:
                return None
            value = arguments.kw_defaults[kwonly.index(name)]
        for keyword in constructor.keywords:
            if keyword.arg == name:
                value = keyword.value
        if not isinstance(value, ast.Constant):
            return None
        return bool(value.value)

    def _module_constructor(
        self, func: ast.expr, depth: int, bound: ast.expr | None = None
    ) -> tuple[Facts, ast.Call] | None:
        """The `nn.X(...)` call that built the module object `func` refers to: directly, or the
        module a factory function (here or in another project file) returns."""
        value = bound
        if value is None and isinstance(func, (ast.Name, ast.Attribute)):
            value = self.binding_value(func)
        steps = 0
        while isinstance(value, ast.Name) and steps < MAX_DEPTH:
            value = self.binding_value(value)  # `self.head = head`, a constructor parameter
            steps += 1
        while isinstance(value, ast.Call) and steps < MAX_DEPTH:
            qualname = self.call_qualname(value) or ""
            if qualname in PARALLEL_WRAPPERS and value.args:
                value = self._wrapped(value)  # `nn.DataParallel(net)` runs `net`
                steps += 1
                continue
            if qualname.startswith("torch.nn.") and self.short_name(value)[:1].isupper():
                return self, value
            if self.returns_receiver(value):
                value = self.binding_value(self.receiver(value)) or (
                    self.receiver(value) if isinstance(self.receiver(value), ast.Call) else None
                )
                steps += 1
                continue
            for owner, returned in self.function_returns(value) or ():
                if isinstance(returned, ast.Name):
                    # `net = nn.Sequential(); net.add_module(...); return net`
                    held = owner.binding_value(returned)
                    returned = held if isinstance(held, ast.Call) else returned
                if isinstance(returned, ast.Call):
                    qualname = owner.call_qualname(returned) or ""
                    if (
                        qualname.startswith("torch.nn.")
                        and owner.short_name(returned)[:1].isupper()
                    ):
                        return owner, returned
            return None
        return None

    def _constructor_output(
        self, constructor: ast.Call, depth: int, via: tuple[ast.AST, ...]
    ) -> list[Origin]:
        short = self.short_name(constructor)
        if short == "Sequential" and not constructor.args and not constructor.keywords:
            added = self._last_added_module(constructor)
            if added is not None:
                return self._constructor_output(added, depth + 1, (*via, constructor))
        if short == "Sequential" and constructor.args:
            last = constructor.args[-1]
            if isinstance(last, (ast.Name, ast.Attribute)):
                # `nn.Sequential(self.fc, self.softmax)`: the module that name was built as.
                held = self.binding_value(last)
                last = held if isinstance(held, ast.Call) else last
            if isinstance(last, ast.Call):
                inner = (self.call_qualname(last) or "").startswith("torch.nn.")
                if inner:
                    return self._constructor_output(last, depth + 1, (*via, constructor))
                found = self.module_class_of_call(last)
                if found is not None:
                    owner, info = found
                    returns = owner._forward_returns(info, depth)
                    if returns is not None:
                        return [o for r in returns for o in self._origins_in(owner, r, depth, via)]
        return [Origin(constructor, via, module_output=True)]

    def _last_added_module(self, constructor: ast.Call) -> ast.Call | None:
        """For `net = nn.Sequential()` (or `self.fc = nn.Sequential()`) filled by
        `net.add_module("fc", nn.Linear(...))` statements in the same block: the `nn.X(...)`
        the last of them adds (the layer the Sequential ends in). None when a later statement
        of the block may add or replace layers some other way, or the last module is no torch
        layer built in place."""
        assign = self.parents.get(constructor)
        if not (
            isinstance(assign, ast.Assign)
            and len(assign.targets) == 1
            and isinstance(assign.targets[0], (ast.Name, ast.Attribute))
        ):
            return None
        name = self.key(assign.targets[0])
        block = getattr(self.parents.get(assign), "body", None)
        if name is None or not isinstance(block, list) or assign not in block:
            return None
        last: ast.Call | None = None
        for statement in block[block.index(assign) + 1 :]:
            call = statement.value if isinstance(statement, ast.Expr) else None
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "add_module"
                and self.key(call.func.value) == name
                and len(call.args) == 2
            ):
                added = call.args[1]
                last = added if isinstance(added, ast.Call) else None
                if last is None or not (self.call_qualname(last) or "").startswith("torch.nn."):
                    return None
            elif any(
                (
                    isinstance(node, (ast.Name, ast.Attribute))
                    and isinstance(node.ctx, ast.Store)
                    and self.key(node) == name
                )
                or (
                    isinstance(node, ast.Attribute)
                    and node.attr in ("add_module", "append", "extend", "insert")
                    and self.key(node.value) == name
                )
                for node in ast.walk(statement)
            ):
                # Rebound, or layers added under a branch or a loop: which one is last is
                # not known here.
                return None
        return last

    def _wrapped(self, wrapper: ast.Call) -> ast.expr | None:
        """The module a parallel wrapper was given: its construction when the argument is
        a name bound to one (`nn.DataParallel(net)` after `net = Net()`)."""
        inner = wrapper.args[0]
        if isinstance(inner, (ast.Name, ast.Attribute)):
            return self.binding_value(inner)
        return inner

    def _forward_returns_of_call(
        self, call: ast.Call, depth: int, bound: ast.expr | None = None
    ) -> list[tuple[Facts, ast.expr]] | None:
        """(file facts, return expression) of `forward` when `call` calls an instance of a
        module class defined in this file or in another project file."""
        func = call.func
        found: tuple[Facts, ClassInfo] | None = None
        if isinstance(func, ast.Name) and func.id == "self":
            klass = self.enclosing_class(call)
            info = self.module_class(klass.name) if klass else None
            found = (self, info) if info is not None else None
        else:
            instance = self._module_instance(call, bound)
            found = instance[:2] if instance is not None else None
        if found is None:
            return None
        owner, info = found
        returns = owner._forward_returns(info, depth)
        return [(owner, r) for r in returns] if returns is not None else None

    def _forward_overrides(self, call: ast.Call) -> list:
        """The subclasses' `forward` definitions `self(x)` may run (`ObjectModel`'s
        virtual dispatch); none for any other call."""
        if not (isinstance(call.func, ast.Name) and call.func.id == "self"):
            return []
        return self.get(ObjectModel).overrides_in_subclasses(call, "forward")  # type: ignore[attr-defined]

    def module_instance(self, call: ast.Call) -> tuple[Facts, ClassInfo, ast.Call] | None:
        """(file facts, class, constructor call) of the project module `call` runs, when its
        construction is in sight (`criterion(x, y)` after `criterion = FocalLoss().cuda()`)."""
        return self._module_instance(call)

    def _module_instance(
        self, call: ast.Call, bound: ast.expr | None = None
    ) -> tuple[Facts, ClassInfo, ast.Call] | None:
        """(file facts, class, constructor call) of the project module instance `call`
        calls (`model(x)` after `model = Net(...).to(device)`), when its construction is in
        sight."""
        func = call.func
        if isinstance(func, (ast.Name, ast.Attribute)) and not (
            isinstance(func, ast.Name) and func.id == "self"
        ):
            return self._module_built_by(bound if bound is not None else self.binding_value(func))
        return None

    def module_object(self, expr: ast.expr) -> tuple[Facts, ClassInfo, ast.Call] | None:
        """(file facts, class, constructor call) when `expr` holds an instance of a project
        module class whose construction is in sight (`net` after `net = Net().to(device)`,
        or `nn.DataParallel(Net())`)."""
        if not isinstance(expr, (ast.Name, ast.Attribute)) or (
            isinstance(expr, ast.Name) and expr.id == "self"
        ):
            return None
        return self._module_built_by(self.binding_value(expr))

    def _module_built_by(self, value: ast.expr | None) -> tuple[Facts, ClassInfo, ast.Call] | None:
        """The project module class a value is constructed from, through parallel wrappers
        and methods that return their receiver (`.to(device)`, `.cuda()`)."""
        steps = 0
        while isinstance(value, (ast.Name, ast.Attribute)) and steps < MAX_DEPTH:
            # A parameter's argument at its call site (`train(net_glob, ...)`): what that
            # name holds there.
            value = self.binding_value(value)
            steps += 1
        while isinstance(value, ast.Call) and steps < MAX_DEPTH:
            if (self.call_qualname(value) or "") in PARALLEL_WRAPPERS and value.args:
                value = self._wrapped(value)
                steps += 1
                continue
            klass = self.module_class_of_call(value)
            if klass is not None:
                return (*klass, value)
            receiver = self.receiver(value)
            if self.returns_receiver(value):
                value = self.binding_value(receiver) if receiver is not None else None
                if value is None and isinstance(receiver, ast.Call):
                    value = receiver
                steps += 1
                continue
            break
        return None

    def _forward_returns(self, info: ClassInfo, depth: int) -> list[ast.expr] | None:
        forward = info.methods.get("forward")
        if forward is None:
            for base in info.bases:
                if base in self.classes and depth < MAX_DEPTH:
                    return self._forward_returns(self.classes[base], depth + 1)
            return None
        returns = [
            node.value
            for node in self.walk_local(forward)
            if isinstance(node, ast.Return) and node.value is not None
        ]
        return returns or None

    def definition(self, name: str) -> Definition | None:
        """What an imported `name` is defined as in another project file (via the workspace)."""
        if self.workspace is None or name not in self.imports:
            return None
        if name not in self._definitions:
            self._definitions[name] = self.workspace.resolve(self, name)
        return self._definitions[name]

    def module_class_of_call(self, call: ast.Call) -> tuple[Facts, ClassInfo] | None:
        """For `Net(...)`: the facts and class info of `Net` when it is an nn.Module subclass
        defined in this file or in another project file (`Net(...)`, or `models.Net(...)`
        through a project module named by the index)."""
        func = call.func
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id in self._project_imports
            and self.workspace is not None
        ):
            other = self.workspace.module_facts(self, func.value.id)
            if other is not None and func.attr in other.classes:
                other_info = other.module_class(func.attr)
                return (other, other_info) if other_info is not None else None
            return None
        if not isinstance(call.func, ast.Name):
            return None
        name = call.func.id
        info = self.module_class(name)
        if info is not None:
            return self, info
        definition = self.definition(name)
        if definition is not None and isinstance(definition.node, ast.ClassDef):
            other = definition.facts
            other_info = other.module_class(definition.node.name)
            if other_info is not None:
                return other, other_info
        return None

    def function_returns(self, call: ast.Call) -> list[tuple[Facts, ast.expr]] | None:
        """(file facts, return expression) of the plain function `call` calls, here or in
        another project file (factories such as `build_model()` or `make_criterion()`), or
        reached through its module or package (`data.make_loaders()`, `pkg.data.build()`)."""
        owner: Facts = self
        function: FunctionNode | None
        if isinstance(call.func, ast.Attribute):
            target = self.callee(call)
            if target is None or target[2]:
                return None  # unknown, or a method: its returns depend on the object
            owner, function = target[0], target[1]
        elif not isinstance(call.func, ast.Name):
            return None
        else:
            function = self.functions.get(call.func.id)
        if function is None and isinstance(call.func, ast.Name):
            name = call.func.id
            definition = self.definition(name)
            if definition is None or isinstance(definition.node, ast.ClassDef):
                return None
            owner, function = definition.facts, definition.node
        if function is None:
            return None
        returns = [
            (owner, node.value)
            for node in owner.walk_local(function)
            if isinstance(node, ast.Return) and node.value is not None
        ]
        return returns or None

    def graph_forwards(self, expr: ast.AST, depth: int = 0) -> set[ast.Call]:
        """The forward calls (`model(x)`, `self.net(x)`) whose autograd graph the value of
        `expr` is built from, following local assignments, the tensors a call takes and a
        tensor method's receiver; `.detach()`, `.item()`, `.data` and values computed under
        `no_grad` cut the graph. A module's own object (its constructor, `.to(device)`) is never
        part of it: its parameters are leaves, so two calls of one module build two graphs."""
        found: set[ast.Call] = set()
        if depth > MAX_DEPTH:
            return found
        todo: list[ast.AST] = [expr]
        while todo:
            node = todo.pop()
            if isinstance(node, ast.Call):
                if self.method_name(node) in DETACHING_METHODS:
                    continue
                if (self.call_qualname(node) or "") in FRESH_LIKE and not any(
                    k.arg == "requires_grad" for k in node.keywords
                ):
                    continue  # `torch.rand_like(out)`: a new leaf with `out`'s shape only
                if self.returns_receiver(node) and self.constructs_module(node):
                    continue  # moving a module (`D.cuda()`): its parameters are leaves
                if self._grad_free_callee(node):
                    continue  # `tuner.tune(pred)` under `@torch.no_grad()`: returns no graph
                func = node.func
                cut: set[int] = set()
                if self.is_forward_call(node):
                    found.add(node)
                    cut = self._detached_inputs(node)
                elif isinstance(func, ast.Attribute):
                    todo.append(func.value)  # `out.pow(2)`: the receiver is a graph tensor
                todo.extend(a for i, a in enumerate(node.args) if i not in cut)
                todo.extend(keyword.value for keyword in node.keywords)
                continue
            if isinstance(node, ast.Name):
                if isinstance(node.ctx, ast.Load):
                    assignment = self.reaching_assignment(node)
                    if (
                        assignment is not None
                        and assignment.value is not None
                        and assignment.loop is None
                        # A module object (`D.output_shape`, `D = D.cuda()`) carries no graph.
                        and not (
                            isinstance(assignment.value, ast.Call)
                            and assignment.index is None
                            and self.constructs_module(assignment.value)
                        )
                        and not self._in_no_grad_block(assignment.stmt)
                    ):
                        found |= self.graph_forwards(assignment.value, depth + 1)
                continue
            if isinstance(node, ast.Attribute) and node.attr == "data":
                continue
            if isinstance(node, (ast.Lambda, ast.comprehension)):
                continue
            todo.extend(ast.iter_child_nodes(node))
        return found

    def _detached_inputs(self, call: ast.Call) -> set[int]:
        """Positions of the arguments that the forward of the project module `call` runs
        only ever reads detached (`y_target.detach()`, `y_target.data`): the module's output
        carries no graph from them (a self-training loss taking pseudo-labels from a tensor)."""
        instance = self._module_instance(call)
        if instance is None or any(isinstance(a, ast.Starred) for a in call.args):
            return set()
        owner, info, _ = instance
        forward = info.methods.get("forward")
        if forward is None:
            return set()
        params = [a.arg for a in [*forward.args.posonlyargs, *forward.args.args]][1:]
        cut: set[int] = set()
        for position, name in enumerate(params[: len(call.args)]):
            uses = [
                n
                for n in owner.walk_local(forward)
                if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
            ]
            rebound = any(
                isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load)
                for n in owner.walk_local(forward)
            )
            if uses and not rebound and all(_read_detached(owner, use) for use in uses):
                cut.add(position)
        return cut

    def _grad_free_callee(self, call: ast.Call) -> bool:
        """`call` runs a project function decorated with `@torch.no_grad()` (or
        `inference_mode`): whatever it returns was computed without a graph."""
        if not isinstance(call.func, (ast.Name, ast.Attribute)):
            return False
        found = self.callee(call)
        if found is None:
            return False
        owner, function, _ = found
        return owner.grad_disabling_decorator(function)

    def is_forward_call(self, call: ast.Call) -> bool:
        """`model(x)` / `self.net(x)`: a call of a module instance, which records a graph.
        Building the module (`Discriminator(shape)`) or moving it is not a forward call."""
        func = call.func
        if not isinstance(func, (ast.Name, ast.Attribute)) or not self.is_kind(func, "model"):
            return False
        return not self.constructs_module(call)


@exemption("TL101", "neg_softmax_behind_constructor_flag.py")
@exemption("TL102", "neg_sigmoid_behind_constructor_flag.py")
@exemption("TL103", "neg_sigmoid_behind_constructor_flag.py")
@exemption("TL104", "neg_softmax_behind_constructor_flag.py")
def _arm_off_at_construction(
    facts: ValueQueries, origin: Origin, owner: Facts, info: ClassInfo, constructor: ast.Call
) -> bool:
    """The activation sits in an arm of an `if self.flag:` in the class's own methods that the
    construction never takes: the flag comes from a constructor parameter the call leaves at
    its constant default or sets to a constant (`Fusion(..., with_probs=False)`)."""
    if origin.branch is None or (origin.facts or facts) is not owner:
        return False
    child: ast.AST = origin.branch
    current = owner.parents.get(child)
    while current is not None and current is not info.node:
        if isinstance(current, ast.If):
            value = owner._flag_at_construction(current.test, info, constructor)
            if value is not None:
                in_body = any(owner.is_inside(child, stmt) for stmt in current.body)
                if in_body != value:
                    return True
        child, current = current, owner.parents.get(current)
    return False


def _read_detached(facts: Facts, use: ast.Name) -> bool:
    """`use` is read as `use.detach()` or `use.data`: what is computed from it has no graph."""
    parent = facts.parents.get(use)
    if not isinstance(parent, ast.Attribute) or parent.value is not use:
        return False
    if parent.attr == "data":
        return True
    call = facts.parents.get(parent)
    return parent.attr == "detach" and isinstance(call, ast.Call) and call.func is parent


def _selects_elements(index: ast.expr) -> bool:
    """An index that cuts elements out of a tensor, keeping what they are: a mask
    (`[mask == 1]`, `[~pad]`) or slices (`[:, :k]`, `[..., 1:]`); never a plain name or
    constant, which may pick one item of a list, a tuple or a dict."""
    if isinstance(index, (ast.Compare, ast.Slice, ast.BoolOp)):
        return True
    if isinstance(index, ast.UnaryOp) and isinstance(index.op, (ast.Not, ast.Invert)):
        return True
    return isinstance(index, ast.Tuple) and any(
        isinstance(part, ast.Slice) or (isinstance(part, ast.Constant) and part.value is Ellipsis)
        for part in index.elts
    )


def _in_branch(origins: list[Origin], branch: ast.AST) -> list[Origin]:
    """`origins` tagged with the alternative they belong to; a choice made nearer to where
    the value is computed (already tagged) is kept."""
    return [o if o.branch is not None else replace(o, branch=branch) for o in origins]


# Wrappers whose forward runs the module they were built around.
PARALLEL_WRAPPERS = frozenset(
    {
        "torch.nn.DataParallel",
        "torch.nn.parallel.DataParallel",
        "torch.nn.parallel.DistributedDataParallel",
        "torch.nn.parallel.distributed.DistributedDataParallel",
    }
)

# Factories that copy only a tensor's shape, dtype and device: the result has no graph.
FRESH_LIKE = frozenset(
    f"torch.{name}_like" for name in ("rand", "randn", "randint", "zeros", "ones", "full", "empty")
)
