"""Non-strict `load_state_dict` calls whose key mismatch is prepared for or
acknowledged (for TL306, load-state-dict-not-strict-unchecked).

Why a module of its own: these predicates (keys dropped by name first, a live module's
weights, a dict written out with the keys it sets, one shard per loop pass, an assert right
after, an explaining comment, two partial loads in a row) form one group of exemptions, and
the rule's module would pass its size limit with them.
In: `Facts`, the call and its statement. Out: whether the mismatch is known and intended.
"""

from __future__ import annotations

import ast

from torchls.analysis.facts import Facts

ACKNOWLEDGING_WORDS = ("strict", "missing", "partial", "mismatch", "omit", "not saved", "head")


def _literal_keys(value: ast.AST) -> bool:
    """A dict written out with constant string keys (`{"scale": s}`, `dict(scale=s)`): the
    code names every entry it sets, so the keys it leaves out are left out on purpose."""
    if isinstance(value, ast.Dict):
        return bool(value.keys) and all(
            isinstance(k, ast.Constant) and isinstance(k.value, str) for k in value.keys
        )
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id == "dict"
        and not value.args
        and bool(value.keywords)
        and all(k.arg is not None for k in value.keywords)
    )


def _entries_added(facts: Facts, function: ast.AST, name: str) -> bool:
    """Some `name[key] = value` in `function` adds to the dict (a converter filling in keys
    it computes: one that misses a key is what strict=False would hide)."""
    return any(
        isinstance(node, ast.Assign)
        and any(
            isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id == name
            for t in node.targets
        )
        for node in facts.walk_local(function)
    )


def _prepared_or_acknowledged(
    facts: Facts, call: ast.Call, statement: ast.stmt, state: ast.AST
) -> bool:
    """Non-strict loads whose mismatch is known and intended: keys dropped from the dict by
    name first (`sd.pop("fc.weight")`, `del sd[key]`), weights copied from a live module
    (`teacher.load_state_dict(student.state_dict(), strict=False)`), one shard per loop
    iteration, an assert on the result right after in a test, or a comment on the call
    (or just above it) that explains the mismatch."""
    function = facts.enclosing_function(call) or facts.tree
    name = state.id if isinstance(state, ast.Name) else None
    if name is not None:
        for node in facts.walk_local(function):
            if getattr(node, "lineno", call.lineno) >= call.lineno:
                continue
            # Only removals of keys named in the code: the head being replaced is then all
            # that is missing (a shape-driven `del sd[k]` may hide any other mismatch).
            if (
                isinstance(node, ast.Call)
                and facts.method_name(node) == "pop"
                and isinstance(facts.receiver(node), ast.Name)
                and facts.receiver(node).id == name  # type: ignore[union-attr]
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                return True
            if isinstance(node, ast.Delete) and any(
                isinstance(t, ast.Subscript)
                and isinstance(t.value, ast.Name)
                and t.value.id == name
                and isinstance(t.slice, ast.Constant)
                for t in node.targets
            ):
                return True
    values = [state]
    if name is not None:
        assignment = facts.reaching_assignment(state)  # type: ignore[arg-type]
        if assignment is not None and assignment.value is not None:
            values.append(assignment.value)
            loops = facts.enclosing_loops(call)
            if loops and facts.is_inside(assignment.stmt, loops[0]):
                return True  # a shard read and loaded per iteration: partial by definition
    for value in values:
        if isinstance(value, ast.Call) and facts.method_name(value) == "state_dict":
            return True  # a live module's own weights
        if _literal_keys(value) and not (name and _entries_added(facts, function, name)):
            return True  # `{"log_alpha": tensor}`: the keys set are named right here
    following = _next_statement(facts, statement)
    if isinstance(following, ast.Assert) and function is not facts.tree:
        return True
    first = max(call.lineno - 2, 1)
    for row in range(first, (call.end_lineno or call.lineno) + 1):
        line = facts.source.lines[row - 1]
        if "#" in line and any(w in line.split("#", 1)[1].lower() for w in ACKNOWLEDGING_WORDS):
            return True
    return False


def _next_statement(facts: Facts, statement: ast.stmt) -> ast.stmt | None:
    block = facts.block_of(statement) or []
    index = next((i for i, item in enumerate(block) if item is statement), len(block))
    return block[index + 1] if index + 1 < len(block) else None


def _split_load(facts: Facts, call: ast.Call, statement: ast.stmt) -> bool:
    """Two partial loads into the same module one after the other (base weights, then the
    adapter's): each one misses the other's keys by design."""
    receiver = facts.key(facts.receiver(call))
    block = facts.block_of(statement)
    if receiver is None or block is None:
        return False
    index = next(i for i, item in enumerate(block) if item is statement)
    for neighbour in block[max(index - 1, 0) : index + 2]:
        if neighbour is statement or not isinstance(neighbour, ast.Expr):
            continue
        other = neighbour.value
        if (
            isinstance(other, ast.Call)
            and facts.method_name(other) == "load_state_dict"
            and facts.key(facts.receiver(other)) == receiver
            and any(
                k.arg == "strict" and isinstance(k.value, ast.Constant) and k.value.value is False
                for k in other.keywords
            )
        ):
            return True
    return False
