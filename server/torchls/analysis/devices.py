"""Where a script puts its model: whether it can run without CUDA at all.

In: `Facts`. Out: `cuda_only_scopes` — the scopes (module level or a function) that move a model
to CUDA unconditionally (`model.cuda()`, `.to("cuda")`, `.to(torch.device("cuda:0"))`, a
`device = "cuda"` passed to `.to()`), so any code there fails on a CPU-only machine anyway;
and `mentions_cuda`, whether the file refers to CUDA at all. Shared by the facts
(`Facts.requires_cuda`, `Facts.mentions_cuda`) and the checkpoint rules.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchls.analysis.facts import Facts

MAX_DEPTH = 3
_BRANCHING = (ast.If, ast.IfExp, ast.Try, ast.BoolOp, ast.Match)


def is_cuda_device(facts: Facts, expr: ast.AST | None, depth: int = 0) -> bool:
    """`"cuda"`, `"cuda:1"`, `torch.device("cuda")`, or a name bound to one of those (a
    conditional `"cuda" if available else "cpu"` is not)."""
    if expr is None or depth > MAX_DEPTH:
        return False
    if isinstance(expr, ast.Constant):
        return isinstance(expr.value, str) and expr.value.split(":")[0] == "cuda"
    if isinstance(expr, ast.Call) and facts.call_qualname(expr) == "torch.device" and expr.args:
        return is_cuda_device(facts, expr.args[0], depth + 1)
    if isinstance(expr, ast.Name):
        return is_cuda_device(facts, facts.binding_value(expr), depth + 1)
    return False


def _unconditional(facts: Facts, node: ast.AST) -> bool:
    """Nothing between `node` and its scope decides whether it runs."""
    current = facts.parents.get(node)
    while current is not None and not isinstance(
        current, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Module)
    ):
        if isinstance(current, _BRANCHING):
            return False
        current = facts.parents.get(current)
    return True


def _moves_model_to_cuda(facts: Facts, call: ast.Call) -> bool:
    method = facts.method_name(call)
    receiver = facts.receiver(call)
    if method not in ("cuda", "to") or receiver is None or not facts.is_kind(receiver, "model"):
        return False
    if method == "cuda":
        return True
    device = next((k.value for k in call.keywords if k.arg == "device"), None)
    if device is None and call.args:
        device = call.args[0]
    return is_cuda_device(facts, device)


def cuda_only_scopes(facts: Facts) -> set[ast.AST]:
    """Scopes that move a model to CUDA on every run through them."""
    scopes: set[ast.AST] = set()
    for call in facts.method_calls("cuda", "to"):
        if _moves_model_to_cuda(facts, call) and _unconditional(facts, call):
            scopes.add(facts.scope(call))
    return scopes


def requires_cuda(facts: Facts, node: ast.AST) -> bool:
    """`node` runs where the script cannot work without CUDA: its scope moves the model to
    CUDA unconditionally, or module level does, or every in-file caller's scope does."""
    scopes = facts.cuda_only_scopes
    if not scopes:
        return False
    scope = facts.scope(node)
    if scope in scopes or facts.tree in scopes:
        return True
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        sites = facts.call_sites(scope)
        return bool(sites) and all(facts.scope(site) in scopes for site in sites)
    return False


def mentions_cuda(facts: Facts) -> bool:
    """The file refers to CUDA somewhere: `.cuda()`, a `"cuda"` string, `torch.cuda.*`."""
    for nodes in facts.scope_nodes.values():
        for node in nodes:
            if isinstance(node, ast.Attribute) and node.attr == "cuda":
                return True
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value.split(":")[0] == "cuda":
                    return True
    return False
