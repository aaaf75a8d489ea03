"""The facts of one file, built once and shared by every rule: a thin facade over the queries.

In: a `ParsedSource`. Out: `Facts`, which knows the import aliases, the functions and classes,
which names hold models, losses, optimizers, schedulers, scalers and loaders, the loops and their
roles (epoch, batch, training, evaluation), where gradients are disabled, where a value comes
from (`origins`), and what project functions do at their call sites (`call_summary`).

The questions live in `torchls.analysis.queries`, one concept per module (index, kinds, values,
flow, calls); `Facts` puts them together on one object and holds the per-file state and caches
they share, so rules keep asking `facts.origins(...)`, `facts.kind_of(...)`. The shared names
(`ObjectKind`, `Origin`, `LossCall`, the name patterns, ...) are re-exported from
`queries.vocabulary`.

Rules ask these questions instead of matching names themselves; that is what keeps them precise.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Any, TypeVar

from torchls.analysis.queries.calls import SummaryQueries
from torchls.analysis.queries.flow import FlowQueries
from torchls.analysis.queries.kinds import KindQueries
from torchls.analysis.queries.values import ValueQueries
from torchls.analysis.queries.vocabulary import (
    _PLAIN_TYPES,
    ACTIVATION_MODULES,
    DATA_DISPLAYS,
    DETACHING_METHODS,
    DIST_AUTOGRAD,
    EVAL_FUNCTION_RE,
    EVAL_ROLE_RE,
    GRAD_DISABLING,
    LOADER_NAME_RE,
    LOSS_NAME_RE,
    MAX_DEPTH,
    MAX_ORIGIN_STEPS,
    MODEL_NAME_RE,
    OPTIMIZER_NAME_RE,
    PASS_THROUGH_METHODS,
    RETURNS_RECEIVER,
    STATE_METHODS,
    Assignment,
    ClassInfo,
    FunctionNode,
    LossCall,
    ObjectKind,
    Origin,
    ScopeNode,
    _child_statements,
    _function_of,
    _on_self,
    _unwrap_iterable,
    loader_role,
    parameter_default,
)
from torchls.analysis.source import ParsedSource

if TYPE_CHECKING:
    from torchls.analysis.resolver import CachedView, Definition, Workspace
    from torchls.analysis.summaries import Summary

Provided = TypeVar("Provided")

__all__ = [
    "ACTIVATION_MODULES",
    "DATA_DISPLAYS",
    "DETACHING_METHODS",
    "DIST_AUTOGRAD",
    "EVAL_FUNCTION_RE",
    "EVAL_ROLE_RE",
    "GRAD_DISABLING",
    "LOADER_NAME_RE",
    "LOSS_NAME_RE",
    "MAX_DEPTH",
    "MAX_ORIGIN_STEPS",
    "MODEL_NAME_RE",
    "OPTIMIZER_NAME_RE",
    "PASS_THROUGH_METHODS",
    "RETURNS_RECEIVER",
    "STATE_METHODS",
    "_PLAIN_TYPES",
    "Assignment",
    "ClassInfo",
    "Facts",
    "FunctionNode",
    "LossCall",
    "ObjectKind",
    "Origin",
    "ScopeNode",
    "_child_statements",
    "_function_of",
    "_on_self",
    "_unwrap_iterable",
    "build_facts",
    "loader_role",
    "parameter_default",
]


class Facts(KindQueries, ValueQueries, FlowQueries, SummaryQueries):
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
        # Top-level statements of the file left out of `parsed.tree` by an editor's reduced
        # analysis (`incremental.py`): file-wide inputs read what they contribute from them.
        self.outside: tuple[ast.stmt, ...] = ()
        # ... and the earlier version's statements the edit replaced, and this tree's
        # statements parsed anew (the others are the earlier version's own nodes).
        self.replaced: tuple[ast.stmt, ...] = ()
        self.fresh: frozenset[ast.stmt] = frozenset()
        self.import_positions: dict[str, tuple[int, int]] = {}
        self._definitions: dict[str, Definition | None] = {}
        self.tree = parsed.tree
        self.parents: dict[ast.AST, ast.AST] = {}
        self.imports: dict[str, str] = {}
        self.star_modules: list[str] = []  # `from utils import *`: "utils"
        self.stars_read = True  # every star import was found and read (`adopt_star_imports`)
        self.functions: dict[str, FunctionNode] = {}
        self.classes: dict[str, ClassInfo] = {}
        self.calls: list[ast.Call] = []
        self.loops: list[ast.For | ast.AsyncFor | ast.While] = []
        self.assignments: dict[ast.AST, dict[str, list[Assignment]]] = {}
        self.scope_of_node: dict[ast.AST, ScopeNode] = {}
        self._calls_in: dict[ast.AST, list[ast.Call]] = {}
        self._scopes: dict[ast.AST, ScopeNode] = {}
        self._enclosing_loops: dict[ast.AST, list[ast.For | ast.AsyncFor | ast.While]] = {}
        self._reaching: dict[ast.Name, Assignment | None] = {}
        self.scope_nodes: dict[ast.AST, list[ast.AST]] = {}
        self.calls_by_statement: dict[ast.stmt, list[ast.Call]] = {}
        # Scope (module, function, lambda) -> the calls directly in it, in walk order.
        self.calls_by_scope: dict[ast.AST, list[ast.Call]] = {}
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
        # Separate analyses over these facts (`facts.get(ObjectModel)`), built once each.
        self._provided: dict[type, Any] = {}
        if not self._reuse_index():
            self._collect()
            project = getattr(workspace, "workspace", workspace)
            if getattr(project, "share_parses", False):
                self._keep_index()
        self.adopt_star_imports()
        self.adopt_free_torch()

    def get(self, provider: type[Provided]) -> Provided:
        """The analysis `provider` (a class taking these facts, such as `ObjectModel`) of
        this file, built on first use and shared by every rule afterwards."""
        try:
            return self._provided[provider]
        except KeyError:
            made = self._provided[provider] = provider(self)  # type: ignore[call-arg]
            return made

    def release(self) -> None:
        """Drop every table and memo. Memos hold the facts themselves (a callee is `(facts,
        function, bound)`, the mode analysis keeps its facts), so a finished file's facts
        are a cycle that only the cyclic collector could free, after scanning the whole
        tree; `analyze` calls this once its rules have run, and reference counting frees
        it all at once. The facts must not be asked anything afterwards."""
        self.__dict__.clear()


def build_facts(parsed: ParsedSource, filename: str, workspace: Workspace | None = None) -> Facts:
    return Facts(parsed, filename, workspace)
