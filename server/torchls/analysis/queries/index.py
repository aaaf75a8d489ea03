"""The syntax index of one file: parents, scopes, bindings, calls and loops, and the
queries that read it.

Why: every other question (kinds, origins, flow, summaries) starts from "what encloses this
node", "which assignment reaches this name", "which calls are in this body"; the index is
built by one walk (`_collect`) so those are look-ups.

In: the `Facts` state set up by its constructor (tree, parents, scope tables). Out: the
`IndexQueries` mixin of `Facts`: `scope`, `enclosing_loops`, `walk_local`, `calls_in`,
`qualname`, `reaching_assignment`, `assignments_of`, ...
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cached_property
from typing import TYPE_CHECKING

from torchls.analysis.queries.state import FileState
from torchls.analysis.queries.vocabulary import (
    _PLAIN_TYPES,
    Assignment,
    ClassInfo,
    FunctionNode,
    ScopeNode,
    _child_statements,
)

# Fields that never hold a node (names, flags, the load/store context): skipped by the walk
# without a look. Anything not listed is looked at, so a new Python field is never missed.
_LEAF_FIELDS = frozenset(
    {"ctx", "id", "attr", "name", "asname", "arg", "module", "level", "conversion"}
    | {"is_async", "type_comment", "kind", "rest", "kwd_attrs"}
)
_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}
# What `_collect` builds from the tree alone (`imports` aside, see `_keep_index`).
_SHARED_TABLES = (
    "parents",
    "import_positions",
    "star_modules",
    "functions",
    "classes",
    "calls",
    "loops",
    "assignments",
    "scope_of_node",
    "scope_nodes",
    "calls_by_statement",
    "calls_by_scope",
    "local_functions",
)
# Node types with nothing below them that `_note` has nothing to record for: the operator
# singletons (`+`, `<`, `not`, `and`; one shared node per operator in a parse). The walk
# notes their parent and scope like any child and goes no further.
_LEAF_TYPES = frozenset(
    {ast.Name, ast.Constant}
    | {
        t
        for base in (ast.operator, ast.cmpop, ast.unaryop, ast.boolop)
        for t in base.__subclasses__()
    }
)
# The node types `_note` records something for (every other type it would only look at).
_NOTED_TYPES = frozenset(
    {ast.Call, ast.For, ast.AsyncFor, ast.While, ast.Import, ast.ImportFrom, ast.Assign}
    | {ast.AnnAssign, ast.AugAssign, ast.withitem, ast.NamedExpr}
)
# Where a walk up from a statement stops looking for the `if` around it.
_SCOPE_STOPS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.Module)


def _fields_with_nodes(node_type: type) -> tuple[str, ...]:
    if node_type in (ast.Constant, ast.Global, ast.Nonlocal):
        return ()  # a value, or a list of plain names (an import's `names` are nodes)
    if node_type is getattr(ast, "TypeAlias", None):
        return node_type._fields  # Python 3.12's `type X = ...`: its `name` is a Name node
    return tuple(f for f in node_type._fields if f not in _LEAF_FIELDS)


class IndexQueries(FileState):
    """Mixin of `Facts` (see the module docstring); reads the state `Facts.__init__` sets.
    The first phase: the other query mixins derive from it, so what they read of the index is
    typed; it asks one later question itself, declared below for the type checker."""

    if TYPE_CHECKING:

        def call_sites(self, function: FunctionNode) -> list[ast.Call]: ...  # flow.py

    def _collect(self) -> None:
        # One iterative walk (deep nesting must not hit the recursion limit) that records
        # parents, scopes, bindings, calls and loops, and the statement each call belongs to.
        # It is the hottest loop of the analysis, hence the inlined child iteration.
        parents = self.parents
        scope_nodes = self.scope_nodes
        calls_by_statement = self.calls_by_statement
        calls_by_scope = self.calls_by_scope
        stmt_type, ast_type = ast.stmt, ast.AST
        leaf_types, noted_types = _LEAF_TYPES, _NOTED_TYPES
        Entry = tuple[ast.AST, ScopeNode, "ast.ClassDef | None", "ast.stmt | None"]
        stack: list[Entry] = [(self.tree, self.tree, None, None)]
        self.assignments[self.tree] = {}
        scope_nodes[self.tree] = []
        child_fields = _CHILD_FIELDS
        while stack:
            node, scope, klass, statement = stack.pop()
            in_scope = scope_nodes[scope]
            node_type = type(node)
            fields = child_fields.get(node_type)
            if fields is None:
                fields = child_fields[node_type] = _fields_with_nodes(node_type)
            for field_name in fields:
                value = getattr(node, field_name, None)
                if isinstance(value, list):
                    children = value
                elif isinstance(value, ast_type):
                    children = (value,)
                else:
                    continue
                for child in children:
                    if not isinstance(child, ast_type):
                        continue
                    parents[child] = node
                    in_scope.append(child)
                    child_type = type(child)
                    if child_type in leaf_types:
                        continue  # leaves: nothing below them to walk (a third of all nodes)
                    if child_type in _PLAIN_TYPES:
                        if child_type is ast.Call:
                            self.calls.append(child)
                            calls_by_scope.setdefault(scope, []).append(child)
                            if statement is not None:
                                calls_by_statement.setdefault(statement, []).append(child)
                        stack.append((child, scope, klass, statement))
                        continue
                    child_scope, child_class = scope, klass
                    child_statement = child if isinstance(child, stmt_type) else statement
                    if child_type is ast.FunctionDef or child_type is ast.AsyncFunctionDef:
                        self.scope_of_node[child] = scope
                        self.local_functions.setdefault(scope, {}).setdefault(child.name, child)
                        self._register_function(child, klass)
                        self.assignments[child] = {}
                        scope_nodes[child] = []
                        self._bind_parameters(child)
                        child_scope, child_class = child, None
                    elif child_type is ast.Lambda:
                        self.assignments[child] = {}
                        scope_nodes[child] = []
                        child_scope = child
                    elif child_type is ast.ClassDef:
                        self._register_class(child)
                        child_class = child
                    elif child_type in noted_types:
                        self._note(child, scope, klass)
                    stack.append((child, child_scope, child_class, child_statement))

    def _keep_index(self) -> None:
        """Leave the tables `_collect` built on the parse, for other facts over the same
        parse (a project check: the file's own facts and those of the files importing it).
        They are read-only from here on; only `imports` is extended afterwards (star
        imports, which depend on the workspace), so the kept copy is taken before that."""
        self.source.index = (
            {name: getattr(self, name) for name in _SHARED_TABLES},
            dict(self.imports),
        )

    def _reuse_index(self) -> bool:
        """Take the tables another facts over this parse built (see `_keep_index`)."""
        kept = self.source.index
        if kept is None:
            return False
        tables, imports = kept  # type: ignore[misc]
        for name, table in tables.items():
            setattr(self, name, table)
        self.imports = dict(imports)
        return True

    def _register_function(self, node: FunctionNode, klass: ast.ClassDef | None) -> None:
        if klass is not None:
            info = self.classes.get(klass.name)
            if info is not None:
                info.methods[node.name] = node
        else:
            self.functions.setdefault(node.name, node)

    def _register_class(self, node: ast.ClassDef) -> None:
        bases = [self.qualname(base) or self.source.segment(base) for base in node.bases]
        self.classes[node.name] = ClassInfo(node, bases)

    def _bind_parameters(self, node: FunctionNode) -> None:
        table = self.assignments[node]
        args = node.args
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            table.setdefault(arg.arg, []).append(Assignment(node, None))

    def _note(self, node: ast.AST, scope: ScopeNode, klass: ast.ClassDef | None) -> None:
        if isinstance(node, ast.Call):
            self.calls.append(node)
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            self.loops.append(node)
            if isinstance(node, (ast.For, ast.AsyncFor)):
                self._bind_target(node.target, node, None, scope, loop=node)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            self._note_import(node)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                self._bind_target(target, node, node.value, scope)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
            if isinstance(node, ast.AnnAssign):
                self._bind_target(node.target, node, node.value, scope)
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            stmt = self.parents.get(node)
            if isinstance(stmt, ast.stmt):
                self._bind_target(node.optional_vars, stmt, node.context_expr, scope)
        elif isinstance(node, ast.NamedExpr):
            stmt = self.enclosing_statement(node)
            if stmt is not None:
                self._bind_target(node.target, stmt, node.value, scope)

    def _bind_target(
        self,
        target: ast.expr,
        stmt: ast.stmt,
        value: ast.expr | None,
        scope: ScopeNode,
        index: int | None = None,
        loop: ast.For | ast.AsyncFor | None = None,
    ) -> None:
        if isinstance(target, ast.Name):
            self.assignments.setdefault(scope, {}).setdefault(target.id, []).append(
                Assignment(stmt, value, index, loop)
            )
        elif isinstance(target, (ast.Tuple, ast.List)):
            for position, element in enumerate(target.elts):
                element_value = value
                element_index: int | None = position
                if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
                    element_value, element_index = value.elts[position], None
                self._bind_target(element, stmt, element_value, scope, element_index, loop)
        elif isinstance(target, ast.Starred):
            self._bind_target(target.value, stmt, None, scope, None, loop)
        elif (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id == "self"
            and value is not None
        ):
            klass = self.enclosing_class(stmt)
            if klass is not None and klass.name in self.classes:
                self.classes[klass.name].attributes.setdefault(target.attr, []).append(value)

    def _note_import(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    self.imports[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    self.imports[top] = top
        else:
            # Relative imports keep their dots: never a torch name, but resolvable by jedi.
            module = "." * node.level + (node.module or "")
            if any(alias.name == "*" for alias in node.names) and node.module:
                self.star_modules.append(module)
            for alias in node.names:
                local = alias.asname or alias.name
                self.imports[local] = (
                    f"{module}.{alias.name}" if node.module else f"{module}{alias.name}"
                )
                if getattr(alias, "lineno", None) is not None:
                    column = self.source.column(alias.lineno, alias.col_offset)
                    self.import_positions[local] = (alias.lineno, column)

    def adopt_star_imports(self) -> None:
        """`from utils import *` of a project module binds, among the rest, the libraries that
        module imports (`torch`, once `utils` did `import torch`): copy its absolute imports
        into this file's table for every public name it exports that this file does not bind
        itself, so `torch.no_grad()` resolves here too, and its top-level classes and functions
        as names imported from it. Needs a workspace to find the module."""
        workspace = getattr(self, "workspace", None)
        self.stars_read = not self.star_modules
        if workspace is None or not self.star_modules:
            return
        bound = set(self.imports) | set(self.assignments.get(self.tree, {}))
        bound |= set(self.functions) | set(self.classes)
        self.stars_read = True
        for module in self.star_modules:
            other = workspace.module_facts(self, "*", dotted=module)
            if other is None:
                self.stars_read = False
                continue
            exported = other.exported_names()
            for name, target in other.imports.items():
                if name in bound or name.startswith("_") or target.startswith("."):
                    continue
                if exported is not None and name not in exported:
                    continue
                self.imports[name] = target
                if "*" in self.import_positions and target.rsplit(".", 1)[0] in other.star_modules:
                    # A name the module took from a further project module by its own star
                    # import (`mtn` doing `from utils import *`): resolvable from here too.
                    self.import_positions[name] = self.import_positions["*"]
                bound.add(name)
            # ... and the classes and functions it defines at its top level, as if imported
            # by name, so `Net(...)` and `make_loss()` resolve to their definitions there.
            top = set(other.tree.body)
            defined = [info.node for info in other.classes.values()]
            defined += list(other.functions.values())
            for node in defined:
                name = node.name
                if node not in top or name in bound or name.startswith("_"):
                    continue
                if exported is not None and name not in exported:
                    continue
                self.imports[name] = f"{module}.{name}"
                if "*" in self.import_positions:
                    self.import_positions[name] = self.import_positions["*"]
                bound.add(name)

    def adopt_free_torch(self) -> None:
        """A file that reads the global `torch` without binding it (a star import from a
        module out of reach, code pasted from a notebook, a file exec'd into a namespace that
        has torch) runs with the torch module there: `with torch.no_grad():` in it disables
        gradients like anywhere else. Read it as `import torch` (not when every star import
        was read and none exports torch: then the name is really unbound)."""
        if self.stars_read and self.star_modules:
            return
        if "torch" in self.imports or "torch" in self.functions or "torch" in self.classes:
            return
        if "torch" in self.assignments.get(self.tree, {}):
            return
        for nodes in self.scope_nodes.values():
            for node in nodes:
                if isinstance(node, ast.Name) and node.id == "torch":
                    if isinstance(node.ctx, ast.Load):
                        if not self.binds_locally(node):
                            self.imports["torch"] = "torch"
                            return

    def binds_locally(self, name: ast.Name) -> bool:
        """A function of `name`'s enclosing scopes binds it (a parameter or local)."""
        scope = self.scope(name)
        while isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = scope.args
            every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
            if any(a is not None and a.arg == name.id for a in every):
                return True
            if name.id in self.assignments.get(scope, {}):
                return True
            scope = self.scope(scope)
        return False

    def exported_names(self) -> set[str] | None:
        """The names a module-level `__all__ = [...]` lists, or None without one."""
        for statement in self.tree.body:
            if (
                isinstance(statement, ast.Assign)
                and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)
                and statement.targets[0].id == "__all__"
                and isinstance(statement.value, (ast.List, ast.Tuple))
            ):
                return {
                    e.value
                    for e in statement.value.elts
                    if isinstance(e, ast.Constant) and isinstance(e.value, str)
                }
        return None

    def enclosing_statement(self, node: ast.AST) -> ast.stmt | None:
        current: ast.AST | None = node
        while current is not None and not isinstance(current, ast.stmt):
            current = self.parents.get(current)
        return current

    def enclosing_class(self, node: ast.AST) -> ast.ClassDef | None:
        current = self.parents.get(node)
        while current is not None:
            if isinstance(current, ast.ClassDef):
                return current
            current = self.parents.get(current)
        return None

    def enclosing_function(self, node: ast.AST) -> FunctionNode | None:
        current = self.parents.get(node)
        while current is not None:
            if isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return current
            current = self.parents.get(current)
        return None

    def scope(self, node: ast.AST) -> ScopeNode:
        # Asked tens of thousands of times per file, mostly for the same few nodes.
        found = self._scopes.get(node)
        if found is None:
            found = self.tree
            current = self.parents.get(node)
            while current is not None:
                if isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    found = current
                    break
                current = self.parents.get(current)
            self._scopes[node] = found
        return found

    def enclosing_loops(self, node: ast.AST) -> list[ast.For | ast.AsyncFor | ast.While]:
        """Loops around `node` inside its own function, innermost first. Memoised (rules and
        the mode analysis ask it about the same calls again and again): callers only read
        the list, never change it."""
        try:
            return self._enclosing_loops[node]
        except KeyError:
            pass
        loops = []
        current = self.parents.get(node)
        while current is not None and not isinstance(
            current, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
        ):
            if isinstance(current, (ast.For, ast.AsyncFor, ast.While)):
                loops.append(current)
            current = self.parents.get(current)
        self._enclosing_loops[node] = loops
        return loops

    def is_inside(self, node: ast.AST, ancestor: ast.AST) -> bool:
        current: ast.AST | None = node
        while current is not None:
            if current is ancestor:
                return True
            current = self.parents.get(current)
        return False

    def walk_local(self, node: ast.AST) -> Iterator[ast.AST]:
        """Nodes under `node` without descending into nested functions, lambdas or classes."""
        if node in self.scope_nodes:
            yield from self.scope_nodes[node]
            return
        todo = list(ast.iter_child_nodes(node))
        while todo:
            child = todo.pop()
            yield child
            if not isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
            ):
                todo.extend(ast.iter_child_nodes(child))

    def calls_in(self, node: ast.AST) -> list[ast.Call]:
        """Calls under `node` (not in nested functions), in source order; memoised because
        several rules and the mode analysis ask about the same loops and statements."""
        cached = self._calls_in.get(node)
        if cached is None:
            if node in self.scope_nodes:
                cached = list(self.calls_by_scope.get(node, ()))
            elif isinstance(node, ast.stmt):
                # Calls were indexed by their nearest statement during the single walk, so a
                # compound statement is its own (header) calls plus its children's.
                cached = list(self.calls_by_statement.get(node, ()))
                for child in _child_statements(node):
                    cached.extend(self.calls_in(child))
            else:
                cached = [n for n in self.walk_local(node) if isinstance(n, ast.Call)]
            cached.sort(key=lambda c: (c.lineno, c.col_offset))
            self._calls_in[node] = cached
        return cached

    def qualname(self, expr: ast.AST | None) -> str | None:
        """Fully qualified dotted name of `expr` through the file's imports
        (`F.softmax` → `torch.nn.functional.softmax`), or None."""
        parts: list[str] = []
        while isinstance(expr, ast.Attribute):
            parts.append(expr.attr)
            expr = expr.value
        if not isinstance(expr, ast.Name):
            return None
        base = self.imports.get(expr.id)
        if base is None:
            return None
        return ".".join([base, *reversed(parts)])

    def call_qualname(self, call: ast.Call) -> str | None:
        try:
            return self._call_qualnames[call]
        except KeyError:
            found = self._call_qualnames[call] = self.qualname(call.func)
            return found

    @cached_property
    def _calls_by_qualname(self) -> dict[str, list[ast.Call]]:
        index: dict[str, list[ast.Call]] = {}
        for call in self.calls:
            qualname = self.call_qualname(call)
            if qualname is not None:
                index.setdefault(qualname, []).append(call)
        return index

    @cached_property
    def _calls_by_method(self) -> dict[str, list[ast.Call]]:
        index: dict[str, list[ast.Call]] = {}
        for call in self.calls:
            if isinstance(call.func, ast.Attribute):
                index.setdefault(call.func.attr, []).append(call)
        return index

    def method_calls(self, *methods: str) -> list[ast.Call]:
        """Calls of `x.<method>(...)` for any receiver (`"backward"`, `"step"`), in file order."""
        found = [c for m in methods for c in self._calls_by_method.get(m, ())]
        found.sort(key=lambda c: (c.lineno, c.col_offset))
        return found

    def calls_to(self, *qualnames: str) -> list[ast.Call]:
        """Calls of the given fully qualified functions (`"torch.load"`), in file order."""
        found = [c for q in qualnames for c in self._calls_by_qualname.get(q, ())]
        return (
            sorted(found, key=lambda c: (c.lineno, c.col_offset)) if len(qualnames) > 1 else found
        )

    def short_name(self, call: ast.Call) -> str:
        """Last component of what is called: `Adam` for `torch.optim.Adam(...)`."""
        func = call.func
        if isinstance(func, ast.Attribute):
            return func.attr
        if isinstance(func, ast.Name):
            qualname = self.imports.get(func.id)
            return qualname.rsplit(".", 1)[-1] if qualname else func.id
        return ""

    @staticmethod
    def method_name(call: ast.Call) -> str | None:
        return call.func.attr if isinstance(call.func, ast.Attribute) else None

    @staticmethod
    def receiver(call: ast.Call) -> ast.expr | None:
        return call.func.value if isinstance(call.func, ast.Attribute) else None

    def key(self, expr: ast.AST | None) -> str | None:
        """A stable text key for a simple receiver: `model`, `self.model`, `self.net.encoder`."""
        if type(expr) is ast.Name:
            return expr.id  # most keys asked for: no list, no join
        parts: list[str] = []
        while isinstance(expr, ast.Attribute):
            parts.append(expr.attr)
            expr = expr.value
        if isinstance(expr, ast.Name):
            return ".".join([expr.id, *reversed(parts)])
        return None

    @cached_property
    def torch_alias(self) -> str | None:
        """The local name under which `torch` itself is imported, if any."""
        for alias, target in self.imports.items():
            if target == "torch":
                return alias
        return None

    def reaching_assignment(self, name: ast.Name) -> Assignment | None:
        """The assignment of `name` that most plausibly reaches this use: the last one before
        it in the same scope; for a name never bound locally, the module-level one."""
        try:
            return self._reaching[name]
        except KeyError:
            found = self._reaching[name] = self._reaching_assignment(name)
            return found

    def _reaching_assignment(self, name: ast.Name) -> Assignment | None:
        scope = self.scope(name)
        use_position = (name.lineno, name.col_offset)
        for table_scope in (scope, self.tree) if scope is not self.tree else (scope,):
            candidates = self.assignments.get(table_scope, {}).get(name.id)
            if not candidates:
                continue
            before = [
                a
                for a in candidates
                if (
                    (a.stmt.lineno, a.stmt.col_offset) < use_position
                    and (
                        not self._within(name, use_position, a.stmt)
                        or self._in_with_body(name, a.stmt)
                    )
                    and not self._other_arm(a.stmt, name)
                )
                or (a.loop is not None and self.is_inside(name, a.loop))
            ]
            if table_scope is not scope:
                before = candidates  # a global read from a function sees the final binding
            if before:
                return max(before, key=lambda a: (a.stmt.lineno, a.stmt.col_offset))
            return None
        return None

    def _in_with_body(self, use: ast.AST, stmt: ast.stmt) -> bool:
        """`stmt` is a `with ... as name:` and `use` reads the name in its body, where that
        binding holds (`with amp.scale_loss(loss, opt) as scaled: scaled.backward()`)."""
        return isinstance(stmt, (ast.With, ast.AsyncWith)) and any(
            self.is_inside(use, item) for item in stmt.body
        )

    def _other_arm(self, stmt: ast.stmt, use: ast.AST) -> bool:
        """`stmt` and `use` sit in the two arms of one `if` that no loop repeats (inside their
        function): `x = y.float()` under `if training:` never reaches a read in its `else`."""
        child, current = stmt, self.parents.get(stmt)
        while current is not None and not isinstance(current, _SCOPE_STOPS):
            if isinstance(current, (ast.For, ast.AsyncFor, ast.While)):
                return False  # the other arm may run on a later iteration
            if isinstance(current, ast.If):
                in_body = any(child is item for item in current.body)
                if self.is_inside(use, current):
                    if any(self.is_inside(use, item) for item in current.body) == in_body:
                        return False  # the same arm (or the test): the usual order applies
                    return not self._repeated(current)
            child, current = current, self.parents.get(current)
        return False

    def _repeated(self, node: ast.AST) -> bool:
        current = self.parents.get(node)
        while current is not None and not isinstance(current, _SCOPE_STOPS):
            if isinstance(current, (ast.For, ast.AsyncFor, ast.While)):
                return True
            current = self.parents.get(current)
        return False

    def _within(self, node: ast.AST, position: tuple[int, int], stmt: ast.stmt) -> bool:
        """`is_inside(node, stmt)` for a node at `position`: a node past the end of the
        statement's text cannot be inside it, which answers most questions without a walk."""
        end = getattr(stmt, "end_lineno", None)
        if end is not None and position > (end, stmt.end_col_offset or 0):
            return False
        return self.is_inside(node, stmt)

    def binding_alternatives(self, name: ast.Name) -> list[Assignment] | None:
        """The bindings of `name` that reach this read on different paths, when an `if`
        chooses between them (`model = A()` in one branch, `model = B()` in the other): two
        or more, or None. A function reading a module-level name sees what is bound where the
        module calls the function (not a rebinding after the last call). Loops are taken to
        run and `try` bodies to complete: only `if`/`match` choices make alternatives."""
        cache = self.__dict__.setdefault("_alternatives_cache", {})
        if name in cache:
            return cache[name]
        found = cache[name] = self._binding_alternatives(name)
        return found

    def _binding_alternatives(self, name: ast.Name) -> list[Assignment] | None:
        scope = self.scope(name)
        local = self.assignments.get(scope, {}).get(name.id)
        if local:
            if len(local) > 1 and not isinstance(scope, ast.Lambda):
                state = _reaching_at(self, scope.body, name.id, name, frozenset())
                if state is not None and len(state) > 1:
                    return _in_order(local, state)
            return None
        if scope is self.tree or len(self.assignments.get(self.tree, {}).get(name.id, ())) < 2:
            return None  # one module-level binding: no choice to follow
        sites = self.call_sites(scope)
        if not sites or any(self.scope(site) is not self.tree for site in sites):
            return None
        found: set[int] = set()
        for site in sites:
            state = _reaching_at(self, self.tree.body, name.id, site, frozenset())
            if not state:
                return None
            found |= state
        if len(found) < 2:
            return None
        return _in_order(self.assignments[self.tree][name.id], found)

    def uses_of(self, stmt: ast.stmt, name: str) -> list[ast.Name]:
        """The reads of `name` that the binding made by `stmt` reaches, in its own scope."""
        scope = self.scope(stmt)
        uses = []
        for node in self.scope_nodes.get(scope, ()):
            if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load):
                assignment = self.reaching_assignment(node)
                if assignment is not None and assignment.stmt is stmt:
                    uses.append(node)
        return sorted(uses, key=lambda n: (n.lineno, n.col_offset))

    @cached_property
    def bound_names(self) -> frozenset[str]:
        """Every name the file binds anywhere (assignments, parameters, loop targets, imports,
        definitions); a name outside it is a builtin or undefined."""
        names = set(self.imports)
        for table in self.assignments.values():
            names.update(table)
        for local in self.local_functions.values():
            names.update(local)
        names.update(self.classes)
        return frozenset(names)

    def block_of(self, stmt: ast.stmt) -> list[ast.stmt] | None:
        """The statement list (`body`, `orelse` or `finalbody`) that directly holds `stmt`."""
        parent = self.parents.get(stmt)
        for name in ("body", "orelse", "finalbody"):
            block = getattr(parent, name, None)
            if isinstance(block, list) and any(item is stmt for item in block):
                return block
        return None

    def assignments_of(self, name: str, scope: ScopeNode) -> list[Assignment]:
        return self.assignments.get(scope, {}).get(name, [])

    @cached_property
    def _calls_by_name(self) -> dict[str, list[ast.Call]]:
        index: dict[str, list[ast.Call]] = {}
        for call in self.calls:
            if isinstance(call.func, ast.Name):
                index.setdefault(call.func.id, []).append(call)
        return index


State = frozenset  # ids of the Assignments of one name that may hold at a point


def _in_order(table: list[Assignment], state: State) -> list[Assignment]:
    chosen = [a for a in table if id(a) in state]
    return sorted(chosen, key=lambda a: (a.stmt.lineno, a.stmt.col_offset))


def _reaching_at(
    facts: IndexQueries, body: list[ast.stmt], name: str, use: ast.AST, state: State
) -> State | None:
    """The bindings of `name` that reach `use` inside `body` (None: `use` is not in it)."""
    for stmt in body:
        if facts.is_inside(use, stmt):
            return _reaching_inside(facts, stmt, name, use, state)
        state = _after(facts, stmt, name, state)
    return None


def _reaching_inside(
    facts: IndexQueries, stmt: ast.stmt, name: str, use: ast.AST, state: State
) -> State:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return state
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        state = _bound_by(facts, stmt, name) or state
    for block in _blocks(stmt):
        found = _reaching_at(facts, block, name, use, state)
        if found is not None:
            return found
    return state  # the use is in the statement's own header or value


def _blocks(stmt: ast.stmt) -> list[list[ast.stmt]]:
    if isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
        return [stmt.body, *(h.body for h in stmt.handlers), stmt.orelse, stmt.finalbody]  # type: ignore[attr-defined]
    if isinstance(stmt, ast.Match):
        return [case.body for case in stmt.cases]
    return [getattr(stmt, "body", None) or [], getattr(stmt, "orelse", None) or []]


def _bound_by(facts: IndexQueries, stmt: ast.stmt, name: str) -> State | None:
    scope_table = facts.assignments.get(facts.scope(stmt), {})
    bound = frozenset(id(a) for a in scope_table.get(name, ()) if a.stmt is stmt)
    return bound or None


def _after(facts: IndexQueries, stmt: ast.stmt, name: str, state: State) -> State:
    """The bindings of `name` that hold after `stmt` ran, given those before it."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return state
    if isinstance(stmt, ast.If):
        return _sequence(facts, stmt.body, name, state) | _sequence(facts, stmt.orelse, name, state)
    if isinstance(stmt, ast.Match):
        results = [_sequence(facts, case.body, name, state) for case in stmt.cases]
        return frozenset().union(state, *results)
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        state = _bound_by(facts, stmt, name) or state
        state = _sequence(facts, stmt.body, name, state)  # loops are taken to run
        return _sequence(facts, stmt.orelse, name, state)
    if isinstance(stmt, (ast.While, ast.With, ast.AsyncWith)):
        state = _bound_by(facts, stmt, name) or state  # `with ... as name`
        state = _sequence(facts, stmt.body, name, state)
        return _sequence(facts, getattr(stmt, "orelse", None) or [], name, state)
    if isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
        state = _sequence(facts, stmt.body, name, state)  # type: ignore[attr-defined]
        state = _sequence(facts, stmt.orelse, name, state)  # type: ignore[attr-defined]
        return _sequence(facts, stmt.finalbody, name, state)  # type: ignore[attr-defined]
    return _bound_by(facts, stmt, name) or state


def _sequence(facts: IndexQueries, body: list[ast.stmt], name: str, state: State) -> State:
    for stmt in body:
        state = _after(facts, stmt, name, state)
    return state
