"""The per-file state every query mixin of `Facts` reads, declared once for the type checker.

In: nothing at run time (annotations only: no attribute is created here). Out: `FileState`,
the base class of the query mixins (`IndexQueries`, `KindQueries`, `ValueQueries`,
`FlowQueries`, `SummaryQueries`). `Facts.__init__` (facts.py) assigns each attribute; the index
phase (`IndexQueries._collect`) fills the syntax tables (parents, scopes, bindings, calls)
before any other question is asked, and the later analyses only read them. Declaring the state
here, instead of each mixin reaching an attribute it cannot see, is what lets mypy check the
mixins: an attribute a mixin reads that nobody declares is an error.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torchls.analysis.facts import Facts
    from torchls.analysis.queries.vocabulary import (
        Assignment,
        ClassInfo,
        FunctionNode,
        ObjectKind,
        ScopeNode,
    )
    from torchls.analysis.resolver import CachedView, Definition, Workspace
    from torchls.analysis.source import ParsedSource
    from torchls.analysis.summaries import Summary


class FileState:
    """What `Facts.__init__` sets on every file's facts (see the module docstring)."""

    # The file and the project around it.
    source: ParsedSource
    filename: str
    workspace: Workspace | CachedView | None
    tree: ast.Module
    outside: tuple[ast.stmt, ...]
    replaced: tuple[ast.stmt, ...]
    fresh: frozenset[ast.stmt]
    # The syntax index: built first, read by every later question.
    import_positions: dict[str, tuple[int, int]]
    parents: dict[ast.AST, ast.AST]
    imports: dict[str, str]
    star_modules: list[str]
    stars_read: bool
    functions: dict[str, FunctionNode]
    classes: dict[str, ClassInfo]
    calls: list[ast.Call]
    loops: list[ast.For | ast.AsyncFor | ast.While]
    assignments: dict[ast.AST, dict[str, list[Assignment]]]
    scope_of_node: dict[ast.AST, ScopeNode]
    scope_nodes: dict[ast.AST, list[ast.AST]]
    calls_by_statement: dict[ast.stmt, list[ast.Call]]
    calls_by_scope: dict[ast.AST, list[ast.Call]]
    local_functions: dict[ast.AST, dict[str, FunctionNode]]
    # Memos of the later analyses (each filled by the mixin that owns the question).
    _definitions: dict[str, Definition | None]
    _calls_in: dict[ast.AST, list[ast.Call]]
    _scopes: dict[ast.AST, ScopeNode]
    _enclosing_loops: dict[ast.AST, list[ast.For | ast.AsyncFor | ast.While]]
    _reaching: dict[ast.Name, Assignment | None]
    _called: dict[ast.Call, FunctionNode | None]
    _kinds: dict[ast.AST, ObjectKind | None]
    _call_qualnames: dict[ast.Call, str | None]
    _origin_steps: int
    _summaries: dict[ast.AST, Summary]
    _callees: dict[ast.Call, tuple[Facts, FunctionNode, bool] | None]
    _parameter_arguments: dict[tuple[ast.AST, str], list[ast.expr] | None]
    _argument_values: dict[int, tuple[list[ast.expr], ast.expr | None]]
    _function_parameters: dict[ast.AST, set[str]]
    _argument_value_of: dict[ast.Name, ast.expr | None]
    _provided: dict[type, Any]
