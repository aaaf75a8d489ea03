"""The facts of one file, built once and shared by every rule.

In: a `ParsedSource`. Out: `Facts`, which knows the import aliases, the functions and classes,
which names hold models, losses, optimizers, schedulers, scalers and loaders, the loops and their
roles (epoch, batch, training, evaluation), where gradients are disabled, the train/eval mode of
each model at each call (see `modes.py`), and where a value comes from (`origins`).

Rules ask these questions instead of matching names themselves; that is what keeps them precise.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from torchls.analysis.source import ParsedSource

if TYPE_CHECKING:
    from torchls.analysis.resolver import CachedView, Definition, Workspace
    from torchls.analysis.summaries import Summary

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
    r"(^|_)(val|valid|validation|test|eval|evaluation|dev|holdout)(_|$|loader|set)"
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


@dataclass(frozen=True)
class ObjectKind:
    """What a name holds: `kind` is model, loss, optimizer, scheduler, scaler or loader, or
    "data" for a value known to be none of them (a dict or list display, a `state_dict()`)."""

    kind: str
    detail: str = ""  # constructor's short name: "CrossEntropyLoss", "StepLR", ...
    node: ast.AST | None = None  # the constructor call when it is in this file
    # Guessed from the variable's name alone (where the value comes from is out of sight):
    # good enough to follow a model, never enough to report one.
    by_name: bool = False


@dataclass(frozen=True)
class Origin:
    """Where a value comes from: `node` computes it; `via` lists the steps followed to get there.

    `module_output` marks that the value is the output of calling the module built by `node`
    (so `nn.Softmax(dim=1)` as origin means "a softmax output").
    """

    node: ast.AST
    via: tuple[ast.AST, ...] = ()
    module_output: bool = False
    facts: Facts | None = None  # the file `node` belongs to, when it is not the asking file


@dataclass
class ClassInfo:
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


@dataclass
class Assignment:
    """One binding of a name: `value` is the assigned expression, `index` the tuple position
    when the target was unpacked (`a, b = ...` gives index 0 and 1)."""

    stmt: ast.stmt
    value: ast.expr | None
    index: int | None = None
    loop: ast.For | ast.AsyncFor | None = None  # set when the name is a loop target


class Facts:
    """Everything rules need to know about one file; computed lazily, each part once."""

    def __init__(
        self,
        parsed: ParsedSource,
        filename: str,
        workspace: Workspace | CachedView | None = None,
    ) -> None:
        self.source = parsed
        self.filename = filename
        self.workspace = workspace
        self.import_positions: dict[str, tuple[int, int]] = {}
        self._definitions: dict[str, Definition | None] = {}
        self.tree = parsed.tree
        self.parents: dict[ast.AST, ast.AST] = {}
        self.imports: dict[str, str] = {}
        self.functions: dict[str, FunctionNode] = {}
        self.classes: dict[str, ClassInfo] = {}
        self.calls: list[ast.Call] = []
        self.loops: list[ast.For | ast.AsyncFor | ast.While] = []
        self.assignments: dict[ast.AST, dict[str, list[Assignment]]] = {}
        self.scope_of_node: dict[ast.AST, ScopeNode] = {}
        self._calls_in: dict[ast.AST, list[ast.Call]] = {}
        self.scope_nodes: dict[ast.AST, list[ast.AST]] = {}
        self.calls_by_statement: dict[ast.stmt, list[ast.Call]] = {}
        self.local_functions: dict[ast.AST, dict[str, FunctionNode]] = {}
        self._called: dict[ast.Call, FunctionNode | None] = {}
        self._kinds: dict[ast.AST, ObjectKind | None] = {}
        self._call_qualnames: dict[ast.Call, str | None] = {}
        # Provenance can branch (several returns, each through several calls); this caps the
        # total work per file so a pathological file cannot stall the analysis.
        self._origin_steps = 0
        # Function summaries of this file version (see `summaries.py`), by function node.
        self._summaries: dict[ast.AST, Summary] = {}
        self._callees: dict[ast.Call, tuple[Facts, FunctionNode, bool] | None] = {}
        self._parameter_arguments: dict[tuple[ast.AST, str], list[ast.expr] | None] = {}
        self._argument_values: dict[int, tuple[list[ast.expr], ast.expr | None]] = {}
        self._function_parameters: dict[ast.AST, set[str]] = {}
        self._argument_value_of: dict[ast.Name, ast.expr | None] = {}
        self._collect()

    # ------------------------------------------------------------------ collection (one walk)
    def _collect(self) -> None:
        # One iterative walk (deep nesting must not hit the recursion limit) that records
        # parents, scopes, bindings, calls and loops, and the statement each call belongs to.
        # It is the hottest loop of the analysis, hence the inlined child iteration.
        parents = self.parents
        scope_nodes = self.scope_nodes
        calls_by_statement = self.calls_by_statement
        stmt_type, ast_type = ast.stmt, ast.AST
        Entry = tuple[ast.AST, ScopeNode, "ast.ClassDef | None", "ast.stmt | None"]
        stack: list[Entry] = [(self.tree, self.tree, None, None)]
        self.assignments[self.tree] = {}
        scope_nodes[self.tree] = []
        while stack:
            node, scope, klass, statement = stack.pop()
            in_scope = scope_nodes[scope]
            for field_name in node._fields:
                if field_name == "ctx":
                    continue
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
                    if child_type in _PLAIN_TYPES:
                        if child_type is ast.Call:
                            self.calls.append(child)
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
                    else:
                        self._note(child, scope, klass)
                    stack.append((child, child_scope, child_class, child_statement))

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
            table.setdefault(arg.arg, []).append(Assignment(node, None))  # type: ignore[arg-type]

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
            for alias in node.names:
                local = alias.asname or alias.name
                self.imports[local] = (
                    f"{module}.{alias.name}" if node.module else f"{module}{alias.name}"
                )
                if getattr(alias, "lineno", None) is not None:
                    column = self.source.column(alias.lineno, alias.col_offset)
                    self.import_positions[local] = (alias.lineno, column)

    # ------------------------------------------------------------------ structure queries
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
        current = self.parents.get(node)
        while current is not None:
            if isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                return current
            current = self.parents.get(current)
        return self.tree

    def enclosing_loops(self, node: ast.AST) -> list[ast.For | ast.AsyncFor | ast.While]:
        """Loops around `node` inside its own function, innermost first."""
        loops = []
        current = self.parents.get(node)
        while current is not None and not isinstance(
            current, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
        ):
            if isinstance(current, (ast.For, ast.AsyncFor, ast.While)):
                loops.append(current)
            current = self.parents.get(current)
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
                cached = [n for n in self.scope_nodes[node] if isinstance(n, ast.Call)]
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

    # ------------------------------------------------------------------ names and imports
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

    def is_torch_api(self, call: ast.Call, *names: str) -> bool:
        """True if the call resolves to one of the dotted `names` (e.g. "torch.load")."""
        return self.call_qualname(call) in names

    @staticmethod
    def method_name(call: ast.Call) -> str | None:
        return call.func.attr if isinstance(call.func, ast.Attribute) else None

    @staticmethod
    def receiver(call: ast.Call) -> ast.expr | None:
        return call.func.value if isinstance(call.func, ast.Attribute) else None

    def key(self, expr: ast.AST | None) -> str | None:
        """A stable text key for a simple receiver: `model`, `self.model`, `self.net.encoder`."""
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

    # ------------------------------------------------------------------ bindings
    def reaching_assignment(self, name: ast.Name) -> Assignment | None:
        """The assignment of `name` that most plausibly reaches this use: the last one before
        it in the same scope; for a name never bound locally, the module-level one."""
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
                    and not self.is_inside(name, a.stmt)
                )
                or (a.loop is not None and self.is_inside(name, a.loop))
            ]
            if table_scope is not scope:
                before = candidates  # a global read from a function sees the final binding
            if before:
                return max(before, key=lambda a: (a.stmt.lineno, a.stmt.col_offset))
            return None
        return None

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

    def assignments_of(self, name: str, scope: ScopeNode) -> list[Assignment]:
        return self.assignments.get(scope, {}).get(name, [])

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

    # ------------------------------------------------------------------ kinds of objects
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
            annotated = self._annotated_kind(expr)
            if annotated is not None:
                return annotated
            name = expr.id if isinstance(expr, ast.Name) else expr.attr
            return self._kind_from_name(name)
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

    def _kind_from_name(self, name: str) -> ObjectKind | None:
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
        if qualname in ("torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"):
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

    def is_kind(self, expr: ast.AST | None, kind: str) -> bool:
        found = self.kind_of(expr)
        return found is not None and found.kind == kind

    # ------------------------------------------------------------------ loss calls
    @cached_property
    def loss_calls(self) -> list[LossCall]:
        """Every call that computes a loss whose kind we know, with its input and target."""
        from torchls.analysis.losses import find_loss_calls

        return find_loss_calls(self)

    @cached_property
    def loss_call_nodes(self) -> set[ast.Call]:
        return {loss_call.call for loss_call in self.loss_calls}

    # ------------------------------------------------------------------ provenance
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
            assignment = self.reaching_assignment(expr)
            if assignment is None and depth < MAX_DEPTH:
                arguments = self.parameter_arguments(expr, unbound=True)
                if arguments:
                    # A parameter comes from what its call sites pass (every one of them).
                    return [o for a in arguments for o in self.origins(a, depth + 1, (*via, expr))]
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
            return [Origin(expr, via)]
        if isinstance(expr, ast.Call):
            method = self.method_name(expr)
            receiver = self.receiver(expr)
            if receiver is not None and (
                method in PASS_THROUGH_METHODS or self.returns_receiver(expr)
            ):
                return self.origins(receiver, depth + 1, (*via, expr))
            module_origins = self._module_call_origins(expr, depth, via)
            if module_origins is not None:
                return module_origins
        return [Origin(expr, via)]

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
            Origin(o.node, (*via, *o.via), o.module_output, o.facts or owner)
            for o in owner.origins(expr, depth + 1)
        ]

    def _indexed_origins(
        self, value: ast.expr, index: int, depth: int, via: tuple[ast.AST, ...]
    ) -> list[Origin]:
        if isinstance(value, ast.Call):
            returns = self._forward_returns_of_call(value, depth)
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
        return [Origin(value, via)]

    def _module_call_origins(
        self, call: ast.Call, depth: int, via: tuple[ast.AST, ...]
    ) -> list[Origin] | None:
        """Origins of `module(x)`: the module's forward returns, or its last layer."""
        built = self._module_constructor(call.func, depth)
        if built is not None:
            owner, constructor = built
            outputs = owner._constructor_output(constructor, depth, ())
            return [
                Origin(o.node, (*via, call, *o.via), o.module_output, o.facts or owner)
                if owner is not self
                else Origin(o.node, (*via, call, *o.via), o.module_output, o.facts)
                for o in outputs
            ]
        returns = self._forward_returns_of_call(call, depth)
        if returns is None:
            return None
        out: list[Origin] = []
        for owner, returned in returns:
            out.extend(self._origins_in(owner, returned, depth, (*via, call)))
        return out

    def _module_constructor(self, func: ast.expr, depth: int) -> tuple[Facts, ast.Call] | None:
        """The `nn.X(...)` call that built the module object `func` refers to: directly, or the
        module a factory function (here or in another project file) returns."""
        value = self.binding_value(func) if isinstance(func, (ast.Name, ast.Attribute)) else None
        steps = 0
        while isinstance(value, ast.Name) and steps < MAX_DEPTH:
            value = self.binding_value(value)  # `self.head = head`, a constructor parameter
            steps += 1
        while isinstance(value, ast.Call) and steps < MAX_DEPTH:
            qualname = self.call_qualname(value) or ""
            if qualname.startswith("torch.nn.") and self.short_name(value)[:1].isupper():
                return self, value
            if self.returns_receiver(value):
                value = self.binding_value(self.receiver(value)) or (
                    self.receiver(value) if isinstance(self.receiver(value), ast.Call) else None
                )
                steps += 1
                continue
            for owner, returned in self.function_returns(value) or ():
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
        if short == "Sequential" and constructor.args:
            last = constructor.args[-1]
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

    def _forward_returns_of_call(
        self, call: ast.Call, depth: int
    ) -> list[tuple[Facts, ast.expr]] | None:
        """(file facts, return expression) of `forward` when `call` calls an instance of a
        module class defined in this file or in another project file."""
        func = call.func
        found: tuple[Facts, ClassInfo] | None = None
        if isinstance(func, ast.Name) and func.id == "self":
            klass = self.enclosing_class(call)
            info = self.module_class(klass.name) if klass else None
            found = (self, info) if info is not None else None
        elif isinstance(func, (ast.Name, ast.Attribute)):
            value = self.binding_value(func)
            steps = 0
            while isinstance(value, ast.Call) and steps < MAX_DEPTH:
                found = self.module_class_of_call(value)
                if found is not None:
                    break
                receiver = self.receiver(value)
                if self.returns_receiver(value):
                    value = self.binding_value(receiver) if receiver is not None else None
                    if value is None and isinstance(receiver, ast.Call):
                        value = receiver
                    steps += 1
                    continue
                break
        if found is None:
            return None
        owner, info = found
        returns = owner._forward_returns(info, depth)
        return [(owner, r) for r in returns] if returns is not None else None

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

    # ------------------------------------------------------------------ other files
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
        another project file (factories such as `build_model()` or `make_criterion()`)."""
        if not isinstance(call.func, ast.Name):
            return None
        name = call.func.id
        function: FunctionNode | None = self.functions.get(name)
        owner: Facts = self
        if function is None:
            definition = self.definition(name)
            if definition is None or isinstance(definition.node, ast.ClassDef):
                return None
            owner, function = definition.facts, definition.node
        returns = [
            (owner, node.value)
            for node in owner.walk_local(function)
            if isinstance(node, ast.Return) and node.value is not None
        ]
        return returns or None

    # ------------------------------------------------------------------ autograd graphs
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
                if self.returns_receiver(node) and self.constructs_module(node):
                    continue  # moving a module (`D.cuda()`): its parameters are leaves
                func = node.func
                if self.is_forward_call(node):
                    found.add(node)
                elif isinstance(func, ast.Attribute):
                    todo.append(func.value)  # `out.pow(2)`: the receiver is a graph tensor
                todo.extend(node.args)
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

    # ------------------------------------------------------------------ gradient regions
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

    # ------------------------------------------------------------------ functions and calls
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
            # A nested function (an LBFGS closure, say) shadows a module-level one.
            nested = self.local_functions.get(self.scope(call), {}).get(func.id)
            return nested or self.functions.get(func.id)
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            if func.value.id == "self":
                klass = self.enclosing_class(call)
                info = self.classes.get(klass.name) if klass else None
                if info is not None:
                    return info.methods.get(func.attr)
        return None

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
            for argument in call.args:
                if isinstance(argument, ast.Name):
                    passed = self.called_function(ast.Call(func=argument, args=[], keywords=[]))
                    if passed is not None and self.function_reaches(passed, predicate, depth + 1):
                        return True
            return False
        return self.function_reaches(function, predicate, depth + 1)

    def node_reaches(self, node: ast.AST, predicate) -> bool:
        """True if a call under `node` (or a function it calls) satisfies `predicate`."""
        return any(self.reaches(call, predicate) for call in self.calls_in(node))

    # ------------------------------------------------------------------ training vocabulary
    def is_backward(self, call: ast.Call) -> bool:
        method = self.method_name(call)
        if method == "backward":
            return True
        if method == "manual_backward" and _on_self(call):
            return True  # Lightning manual optimization: `self.manual_backward(loss)`
        return (self.call_qualname(call) or "") in ("torch.autograd.backward",)

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
        if self.method_name(call) != "step":
            return None
        receiver = self.receiver(call)
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

    def is_batch_loop(self, loop: ast.AST) -> bool:
        return loop in self.batch_loops

    @cached_property
    def batch_loops(self) -> dict[ast.AST, str]:
        """Loops over a data loader → their role: "train", "eval" or "" (unknown)."""
        found: dict[ast.AST, str] = {}
        for loop in self.loops:
            if not isinstance(loop, (ast.For, ast.AsyncFor)):
                continue
            iterable = _unwrap_iterable(loop.iter)
            kind = self.kind_of(iterable) if iterable is not None else None
            name = self.key(iterable) or ""
            if (kind is not None and kind.kind == "loader") or LOADER_NAME_RE.search(name):
                found[loop] = loader_role(name)
        return found

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

    # ------------------------------------------------------------------ module objects, paths
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

    def is_forward_call(self, call: ast.Call) -> bool:
        """`model(x)` / `self.net(x)`: a call of a module instance, which records a graph.
        Building the module (`Discriminator(shape)`) or moving it is not a forward call."""
        func = call.func
        if not isinstance(func, (ast.Name, ast.Attribute)) or not self.is_kind(func, "model"):
            return False
        return not self.constructs_module(call)

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

    # ------------------------------------------------------------------ what a loop trains
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
        follows a loop there that trains (reaches `backward()`), or it sits in a helper whose
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
                and self.node_reaches(loop, self.is_backward)
            ):
                return True
        if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) or depth >= 3:
            return False
        sites = self.call_sites(scope)
        return bool(sites) and all(self.after_training(site, depth + 1) for site in sites)

    # ------------------------------------------------------------------ call graph, summaries
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
            if not self.call_sites(scope) and not (
                scope.name == "__init__" and self._construction_sites(scope)
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
        from torchls.analysis.resolver import LIBRARY_ROOTS

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
                return None
        elif isinstance(func, ast.Attribute):
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
        if not isinstance(func, ast.Attribute) or not isinstance(func.value, ast.Name):
            return None
        base = func.value.id
        if base in self._project_imports:
            if self.reaching_assignment(func.value) is None:
                other = self.workspace.module_facts(self, base)
                if other is not None:
                    if func.attr in other.functions:
                        return other, other.functions[func.attr], False
                    info = other.classes.get(func.attr)
                    if info is not None and "__init__" in info.methods:
                        return other, info.methods["__init__"], True
                    return None
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
        sites = [(site, isinstance(site.func, ast.Attribute)) for site in self.call_sites(function)]
        if function.name == "__init__":
            sites.extend((site, True) for site in self._construction_sites(function))
        if not sites:
            return None
        found: list[ast.expr] = []
        all_params = [a.arg for a in [*function.args.posonlyargs, *function.args.args]]
        for site, bound_method in sites:
            if any(k.arg is None for k in site.keywords):
                return None  # `f(**options)`: any parameter may come from the mapping
            params = all_params[1:] if bound_method and all_params else all_params
            value = next((k.value for k in site.keywords if k.arg == param), None)
            if value is None and param in params:
                position = params.index(param)
                if any(isinstance(a, ast.Starred) for a in site.args[: position + 1]):
                    return None
                if position < len(site.args):
                    value = site.args[position]
            if value is None:
                value = parameter_default(function, param)
            if value is None:
                return None
            found.append(value)
        return found

    def _construction_sites(self, init: FunctionNode) -> list[ast.Call]:
        """`Net(...)` calls in this file for the `__init__` of class `Net`."""
        klass = self.parents.get(init)
        if not isinstance(klass, ast.ClassDef):
            return []
        return self._calls_by_name.get(klass.name, [])

    @cached_property
    def _calls_by_name(self) -> dict[str, list[ast.Call]]:
        index: dict[str, list[ast.Call]] = {}
        for call in self.calls:
            if isinstance(call.func, ast.Name):
                index.setdefault(call.func.id, []).append(call)
        return index

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


@dataclass(frozen=True)
class LossCall:
    """A call computing a loss: `loss` is e.g. "CrossEntropyLoss" (module or functional)."""

    call: ast.Call
    loss: str
    input: ast.expr | None
    target: ast.expr | None
    constructor: ast.Call | None = None


def build_facts(parsed: ParsedSource, filename: str, workspace: Workspace | None = None) -> Facts:
    return Facts(parsed, filename, workspace)
