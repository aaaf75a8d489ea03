"""The object model: what a class's attributes and a function's tuple positions hold.

Why: the value-kind questions (`kind_of`, `origins`, the scheduler constructors) follow a
value through local names, but a training script spreads it over objects: `self.criterion`
built in a base class's `fit` in another file, a scheduler returned at position 2 of a
5-tuple and handed on as a parameter, `self.train_step()` defined by a base class. This
module answers those questions once, across files (through the workspace resolver) and
through base classes, so the value queries can consult it when a value is `self.x`,
`obj.x`, a call's tuple element or a parameter.

In: the `Facts` of one file (reached by `facts.get(ObjectModel)`). Out: `Value`s (an
expression together with the facts of the file it is in), the classes and bases of an
object, the definition a method call runs, and the kind of a value computed in its own file.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from torchls.analysis.queries.vocabulary import (
    MAX_DEPTH,
    ClassInfo,
    FunctionNode,
    ObjectKind,
    argument_at,
)
from torchls.records import record

if TYPE_CHECKING:
    from torchls.analysis.facts import Facts

# How many base classes up and how many hops through names a question may go; a class
# hierarchy deeper than this is rare in training code and not worth the time.
MAX_BASES = 6
MAX_HOPS = 6


@record(frozen=True)
class Value:
    """An expression a value may be, with the facts of the file it belongs to."""

    facts: Facts
    expr: ast.expr


@record(frozen=True)
class ClassRef:
    """A project class: its info and the facts of the file that defines it."""

    facts: Facts
    info: ClassInfo


class ObjectModel:
    """The object model of one file's facts (see the module docstring)."""

    def __init__(self, facts: Facts) -> None:
        self.facts = facts
        self._bases: dict[int, list[ClassRef]] = {}
        self._attributes: dict[tuple[str, str], list[Value]] = {}
        # The file of every expression of another file this model has handed out, so a
        # question about such a node (`schedule_design(facts, constructor)`) is answered in
        # that file's terms.
        self._owners: dict[int, Facts] = {}
        self._inherited_sites: dict[int, list[ast.Call]] = {}
        self._subclasses: dict[int, list[ClassRef]] = {}
        # The class of the object a question follows values of, while it follows them
        # from a subclass's method into the base-class method that calls it
        # (`dispatching_as`): `self.m()` there runs what that class finds for `m`.
        self._dispatch: list[ClassRef] = []
        # Function -> its calls in other project files (searched once per function).
        self._elsewhere: dict[int, list[tuple[Facts, ast.Call]]] = {}

    def owner_of(self, node: ast.AST) -> Facts:
        """The facts of the file `node` is in: another file's when this model found it there,
        else these facts."""
        return self._owners.get(id(node), self.facts)

    def note(self, values: list[Value]) -> list[Value]:
        """Remember the files of `values` (for `owner_of`); returns them."""
        for value in values:
            if value.facts is not self.facts:
                self._owners[id(value.expr)] = value.facts
        return values

    # ------------------------------------------------------------------ classes
    def enclosing_class(self, node: ast.AST) -> ClassRef | None:
        """The class of this file whose method `node` is in."""
        klass = self.facts.enclosing_class(node)
        if klass is None:
            return None
        info = self.facts.classes.get(klass.name)
        return ClassRef(self.facts, info) if info is not None else None

    def bases(self, ref: ClassRef) -> list[ClassRef]:
        """The project base classes of `ref`, nearest first (in its file or another)."""
        key = id(ref.info.node)
        if key not in self._bases:
            self._bases[key] = _project_bases(ref)
        return self._bases[key]

    def lineage(self, ref: ClassRef) -> list[ClassRef]:
        """`ref` then its project bases, breadth first, each once (the method lookup order
        for single inheritance, a close one for mixins)."""
        seen: set[int] = set()
        order: list[ClassRef] = []
        queue = [ref]
        while queue and len(order) <= MAX_BASES:
            current = queue.pop(0)
            if id(current.info.node) in seen:
                continue
            seen.add(id(current.info.node))
            order.append(current)
            owner = current.facts.get(ObjectModel) if current.facts is not self.facts else self
            queue.extend(owner.bases(current))
        return order

    # --------------------------------------------------------------- attributes
    def attribute_values(self, expr: ast.Attribute) -> list[Value]:
        """The values assigned to `self.<attr>` in the class `expr` is read in, or, when that
        class assigns none, in its nearest project base class that does (another file
        included)."""
        if not isinstance(expr.value, ast.Name) or expr.value.id != "self":
            return []
        ref = self.enclosing_class(expr)
        if ref is None:
            return []
        return self.class_attribute(ref, expr.attr)

    def class_attribute(self, ref: ClassRef, attr: str) -> list[Value]:
        """What `attr` is assigned on instances of `ref`: its own assignments, else those of
        its nearest project base class that assigns it."""
        key = (ref.info.node.name, attr)
        if key in self._attributes and ref.facts is self.facts:
            return self._attributes[key]
        found: list[Value] = []
        for klass in self.lineage(ref):
            values = klass.info.attributes.get(attr)
            if values:
                found = [Value(klass.facts, value) for value in values]
                break
        if ref.facts is self.facts:
            self._attributes[key] = found
        return self.note(found)

    def inherited_attribute_values(self, expr: ast.Attribute) -> list[Value]:
        """`attribute_values` when the reading class itself assigns nothing to the attribute
        (the base class does), else []: the class's own assignments are the value queries'
        ordinary answer."""
        ref = self.enclosing_class(expr) if _on_self(expr) else None
        if ref is None or expr.attr in ref.info.attributes:
            return []
        return self.class_attribute(ref, expr.attr)

    # ------------------------------------------------------------------ methods
    def method(self, call: ast.Call) -> tuple[Facts, FunctionNode] | None:
        """The definition `self.m(...)` runs: the method of the enclosing class or of its
        nearest project base class that defines it (another file included)."""
        func = call.func
        if not isinstance(func, ast.Attribute) or not _on_self(func):
            return None
        ref = self.enclosing_class(call)
        if ref is None:
            return None
        for klass in self.lineage(ref):
            found = klass.info.methods.get(func.attr)
            if found is not None:
                return klass.facts, found
        return None

    def overrides_in_subclasses(
        self, node: ast.AST, name: str
    ) -> list[tuple[ClassRef, FunctionNode]]:
        """Virtual dispatch on `self`: for a call of `self.<name>` (or `self(...)`, `name`
        `forward`) at `node` in a method `m` of class `K` of this file, the subclasses of `K`
        in this file that inherit `m` from `K` but find `name` defined below `K`, each with
        the definition it runs (each such definition once, for its nearest class). A
        subclass that rebinds anything else `m` reads on `self` (`self.loss = ...`, a method
        `m` calls), or that defines `__init__` while `K` keeps a constructor argument on
        `self`, is left out: `m` would not compute what it does in `K` there."""
        ref = self.enclosing_class(node)
        method = self.facts.scope(node)
        if ref is None or method is ref.info.node or not hasattr(method, "args"):
            return []
        if self._dispatch:
            dispatched = self._dispatched_definition(ref, name)
            if dispatched is not None:
                return dispatched
        caller = method.name  # type: ignore[union-attr]
        if ref.info.methods.get(caller) is not method:
            return []
        read = {
            n.attr
            for n in self.facts.walk_local(method)
            if isinstance(n, ast.Attribute)
            and _on_self(n)
            and n.attr != name
            and not self._only_a_receiver(n)
        }
        keeps_argument = any(
            isinstance(value, ast.Name)
            for attr in read
            for value in ref.info.attributes.get(attr, ())
        )
        found: list[tuple[ClassRef, FunctionNode]] = []
        seen: set[int] = set()
        for candidate in self._subclass_candidates(ref):
            if candidate.info.node is ref.info.node:
                continue
            owner = candidate.facts.get(ObjectModel) if candidate.facts is not self.facts else self
            chain = owner.lineage(candidate)
            below = next((i for i, c in enumerate(chain) if _same_class(c, ref)), None)
            if below is None:
                continue
            between = chain[:below]
            if any(caller in c.info.methods for c in between):
                continue  # `m` itself is overridden: `K`'s `m` never runs there
            if any(
                attr in c.info.methods or attr in c.info.attributes
                for c in between
                for attr in read
            ):
                continue
            if keeps_argument and any("__init__" in c.info.methods for c in between):
                continue
            runs = next((c for c in between if name in c.info.methods), None)
            if runs is None or id(runs.info.methods[name]) in seen:
                continue
            seen.add(id(runs.info.methods[name]))
            found.append((runs, runs.info.methods[name]))
        return found

    def _subclass_candidates(self, ref: ClassRef) -> list[ClassRef]:
        """The classes that may derive from `ref` (a class of this file): this file's, then
        those of the project's other files that derive from it (`subclasses_elsewhere`,
        asked once per class, and only where other files may be read)."""
        key = id(ref.info.node)
        if key in self._subclasses:
            return self._subclasses[key]
        found = [ClassRef(self.facts, info) for info in self.facts.classes.values()]
        workspace = self.facts.workspace
        if workspace is not None and getattr(workspace, "complete", True):
            project = getattr(workspace, "workspace", workspace)
            elsewhere = project.subclasses_elsewhere(self.facts, ref.info.node)  # type: ignore[union-attr]
            for other, name in elsewhere:
                info = other.classes.get(name)
                if info is not None:
                    found.append(ClassRef(other, info))
        self._subclasses[key] = found
        return found

    def _dispatched_definition(
        self, ref: ClassRef, name: str
    ) -> list[tuple[ClassRef, FunctionNode]] | None:
        """Under `dispatching_as(S)` with `S` a subclass of `ref`: the definition of `name`
        `S` finds below `ref` (none when it inherits `ref`'s); None when `S` is no subclass."""
        chain = self.lineage(self._dispatch[-1])
        below = next((i for i, c in enumerate(chain) if _same_class(c, ref)), None)
        if below is None:
            return None
        runs = next((c for c in chain[:below] if name in c.info.methods), None)
        return [(runs, runs.info.methods[name])] if runs is not None else []

    @contextmanager
    def dispatching_as(self, ref: ClassRef) -> Iterator[None]:
        """Follow values as they are on an object of class `ref` (see `_dispatch`)."""
        self._dispatch.append(ref)
        try:
            yield
        finally:
            self._dispatch.pop()

    def parameter_dispatch(self, function: FunctionNode) -> ClassRef | None:
        """The class of the method `function` when base-class methods it inherits call it
        (`inherited_call_sites`): its parameters' arguments there are computed on an object
        of that class."""
        if not self.inherited_call_sites(function):
            return None
        klass = self.facts.parents.get(function)
        info = self.facts.classes.get(klass.name) if isinstance(klass, ast.ClassDef) else None
        return ClassRef(self.facts, info) if info is not None else None

    def dispatched_only(self, origins: list, ref: ClassRef) -> list:
        """Of origins found on an object of class `ref`, those of the paths it runs: an
        origin tagged with a class (a `self.m()` body, see `dispatched_returns`) is kept when
        that class is the nearest to `ref`, in its lineage, among the classes tagged."""
        chain = [c.info.node for c in self.lineage(ref)]
        tagged = {id(o.branch) for o in origins if isinstance(o.branch, ast.ClassDef)}
        if not tagged:
            return origins
        nearest = next((node for node in chain if id(node) in tagged), None)
        return [o for o in origins if not isinstance(o.branch, ast.ClassDef) or o.branch is nearest]

    def inherited_call_sites(self, function: FunctionNode) -> list[ast.Call]:
        """Virtual dispatch seen from the override: for a method `m` of a class `S` of this
        file, the calls `self.m(...)` in the methods `S` inherits from its project base
        classes in this file (`train_step` of the base calling `self.loss_of(...)`, which on
        an `S` object runs `S.loss_of`). A base method `S` (or a class between) overrides
        never runs on `S` and is left out."""
        key = id(function)
        if key not in self._inherited_sites:
            self._inherited_sites[key] = self._inherited_call_sites(function)
        return self._inherited_sites[key]

    def _inherited_call_sites(self, function: FunctionNode) -> list[ast.Call]:
        klass = self.facts.parents.get(function)
        if not isinstance(klass, ast.ClassDef) or not any(
            isinstance(base, ast.Name) and base.id in self.facts.classes for base in klass.bases
        ):
            return []  # no base class of this file: the cheap common case
        info = self.facts.classes.get(klass.name)
        if info is None or info.methods.get(function.name) is not function:
            return []
        chain = self.lineage(ClassRef(self.facts, info))
        found: list[ast.Call] = []
        for index, base in enumerate(chain[1:], start=1):
            if base.facts is not self.facts:
                continue
            defined_between = {name for c in chain[:index] for name in c.info.methods}
            for name, method in base.info.methods.items():
                if name in defined_between:
                    continue
                for call in self.facts.calls_in(method):
                    func = call.func
                    if (
                        isinstance(func, ast.Attribute)
                        and func.attr == function.name
                        and _on_self(func)
                    ):
                        found.append(call)
        return found

    def _only_a_receiver(self, attribute: ast.Attribute) -> bool:
        """`self.opt` in `self.opt.step()`: the object's own method runs, which hands no
        value of it to the loss (a `.forward` call aside: that is the object's output)."""
        parent = self.facts.parents.get(attribute)
        return (
            isinstance(parent, ast.Attribute)
            and parent.value is attribute
            and parent.attr != "forward"
        )

    def object_method(self, call: ast.Call) -> tuple[Facts, FunctionNode] | None:
        """The definition `self.helper.m(...)` or `helper.m(...)` runs when every value the
        receiver may hold is the construction of one project class (`self.helper =
        Helper(...)`, another file included) that defines `m` (or inherits it), a `None`
        placeholder aside (`self.helper = None` before it is built: no method of `None` runs);
        None when a value is anything else (a parameter, a factory's result)."""
        func = call.func
        if not isinstance(func, ast.Attribute) or _on_self(func):
            return None
        values = self.values(func.value)
        if not values:
            return None
        answers: dict[tuple[int, int], tuple[Facts, FunctionNode]] = {}
        for value in values:
            built = value.expr
            if isinstance(built, ast.Constant) and built.value is None:
                continue
            if not isinstance(built, ast.Call):
                return None
            target = value.facts.callee(built)
            if target is None:
                return None
            owner, init, _ = target
            klass = owner.parents.get(init)
            info = owner.classes.get(klass.name) if isinstance(klass, ast.ClassDef) else None
            if info is not None and init.name != "__init__":
                # `Trainer.create_or_resume(...)`: a classmethod that returns an instance.
                info = info if _alternative_constructor(owner, init, info.node) else None
            if info is None:
                return None
            method = owner.get(ObjectModel).class_method(ClassRef(owner, info), func.attr)
            if method is None:
                return None
            answers[(id(method[0]), method[1].lineno)] = method
        return next(iter(answers.values())) if len(answers) == 1 else None

    def annotated_method(self, call: ast.Call) -> tuple[Facts, FunctionNode] | None:
        """The definition `param.m(...)` runs when `param` is a parameter, never rebound,
        annotated with a project class (`handler: CheckpointHandler`, in this file or
        imported) that defines `m` or inherits it. A subclass handed in may override `m`:
        callers use this where the method found is the least the call does."""
        func = call.func
        if not isinstance(func, ast.Attribute) or not isinstance(func.value, ast.Name):
            return None
        facts = self.facts
        if facts.reaching_assignment(func.value) is not None:
            return None
        annotation = facts.parameter_annotation(func.value)
        if not isinstance(annotation, ast.Name):
            return None
        info = facts.classes.get(annotation.id)
        owner: Facts | None = facts if info is not None else None
        if owner is None:
            definition = facts.definition(annotation.id)
            if definition is None or not isinstance(definition.node, ast.ClassDef):
                return None
            owner = definition.facts
            info = owner.classes.get(definition.node.name)
        if info is None:
            return None
        return owner.get(ObjectModel).class_method(ClassRef(owner, info), func.attr)

    def class_method(self, ref: ClassRef, name: str) -> tuple[Facts, FunctionNode] | None:
        """The method `name` that an instance of `ref` runs: its own or its nearest project
        base class's (another file included)."""
        for klass in self.lineage(ref):
            if name in klass.info.methods:
                return klass.facts, klass.info.methods[name]
        return None

    # ------------------------------------------------------------ tuple returns
    def returned_element(self, call: ast.Call, index: int) -> list[Value] | None:
        """What position `index` of the tuple a project function (or a `self` method)
        returns holds, from every `return` of it; None when a return is not a tuple that
        long (or the callee is not known)."""
        returns = self._returns_of(call)
        if not returns:
            return None
        found: list[Value] = []
        for owner, returned in returns:
            if not isinstance(returned, ast.Tuple) or index >= len(returned.elts):
                return None
            if any(isinstance(element, ast.Starred) for element in returned.elts[: index + 1]):
                return None
            found.append(Value(owner, returned.elts[index]))
        return self.note(found)

    def dispatched_returns(
        self, call: ast.Call
    ) -> list[tuple[Facts, ast.expr, ast.ClassDef | None]] | None:
        """What `self.m(...)` (`self(...)`, `self.forward(...)`: `forward`) may return, with
        the class each return belongs to when subclasses of this file override `m` (virtual
        dispatch: the base's own definition is the base class's path, each override its
        subclass's path); the class is None when no subclass overrides `m`. None when the
        call is no `self` method call or its definition is not known."""
        func = call.func
        if isinstance(func, ast.Name) and func.id == "self":
            name = "forward"
        elif isinstance(func, ast.Attribute) and _on_self(func):
            name = func.attr
        else:
            return None
        ref = self.enclosing_class(call)
        if ref is None:
            return None
        own = next(
            ((c.facts, c.info.methods[name]) for c in self.lineage(ref) if name in c.info.methods),
            None,
        )
        if own is None:
            return None
        overrides = self.overrides_in_subclasses(call, name)
        bodies = [(own[0], own[1], ref.info.node if overrides else None)]
        bodies.extend((o.facts, function, o.info.node) for o, function in overrides)
        found = [
            (facts, node.value, klass)
            for facts, function, klass in bodies
            for node in facts.walk_local(function)
            if isinstance(node, ast.Return) and node.value is not None
        ]
        for facts, expr, _ in found:
            if facts is not self.facts:
                self._owners[id(expr)] = facts
        return found or None

    def _returns_of(self, call: ast.Call) -> list[tuple[Facts, ast.expr]] | None:
        plain = self.facts.function_returns(call)
        if plain is not None:
            return plain
        resolved = self.method(call)
        if resolved is None:
            return None
        owner, function = resolved
        returns = [
            (owner, node.value)
            for node in owner.walk_local(function)
            if isinstance(node, ast.Return) and node.value is not None
        ]
        return returns or None

    # ------------------------------------------------------------------ values
    def values(self, expr: ast.expr, hops: int = 0) -> list[Value] | None:
        """The expressions `expr` may hold, one step back: a name's bindings (an unpacked
        tuple element of a call is that call's returned element), a parameter's arguments at
        its in-file call sites, a `self` attribute's assignments (through base classes).
        None when a binding cannot be told (a loop target, an unknown callee)."""
        facts = self.facts
        if hops > MAX_HOPS:
            return None
        if isinstance(expr, ast.Name):
            if facts.parameter_of(expr) is not None:
                arguments = facts.parameter_arguments(expr)
                if arguments:
                    return [Value(facts, a) for a in arguments]
                return self._arguments_elsewhere(expr)
            scope = facts.scope(expr)
            assignments = facts.assignments_of(expr.id, scope)
            if not assignments and scope is not facts.tree:
                assignments = facts.assignments_of(expr.id, facts.tree)
            if not assignments:
                return None
            found: list[Value] = []
            for assignment in assignments:
                if assignment.value is None or assignment.loop is not None:
                    return None
                if assignment.index is None:
                    found.append(Value(facts, assignment.value))
                    continue
                if not isinstance(assignment.value, ast.Call):
                    return None
                element = self.returned_element(assignment.value, assignment.index)
                if element is None:
                    return None
                found.extend(element)
            return found
        if isinstance(expr, ast.Attribute):
            own = facts.self_attribute_values(expr)
            if own:
                return [Value(facts, value) for value in own]
            inherited = self.attribute_values(expr)
            return inherited or None
        return [Value(facts, expr)]

    def calls_elsewhere(self, function: FunctionNode) -> list[tuple[Facts, ast.Call]]:
        """`Facts.calls_from_other_files`, searched once per function."""
        if id(function) not in self._elsewhere:
            self._elsewhere[id(function)] = self.facts.calls_from_other_files(function)
        return self._elsewhere[id(function)]

    def _arguments_elsewhere(self, param: ast.Name) -> list[Value] | None:
        """What the calls in the project's other files pass for the parameter `param` of a
        function no call in this file runs (`train(model, loader, optimizer, scheduler)` in
        `engine.py`, called by `main.py` with what its set-up helper returned); None when a
        call leaves it out or passes it in a way that cannot be told, or there is none."""
        facts = self.facts
        function = facts.parameter_of(param)
        if function is None or facts.call_sites(function):
            return None
        found = self.calls_elsewhere(function)
        if not found:
            return None
        method = facts.enclosing_class(function) is not None
        values: list[Value] = []
        for other, call in found:
            told, argument = argument_at(
                call, function, param.id, method and isinstance(call.func, ast.Attribute)
            )
            if not told or argument is None:
                return None
            values.append(Value(other, argument))
        return self.note(values)

    def kind_of(self, expr: ast.expr) -> ObjectKind | None:
        """The kind of `self.<attr>` assigned only in a base class (in its own file's terms),
        or of a name unpacked from a project function's returned tuple; None otherwise."""
        found: list[Value] | None = None
        if isinstance(expr, ast.Attribute):
            found = self.inherited_attribute_values(expr)
        elif isinstance(expr, ast.Name):
            assignment = self.facts.reaching_assignment(expr)
            if (
                assignment is not None
                and assignment.index is not None
                and assignment.loop is None
                and isinstance(assignment.value, ast.Call)
            ):
                found = self.returned_element(assignment.value, assignment.index)
        if not found:
            return None
        kinds = {_kind_in_own_file(value) for value in found}
        if len(kinds) != 1:
            return None
        kind = kinds.pop()
        return kind


def _alternative_constructor(
    facts: Facts, function: FunctionNode, klass: ast.ClassDef, depth: int = 0
) -> bool:
    """`function` is a `@classmethod` of `klass` each of whose returns builds the class
    (`cls(...)`, `Klass(...)`, another such classmethod: `cls.load(path)`), directly or
    through a local bound only to such calls."""
    if depth > 2 or not any(
        isinstance(d, ast.Name) and d.id == "classmethod" for d in function.decorator_list
    ):
        return False
    first = function.args.args[0].arg if function.args.args else None

    def builds(expr: ast.expr | None) -> bool:
        if not isinstance(expr, ast.Call):
            return False
        func = expr.func
        if isinstance(func, ast.Name):
            return func.id in (first, klass.name)
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            if func.value.id not in (first, klass.name) or func.attr == function.name:
                return False
            method = next(
                (
                    node
                    for node in klass.body
                    if isinstance(node, ast.FunctionDef) and node.name == func.attr
                ),
                None,
            )
            return method is not None and _alternative_constructor(facts, method, klass, depth + 1)
        return False

    returns = [node.value for node in facts.walk_local(function) if isinstance(node, ast.Return)]
    if not returns:
        return False
    for returned in returns:
        if isinstance(returned, ast.Name):
            bindings = facts.assignments_of(returned.id, function)
            if not bindings or not all(
                b.index is None and b.loop is None and builds(b.value) for b in bindings
            ):
                return False
        elif not builds(returned):
            return False
    return True


def _kind_in_own_file(value: Value) -> ObjectKind | None:
    if isinstance(value.expr, ast.Constant) and value.expr.value is None:
        return None
    kind = value.facts.kind_of(value.expr)
    # A kind guessed from a variable's name alone is not evidence across an object boundary.
    if kind is None or kind.node is None:
        return None
    return kind


def _same_class(one: ClassRef, other: ClassRef) -> bool:
    """The same class, also when one of them was reached through another file's facts."""
    if one.info.node is other.info.node:
        return True
    return (
        one.info.node.name == other.info.node.name
        and one.info.node.lineno == other.info.node.lineno
        and (
            one.facts.filename == other.facts.filename
            or Path(one.facts.filename).resolve() == Path(other.facts.filename).resolve()
        )
    )


def _on_self(expr: ast.Attribute) -> bool:
    return isinstance(expr.value, ast.Name) and expr.value.id == "self"


def _project_bases(ref: ClassRef, depth: int = 0) -> list[ClassRef]:
    facts = ref.facts
    found: list[ClassRef] = []
    if depth > MAX_DEPTH:
        return found
    for base in ref.info.node.bases:
        if isinstance(base, ast.Name):
            local = facts.classes.get(base.id)
            if local is not None and local.node is not ref.info.node:
                found.append(ClassRef(facts, local))
                continue
            definition = facts.definition(base.id)
            if definition is not None and isinstance(definition.node, ast.ClassDef):
                other = definition.facts.classes.get(definition.node.name)
                if other is not None:
                    found.append(ClassRef(definition.facts, other))
        elif (
            isinstance(base, ast.Attribute)
            and isinstance(base.value, ast.Name)
            and facts.workspace is not None
            and base.value.id in facts.imports
        ):
            module = facts.workspace.module_facts(facts, base.value.id)
            if module is not None and base.attr in module.classes:
                found.append(ClassRef(module, module.classes[base.attr]))
                continue
        if isinstance(base, ast.Attribute):
            dotted = _dotted_base(facts, base)
            if dotted is not None:
                found.append(dotted)
    return found


def _dotted_base(facts: Facts, base: ast.Attribute) -> ClassRef | None:
    """`pkg.sub.Base` after `import pkg`: the class `Base` of the project module `pkg.sub`,
    defined there or imported into it (a package's `__init__` re-exporting it)."""
    parts: list[str] = []
    current: ast.expr = base.value
    while isinstance(current, ast.Attribute):
        parts.insert(0, current.attr)
        current = current.value
    if not isinstance(current, ast.Name) or facts.workspace is None:
        return None
    imported = facts.imports.get(current.id)
    if imported is None:
        return None
    module = facts.workspace.module_facts(facts, current.id, ".".join([imported, *parts]))
    if module is None:
        return None
    if base.attr in module.classes:
        return ClassRef(module, module.classes[base.attr])
    definition = module.definition(base.attr)
    if definition is None or not isinstance(definition.node, ast.ClassDef):
        return None
    other = definition.facts.classes.get(definition.node.name)
    return ClassRef(definition.facts, other) if other is not None else None
