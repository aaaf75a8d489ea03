"""Incremental re-analysis after an edit: only the top-level statements the edit can affect.

An editor re-analyses a document on every keystroke, but an edit changes one or two top-level
statements, and most findings are about code the edit cannot reach. Here the statements of a
module are linked by the top-level names they bind and read (a function and its callers, a
class and the code that builds it, a global and every statement that reads or writes it):
an edit can change the findings of the statements it touched and of everything linked to
them, directly or through others (the connected part of that graph), and of nothing else,
because the analysis of a statement consults other statements only through those names.

`plan()` takes the new parse (`reparse` says which statements it reused) and the earlier
version's findings, and returns the reduced module to analyse (the imports and the affected
statements, in their places: rows stay those of the file) and `merge()`, which puts the
findings of the affected statements together with the earlier findings of the others
(moved by the rows the edit added or removed). It returns None, meaning "analyse the whole
file", whenever that reasoning does not hold or would not pay: an import changed, the edit
reaches most of the file, or an earlier finding cannot be moved (its message names a row).

In: a `ParsedSource` with `reparsed` set, the earlier findings. Out: a `Plan` or None.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Sequence

from torchls.analysis.findings import Edit, Finding, Fix, Position, Related, Span
from torchls.analysis.source import ParsedSource, Reparsed
from torchls.records import record, replace

MAX_SHARE = 0.5
"""Above this share of the file's statements, the reduced analysis would save too little to
pay for the bookkeeping: the whole file is analysed."""

_NAMES_ATTR = "_torchls_names"
_ROW_IN_MESSAGE = re.compile(r"\blines? \d")
_IMPORTS = (ast.Import, ast.ImportFrom)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


@record(frozen=True)
class Plan:
    """The reduced module to analyse, and how to combine its findings with the earlier ones."""

    parsed: ParsedSource
    affected: frozenset[int]  # indexes into the new module body
    kept: tuple[Finding, ...]  # earlier findings of unaffected statements, moved
    rows: tuple[tuple[int, int], ...]  # row range of each statement of the new module body
    whole_file: frozenset[str]  # codes of the rules run on the whole file (all fresh)
    outside: tuple[ast.stmt, ...]  # the statements left out of the reduced module
    replaced: tuple[ast.stmt, ...]  # the earlier version's statements the edit replaced
    fresh: frozenset[ast.stmt]  # the statements parsed anew

    def merge(self, findings: Iterable[Finding]) -> list[Finding]:
        """The findings of the whole file: those of the reduced analysis that lie in an
        affected statement (or outside every statement), those of the rules run on the whole
        file, and the kept earlier ones."""
        fresh = [
            f for f in findings if f.code in self.whole_file or self._fresh_at(f.span.start.row)
        ]
        merged = [*fresh, *self.kept]
        merged.sort(key=lambda f: (f.span.start, f.code))
        return merged

    def _fresh_at(self, row: int) -> bool:
        """Whether the reduced analysis answers for `row`: it lies in an affected statement,
        or between statements (no earlier finding there is kept)."""
        owner = _owner(self.rows, row)
        return owner < 0 or owner in self.affected


def plan(
    parsed: ParsedSource, previous: Sequence[Finding], whole_file: frozenset[str] = frozenset()
) -> Plan | None:
    """The reduced analysis for `parsed` given the earlier version's `previous` findings, or
    None to analyse the whole file. `whole_file`: codes of the rules that the caller runs on
    the whole file; their earlier findings are not kept."""
    edit = parsed.reparsed
    if edit is None or parsed.syntax_errors or parsed.blanked_rows:
        return None
    body = parsed.tree.body
    old_body = edit.previous_tree.body
    first_new, end_new = edit.kept_before, len(body) - edit.kept_after
    changed = body[first_new:end_new]
    removed = old_body[edit.kept_before : len(old_body) - edit.kept_after]
    if any(_has_import(stmt) for stmt in (*changed, *removed)):
        return None  # imports are context for every statement
    names = [_names(stmt) for stmt in body]
    linking = _linking_names(body, removed)
    seeds = set(range(first_new, end_new))
    seed_names: set[str] = set()
    for stmt in removed:
        bound, read = _names(stmt)
        seed_names |= (bound | read) & linking
    rows = tuple(_rows(stmt) for stmt in body)
    moved: list[Finding] = []
    for finding in previous:
        if finding.code in whole_file:
            continue  # reported afresh from the whole file
        start = _new_row(finding.span.start.row, edit)
        if start is None:
            continue  # in the re-parsed region: its statement is re-analysed
        owner = _owner(rows, start)
        if owner < 0:
            continue  # between statements: the reduced analysis reports it again
        if not _spans_movable(finding, edit) or (edit.delta and _mentions_row(finding)):
            seeds.add(owner)  # a span in the re-parsed region, or a row named in its text
            continue
        moved.append(_moved(finding, edit))
    affected = _component(names, linking, seeds, seed_names)
    imports = {index for index, stmt in enumerate(body) if isinstance(stmt, _IMPORTS)}
    if len(affected) > MAX_SHARE * max(1, len(body) - len(imports)):
        return None
    kept = tuple(f for f in moved if _owner(rows, f.span.start.row) not in affected)
    inside = affected | imports
    reduced = ast.Module(
        body=[stmt for index, stmt in enumerate(body) if index in inside], type_ignores=[]
    )
    outside = tuple(stmt for index, stmt in enumerate(body) if index not in inside)
    reduced_parse = ParsedSource(parsed.text, parsed.lines, reduced)
    fresh = frozenset(changed)
    return Plan(
        reduced_parse, frozenset(affected), kept, rows, whole_file, outside, tuple(removed), fresh
    )


# -- names -------------------------------------------------------------------------------------


def _names(stmt: ast.stmt) -> tuple[frozenset[str], frozenset[str]]:
    """(names this top-level statement binds at module level, module-level names it may
    read), kept on the node: a reused statement is not walked again. Inside a function a
    name its scope binds (a parameter, an assignment) is that function's own, as Python
    resolves it, so `model` read in `def f(model)` links `f` to no global `model`."""
    cached = getattr(stmt, _NAMES_ATTR, None)
    if cached is not None:
        return cached
    bound: set[str] = set()
    _bound_by(stmt, bound)
    for node in ast.walk(stmt):
        if isinstance(node, ast.Global):
            bound.update(node.names)  # `global x; x = ...` in a function rebinds the global
    result = (frozenset(bound), frozenset(_reads(stmt, frozenset())))
    setattr(stmt, _NAMES_ATTR, result)
    return result


def _reads(node: ast.AST, enclosing: frozenset[str]) -> set[str]:
    """Names read in `node` that no function scope around them (`enclosing`, or one inside
    `node`) binds: the names it may read from module scope. Class bodies hide nothing from
    the functions in them (Python skips class scope there), so they bind nothing here."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        found = set()
        args = node.args
        for default in (*args.defaults, *(d for d in args.kw_defaults if d is not None)):
            found |= _reads(default, enclosing)  # evaluated where the def runs
        if not isinstance(node, ast.Lambda):
            for decorator in node.decorator_list:
                found |= _reads(decorator, enclosing)
            if node.returns is not None:
                found |= _reads(node.returns, enclosing)
        parameters = [*args.posonlyargs, *args.args, *args.kwonlyargs]
        parameters += [a for a in (args.vararg, args.kwarg) if a is not None]
        for parameter in parameters:
            if parameter.annotation is not None:
                found |= _reads(parameter.annotation, enclosing)
        local = {a.arg for a in parameters} | _scope_binds(node)
        inner = enclosing | (local - _declared_global(node))
        body = node.body if isinstance(node.body, list) else [node.body]
        for child in body:
            found |= _reads(child, inner)
        return found
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
        targets = {
            n.id
            for generator in node.generators
            for n in ast.walk(generator.target)
            if isinstance(n, ast.Name)
        }
        inner = enclosing | targets
        found = _reads(node.generators[0].iter, enclosing)  # evaluated outside
        for child in ast.iter_child_nodes(node):
            if child is not node.generators[0]:
                found |= _reads(child, inner)
        found |= _reads_except_first_iter(node.generators[0], inner)
        return found
    found = set()
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in enclosing:
        found.add(node.id)
    for child in ast.iter_child_nodes(node):
        found |= _reads(child, enclosing)
    return found


def _reads_except_first_iter(generator: ast.comprehension, enclosing: frozenset[str]) -> set[str]:
    found = _reads(generator.target, enclosing)
    for condition in generator.ifs:
        found |= _reads(condition, enclosing)
    return found


def _scope_binds(function: ast.AST) -> set[str]:
    """Names a function's own scope binds: assignment targets, loop and `with` targets,
    imports, nested defs and classes (not what nested scopes or comprehensions bind)."""
    bound: set[str] = set()
    todo = list(ast.iter_child_nodes(function))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
            continue  # its body is its own scope (decorators and defaults are read, not bound)
        if isinstance(
            node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
        ):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, _IMPORTS):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.arguments):
            continue  # a def's own parameters are handled by `_reads`
        todo.extend(ast.iter_child_nodes(node))
    return bound


def _declared_global(function: ast.AST) -> set[str]:
    """Names declared `global` or `nonlocal` in a function's own scope (they are not its own)."""
    declared: set[str] = set()
    todo = list(ast.iter_child_nodes(function))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            declared.update(node.names)
        elif not isinstance(node, _SCOPES):
            todo.extend(ast.iter_child_nodes(node))
    return declared


def _bound_by(node: ast.AST, bound: set[str]) -> None:
    """Names bound in module scope by `node`: its own name for a def or class, targets and
    imports elsewhere, looking into compound statements but not into function or class bodies."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        bound.add(node.name)
        return
    if isinstance(node, ast.Lambda):
        return
    if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
        bound.add(node.id)
    elif isinstance(node, _IMPORTS):
        for alias in node.names:
            bound.add((alias.asname or alias.name).split(".")[0])
    elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
        bound.add(node.name)
    for child in ast.iter_child_nodes(node):
        _bound_by(child, bound)


def _linking_names(body: list[ast.stmt], removed: list[ast.stmt]) -> set[str]:
    """Names bound at module level by a statement other than an import, in either version
    (builtins and imported names link nothing: no edit outside an import changes them)."""
    linking: set[str] = set()
    for stmt in (*body, *removed):
        if not isinstance(stmt, _IMPORTS):
            linking |= _names(stmt)[0]
    return linking


def _component(
    names: list[tuple[frozenset[str], frozenset[str]]],
    linking: set[str],
    seeds: set[int],
    seed_names: set[str],
) -> set[int]:
    """Every statement connected to a seed (or to a name a removed statement bound or read)
    through names one binds or reads and another binds or reads."""
    by_name: dict[str, list[int]] = {}
    for index, (bound, read) in enumerate(names):
        for name in (bound | read) & linking:
            by_name.setdefault(name, []).append(index)
    reached = set(seeds)
    todo = list(seeds)
    seen_names = set(seed_names)
    pending_names = list(seed_names)
    while todo or pending_names:
        while pending_names:
            for index in by_name.get(pending_names.pop(), ()):
                if index not in reached:
                    reached.add(index)
                    todo.append(index)
        if todo:
            bound, read = names[todo.pop()]
            for name in (bound | read) & linking:
                if name not in seen_names:
                    seen_names.add(name)
                    pending_names.append(name)
    return reached


def _has_import(stmt: ast.stmt) -> bool:
    """An import at module level (directly or in an `if`/`try` there), not inside a def."""
    if isinstance(stmt, _IMPORTS):
        return True
    if isinstance(stmt, _SCOPES):
        return False
    return any(
        _has_import(child) for child in ast.iter_child_nodes(stmt) if isinstance(child, ast.stmt)
    )


# -- rows --------------------------------------------------------------------------------------


def _rows(stmt: ast.stmt) -> tuple[int, int]:
    first = min([stmt.lineno, *(d.lineno for d in getattr(stmt, "decorator_list", ()))])
    return first, stmt.end_lineno or stmt.lineno


def _owner(rows: Sequence[tuple[int, int]], row: int) -> int:
    low, high = 0, len(rows) - 1
    while low <= high:
        middle = (low + high) // 2
        first, last = rows[middle]
        if row < first:
            high = middle - 1
        elif row > last:
            low = middle + 1
        else:
            return middle
    return -1


def _new_row(row: int, edit: Reparsed) -> int | None:
    """Where an earlier row is now, or None when it was in the re-parsed region."""
    first, last = edit.old_region
    if row < first:
        return row
    if row > last:
        return row + edit.delta
    return None


def _spans(finding: Finding) -> list[Span]:
    spans = [finding.span, *(r.span for r in finding.related if r.filename is None)]
    if finding.fix is not None:
        spans.extend(e.span for e in finding.fix.edits)
    return spans


def _spans_movable(finding: Finding, edit: Reparsed) -> bool:
    return all(
        _new_row(span.start.row, edit) is not None and _new_row(span.end.row, edit) is not None
        for span in _spans(finding)
    )


def _mentions_row(finding: Finding) -> bool:
    return bool(_ROW_IN_MESSAGE.search(finding.message)) or any(
        _ROW_IN_MESSAGE.search(r.message) for r in finding.related
    )


def _moved(finding: Finding, edit: Reparsed) -> Finding:
    """`finding` with every span in this file moved to its row in the new text (each span
    must be movable: none in the re-parsed region)."""
    if not edit.delta:
        return finding

    def move(span: Span) -> Span:
        start_row = _new_row(span.start.row, edit)
        end_row = _new_row(span.end.row, edit)
        assert start_row is not None and end_row is not None
        return Span(Position(start_row, span.start.column), Position(end_row, span.end.column))

    related = tuple(
        r if r.filename is not None else Related(move(r.span), r.message, r.filename)
        for r in finding.related
    )
    fix = finding.fix
    if fix is not None:
        edits = tuple(Edit(move(e.span), e.content) for e in fix.edits)
        fix = Fix(fix.applicability, fix.message, edits)
    return replace(finding, span=move(finding.span), related=related, fix=fix)
