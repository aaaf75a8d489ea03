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
    CUDA unconditionally, or module level does, or every in-file caller's scope does; or it
    sits in a branch that only runs with CUDA (`cuda_branch`)."""
    if cuda_branch(facts, node):
        return True
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


# Conditions true only where CUDA is there: `torch.cuda.is_available()`, `x.is_cuda`,
# `torch.cuda.device_count() > 0` / `>= 1`, `device.type == "cuda"`, `device == "cuda"`.
def _cuda_test(facts: Facts, test: ast.expr) -> bool:
    if isinstance(test, ast.BoolOp):
        return isinstance(test.op, ast.And) and any(_cuda_test(facts, v) for v in test.values)
    if isinstance(test, ast.Call):
        return facts.call_qualname(test) == "torch.cuda.is_available"
    if isinstance(test, ast.Attribute):
        return test.attr == "is_cuda"
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, op, right = test.left, test.ops[0], test.comparators[0]
        if (
            isinstance(left, ast.Call)
            and facts.call_qualname(left) == "torch.cuda.device_count"
            and isinstance(right, ast.Constant)
            and isinstance(right.value, int)
        ):
            return (isinstance(op, ast.Gt) and right.value >= 0) or (
                isinstance(op, ast.GtE) and right.value >= 1
            )
        if isinstance(op, ast.Eq):  # `device.type == "cuda"`, `args.device == "cuda:0"`
            return any(
                isinstance(side, ast.Constant)
                and isinstance(side.value, str)
                and side.value.split(":")[0] == "cuda"
                for side in (left, right)
            )
    return False


def _loads_with_map_location(
    facts: Facts, statements: list[ast.stmt], load: ast.AST | None
) -> bool:
    """A `torch.load` of the same file as `load` in `statements` maps it to the CPU: the
    CPU case is written there (a map_location to a GPU, `f"cuda:{gpu}"`, says nothing of
    the CPU, nor does a load of another file)."""
    source = _loaded_source(load)
    if source is None:
        return False
    for statement in statements:
        for node in ast.walk(statement):
            if (
                isinstance(node, ast.Call)
                and facts.call_qualname(node) == "torch.load"
                and _loaded_source(node) == source
            ):
                location = next((k.value for k in node.keywords if k.arg == "map_location"), None)
                if location is None and len(node.args) >= 2:
                    location = node.args[1]
                if location is not None and _maps_to_cpu(facts, location):
                    return True
    return False


def _loaded_source(load: ast.AST | None) -> str | None:
    """What a `torch.load` call reads, as a comparable dump of its first argument."""
    if not isinstance(load, ast.Call):
        return None
    first = (
        load.args[0] if load.args else next((k.value for k in load.keywords if k.arg == "f"), None)
    )
    return ast.dump(first) if first is not None else None


def _maps_to_cpu(facts: Facts, location: ast.expr) -> bool:
    """`"cpu"`, `torch.device("cpu")`, or `lambda storage, loc: storage` (keep on the CPU)."""
    if isinstance(location, ast.Constant):
        return location.value == "cpu"
    if isinstance(location, ast.Call) and facts.call_qualname(location) == "torch.device":
        return bool(location.args) and _maps_to_cpu(facts, location.args[0])
    if isinstance(location, ast.Lambda) and location.args.args:
        body = location.body
        return isinstance(body, ast.Name) and body.id == location.args.args[0].arg
    return False


def cuda_branch(facts: Facts, node: ast.AST) -> bool:
    """`node` only runs where CUDA is there: inside `if torch.cuda.is_available():` (or
    another CUDA-only test), in a branch whose other side loads with `map_location` (the
    author wrote the CPU case there; not the `else` of a CUDA test, which is the CPU case),
    or in a branch with a statement that moves the model to CUDA
    (`if opt.gpu: net.cuda(); net.load_state_dict(torch.load(path))`)."""
    child: ast.AST = node
    current = facts.parents.get(node)
    while current is not None and not isinstance(
        current, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Module, ast.ClassDef)
    ):
        if isinstance(current, ast.IfExp):
            if child is current.body and (
                _cuda_test(facts, current.test)
                or _loads_with_map_location(facts, [ast.Expr(current.orelse)], node)
            ):
                return True
            if (
                child is current.orelse
                and not _cuda_test(facts, current.test)
                and _loads_with_map_location(facts, [ast.Expr(current.body)], node)
            ):
                return True
        elif isinstance(current, ast.If):
            if child in current.body:
                if _cuda_test(facts, current.test):
                    return True
                if _loads_with_map_location(facts, current.orelse, node):
                    return True
                if _moved_to_cuda_before(facts, current.body, child):
                    return True
            elif child in current.orelse:
                # The CPU side of a CUDA test is exactly where map_location matters.
                if not _cuda_test(facts, current.test) and _loads_with_map_location(
                    facts, current.body, node
                ):
                    return True
                if _moved_to_cuda_before(facts, current.orelse, child):
                    return True
        child, current = current, facts.parents.get(current)
    return False


def _moved_to_cuda_before(facts: Facts, block: list[ast.stmt], statement: ast.AST) -> bool:
    """A statement of `block` (the branch `statement` runs in) moves a model to CUDA, before
    or after it: that branch cannot run without CUDA (`if opt.gpu: net.cuda(); net.load(...)`,
    or the load first and `encoder.cuda()` right after)."""
    for other in block:
        if isinstance(other, (ast.Expr, ast.Assign)) and isinstance(other.value, ast.Call):
            if _moves_model_to_cuda(facts, other.value):
                return True
    return False
