"""Helpers shared by the TL4xx rule modules (optimizer, scheduler, mixed precision).

Why it exists: those rules walk the same statement blocks, recognise the same calls
(`scheduler.step()`, `scaler.step(optimizer)`, gradient clipping) and build the same move
edits; what two or more of them use lives here, so that the rule modules never import one
another. In: the file's `Facts` and nodes. Out: predicates, statement lookups and `Edit`s.
"""

from __future__ import annotations

import ast

from torchls.analysis.facts import Facts
from torchls.analysis.findings import Edit
from torchls.analysis.registry import exemption
from torchls.analysis.rules._edits import delete_statement_line

CLIP_FUNCTIONS = (
    "torch.nn.utils.clip_grad_norm_",
    "torch.nn.utils.clip_grad_value_",
    "torch.nn.utils.clip_grad_norm",
    "torch.nn.utils.clip_grad.clip_grad_norm_",
    "torch.nn.utils.clip_grad.clip_grad_value_",
)
_FUNCTION_TYPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.Module)
_LOOP_TYPES = (ast.For, ast.AsyncFor, ast.While)


@exemption("TL408", "neg_clip_before_step.py")
def clips_nothing(facts: Facts, clip: ast.Call) -> bool:
    """`clip_grad_norm_(params, float("inf"))` after the step: an infinite limit changes no
    gradient, the call only measures the norm (for logging)."""
    limit = next((k.value for k in clip.keywords if k.arg in ("max_norm", "clip_value")), None)
    if limit is None and len(clip.args) > 1:
        limit = clip.args[1]
    if limit is None:
        return False
    text = facts.source.segment(limit).replace(" ", "").lower()
    return text.endswith((".inf", "inf')", 'inf")')) or text in ("inf", "math.inf")


# ---------------------------------------------------------------------- statement helpers
def block_of(facts: Facts, stmt: ast.stmt) -> list[ast.stmt] | None:
    """The statement list that directly contains `stmt` (a body, an else, a handler...)."""
    parent = facts.parents.get(stmt)
    if parent is None:
        return None
    blocks: list[list] = [getattr(parent, n, None) or [] for n in ("body", "orelse", "finalbody")]
    blocks += [h.body for h in getattr(parent, "handlers", ()) or ()]
    blocks += [c.body for c in getattr(parent, "cases", ()) or ()]
    for block in blocks:
        if isinstance(block, list) and any(item is stmt for item in block):
            return block
    if isinstance(parent, (ast.ExceptHandler, ast.match_case)):
        return parent.body
    return None


def index_in(block: list[ast.stmt], stmt: ast.stmt) -> int:
    return next(i for i, item in enumerate(block) if item is stmt)


def owns_lines(facts: Facts, stmt: ast.stmt) -> bool:
    """True when nothing but `stmt` (and a trailing comment) sits on its lines."""
    return delete_statement_line(facts, stmt) is not None


def movable(facts: Facts, stmt: ast.stmt) -> Edit | None:
    """The edit deleting `stmt`, when it can go without leaving an empty block."""
    block = block_of(facts, stmt)
    if block is None or len(block) < 2:
        return None
    return delete_statement_line(facts, stmt)


def statement_text(facts: Facts, stmt: ast.stmt) -> str:
    return facts.source.segment(stmt)


def names_in(expr: ast.AST) -> set[str]:
    """Identifiers read in `expr`: names and attribute names."""
    found: set[str] = set()
    for node in ast.walk(expr):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
    return found


def loop_counters(facts: Facts, loop: ast.AST) -> set[str]:
    """Names a loop iterates with or counts with: its targets and names `+=`-ed in its body."""
    found: set[str] = set()
    target = getattr(loop, "target", None)
    if target is not None:
        found |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    # The scope's node list (built once by the facts) is much cheaper to filter than walking
    # the loop's subtree again for every scheduler step asked about.
    scope = loop if loop in facts.scope_nodes else facts.scope(loop)
    for node in facts.scope_nodes.get(scope, ()):
        if isinstance(node, ast.AugAssign) and facts.is_inside(node, loop):
            found |= names_in(node.target)
    return found


def position(node: ast.AST) -> tuple[int, int]:
    return (node.lineno, node.col_offset)  # type: ignore[attr-defined]


def method_calls(facts: Facts, method: str) -> list[ast.Call]:
    """Calls of `.method(...)` in file order (the index lives on the facts)."""
    return facts.method_calls(method)


def _statement_of_call(facts: Facts, call: ast.Call) -> ast.stmt | None:
    """The statement when it is nothing but `call` (`scheduler.step()` on its own)."""
    parent = facts.parents.get(call)
    return parent if isinstance(parent, ast.Expr) else None


# ---------------------------------------------------------------------- training vocabulary
def is_scheduler_step(facts: Facts, call: ast.Call) -> bool:
    return facts.method_name(call) == "step" and facts.is_kind(facts.receiver(call), "scheduler")


def is_scaler_call(facts: Facts, call: ast.Call, method: str) -> bool:
    return facts.method_name(call) == method and facts.is_kind(facts.receiver(call), "scaler")


def is_optimizer_step(facts: Facts, call: ast.Call) -> bool:
    return facts.optimizer_of_step(call) is not None


def _optimizer_step_inside(facts: Facts, node: ast.AST) -> bool:
    return facts.node_reaches(node, lambda c: is_optimizer_step(facts, c))


# ---------------------------------------------------------------------- paths between nodes
_UNCONDITIONAL = (
    ast.Expr,
    ast.Assign,
    ast.AugAssign,
    ast.AnnAssign,
    ast.With,
    ast.AsyncWith,
    ast.expr,
    ast.keyword,
)


def _lowest_common_ancestor(facts: Facts, first: ast.AST, second: ast.AST) -> ast.AST | None:
    chain = []
    current: ast.AST | None = first
    while current is not None:
        chain.append(current)
        current = facts.parents.get(current)
    current = second
    while current is not None:
        if any(current is item for item in chain):
            return current
        current = facts.parents.get(current)
    return None


def _path_unconditional(facts: Facts, node: ast.AST, ancestor: ast.AST) -> bool:
    current = facts.parents.get(node)
    while current is not None and current is not ancestor:
        if not isinstance(current, _UNCONDITIONAL):
            return False
        current = facts.parents.get(current)
    return current is ancestor
