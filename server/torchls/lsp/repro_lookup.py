"""Questions the repro features ask of the document's syntax tree, answered on the analysis thread.

In: a snapshot and the server's last parse of it. Out:

- `repro_regions`: the row ranges where "Run bounded repro" is offered: loops whose body
  reaches `backward()` (directly or through in-file helpers), and functions that do (a train
  step). Built from the analysis facts, so "training loop" means what it means to the rules.
- `value_at`: for a name under the cursor, the expression that gave it its value (its own
  assignment, or the one reaching this use), so the hover can show that value's trace. When
  that expression calls a function or method of this file (`loss = loss_fn(...)`,
  `z = self.reparameterize(...)`), whose ops ran on its own lines, the expressions it returns
  come along (`returned`), so the hover can show the value that call gave back.

Both run on `server.analysis_pool`: the cached parse (`parsed_by_uri`) is only ever touched on
that thread, and neither question should cost the event loop a full walk of a large file.
"""

from __future__ import annotations

import ast

from torchls.analysis.facts import Facts, build_facts
from torchls.analysis.source import ParsedSource, SourceError, parse_source
from torchls.records import record

Region = tuple[int, int]
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def parsed_for(cache: dict[str, ParsedSource], uri: str, text: str) -> ParsedSource | None:
    """The analysis's own parse of `text` when it has one, else a fresh one (not cached: the
    analysis reuses its entry incrementally and must stay its only owner)."""
    parsed = cache.get(uri)
    if parsed is not None and parsed.text == text:
        return parsed
    try:
        return parse_source(text)
    except SourceError:
        return None


def repro_regions(
    cache: dict[str, ParsedSource], uri: str, text: str, filename: str
) -> list[Region]:
    """(first row, last row) of each training loop and train-step function in `text`."""
    parsed = parsed_for(cache, uri, text)
    if parsed is None:
        return []
    facts = build_facts(parsed, filename)
    regions = []
    for loop in facts.loops:
        if facts.node_reaches(loop, facts.is_backward):
            regions.append((loop.lineno, loop.end_lineno or loop.lineno))
    for node in facts.scope_nodes:
        if isinstance(node, FUNCTIONS) and facts.function_reaches(node, facts.is_backward):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            regions.append((first, node.end_lineno or node.lineno))
    return sorted(set(regions))


@record(frozen=True)
class ValueSpan:
    """The expression a name's value comes from, in the current text (1-based rows, 0-based
    code-point columns, end exclusive)."""

    name: str
    row: int
    column: int
    end_row: int
    end_column: int
    index: int | None  # the tuple position when the name was unpacked (`a, b = f()`)
    # When the value is a call of a function of this file: what it returns, last first.
    callee: str | None = None
    returned: tuple[ValueSpan, ...] = ()


def _covers(node: ast.AST, row: int) -> bool:
    start = getattr(node, "lineno", None)
    if start is None:
        return True  # no position (a Module, an operator): look inside
    return start <= row <= (getattr(node, "end_lineno", None) or start)


def _name_at(parsed: ParsedSource, row: int, column: int) -> tuple[ast.Name, list[ast.AST]] | None:
    """The Name under (row, column) and its ancestors, descending only into nodes that cover
    the row (a hover must not walk a whole large file)."""
    stack: list[tuple[ast.AST, list[ast.AST]]] = [(parsed.tree, [])]
    while stack:
        node, ancestors = stack.pop()
        for child in ast.iter_child_nodes(node):
            if not _covers(child, row):
                continue
            if isinstance(child, ast.Name) and child.lineno == row:
                start = parsed.column(row, child.col_offset)
                if start <= column <= start + len(child.id):
                    return child, [*ancestors, node]
            stack.append((child, [*ancestors, node]))
    return None


def _unpacked_index(target: ast.AST, name: ast.Name) -> int | None:
    if isinstance(target, ast.Tuple | ast.List):
        for position, element in enumerate(target.elts):
            if element is name:
                return position
    return None


def _own_value(name: ast.Name, ancestors: list[ast.AST]) -> tuple[ast.AST, int | None] | None:
    """For a name being assigned: the assigned expression (the whole statement for `+=`)."""
    parent = ancestors[-1] if ancestors else None
    for node in reversed(ancestors):
        if isinstance(node, ast.Assign) and node.value is not None:
            return node.value, _unpacked_index(parent, name) if parent is not node else None
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            return node.value, None
        if isinstance(node, ast.AugAssign):
            return node, None
        if isinstance(node, ast.NamedExpr):
            return node.value, None
        if isinstance(node, ast.stmt):
            return None  # a loop target, a `with ... as`, an import: no traced value
    return None


def value_at(
    cache: dict[str, ParsedSource], uri: str, text: str, filename: str, row: int, column: int
) -> ValueSpan | None:
    """The value expression of the name at (row, column), or None."""
    parsed = parsed_for(cache, uri, text)
    if parsed is None:
        return None
    found = _name_at(parsed, row, column)
    if found is None:
        return None
    name, ancestors = found
    if isinstance(name.ctx, ast.Store):
        own = _own_value(name, ancestors)
        if own is None:
            return None
        value, index = own
    else:
        assignment = build_facts(parsed, filename).reaching_assignment(name)
        if assignment is None or assignment.value is None:
            return None
        value, index = assignment.value, assignment.index
    span = parsed.span(value)
    callee, returned = None, ()
    if isinstance(value, ast.Call):
        function = _callee(parsed, value, ancestors)
        if function is not None:
            facts = build_facts(parsed, filename)
            callee, returned = function.name, _returned(parsed, facts, function, name.id, index)
            if returned:
                index = None  # the returned spans are the element already
    return ValueSpan(
        name.id,
        span.start.row,
        span.start.column,
        span.end.row,
        span.end.column,
        index,
        callee,
        returned,
    )


def _callee(
    parsed: ParsedSource, call: ast.Call, ancestors: list[ast.AST]
) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The function of this file that `call` runs: a module-level `f(...)`, or `self.m(...)`
    inside a class that defines `m`."""
    func = call.func
    body: list[ast.stmt] = []
    wanted = ""
    if isinstance(func, ast.Name):
        body, wanted = parsed.tree.body, func.id
    elif (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id == "self"
    ):
        classes = [node for node in ancestors if isinstance(node, ast.ClassDef)]
        if classes:
            body, wanted = classes[-1].body, func.attr
    found = None
    for node in body:  # the last definition wins, as at run time
        if isinstance(node, FUNCTIONS) and node.name == wanted:
            found = node
    return found


def _returned(
    parsed: ParsedSource,
    facts: Facts,
    function: ast.FunctionDef | ast.AsyncFunctionDef,
    name: str,
    index: int | None,
) -> tuple[ValueSpan, ...]:
    spans = []
    for node in _returns(function):
        value: ast.AST | None = node.value
        element = index
        if element is not None and isinstance(value, ast.Tuple | ast.List):
            value = value.elts[element] if element < len(value.elts) else None
            element = None
        if isinstance(value, ast.Name):  # `return out`: where `out` got its value
            assignment = facts.reaching_assignment(value)
            if assignment is not None and assignment.value is not None:
                value = assignment.value
                element = assignment.index if element is None else element
        if value is None:
            continue
        span = parsed.span(value)
        spans.append(
            ValueSpan(
                name, span.start.row, span.start.column, span.end.row, span.end.column, element
            )
        )
    return tuple(reversed(spans))


def _returns(function: ast.AST) -> list[ast.Return]:
    """The `return` statements of `function` itself (not of functions nested in it)."""
    found = []
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Return) and node.value is not None:
            found.append(node)
        elif not isinstance(node, (*FUNCTIONS, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))
    return sorted(found, key=lambda r: (r.lineno, r.col_offset))
