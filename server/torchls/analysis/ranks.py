"""Which conditions single out some processes of a distributed run, and which hold on all.

In: `Facts` and a condition. Out: whether the condition's truth differs between ranks
(`rank_dependent`: `rank == 0`, `local_rank in (-1, 0)`, `is_main_process()`, `rank % 8 == 0`)
or is the same on every rank (`local_rank != -1` and `world_size > 1` mean "distributed mode",
`dist.is_initialized()` is true everywhere), plus a loose `mentions_rank` for rules that must
stay quiet whenever a process might be singled out. Shared by the facts
(`Facts.rank_dependent`, `Facts.restricts_ranks`) and the TL8xx rules.

A rank is never negative: -1 is the "not distributed" sentinel, so comparing a rank with -1
(or any negative number) gives the same answer on every rank of a distributed run.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torchls.analysis.facts import Facts

MAX_DEPTH = 3
# `torch.distributed` collectives: every rank of the group must call them. Vocabulary shared by
# the function summaries (which helpers reach one) and the TL8xx rules.
COLLECTIVES = {
    "barrier",
    "monitored_barrier",
    "all_reduce",
    "all_gather",
    "all_gather_object",
    "all_gather_into_tensor",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "all_to_all",
    "all_to_all_single",
}
COLLECTIVE_QUALNAMES = {f"torch.distributed.{name}" for name in COLLECTIVES}
# Names that hold a process's rank.
RANK_NAME_RE = re.compile(
    r"^(rank|local_rank|global_rank|world_rank|node_rank|ddp_rank|ddp_local_rank|proc_rank|"
    r"process_rank|rank_id|my_rank|dist_rank|gpu_rank|process_index|local_process_index)$",
    re.IGNORECASE,
)
RANK_CALLS = {"get_rank", "get_local_rank", "get_global_rank", "get_node_local_rank", "get_ordinal"}
RANK_VARIABLES = ("RANK", "LOCAL_RANK")
# The number of processes: the same on every rank.
WORLD_SIZE_NAME_RE = re.compile(
    r"^(world_size|local_world_size|ddp_world_size|num_processes|num_replicas|nprocs|"
    r"n_gpus|ngpus|num_gpus)$",
    re.IGNORECASE,
)
WORLD_SIZE_CALLS = {"get_world_size", "get_local_world_size", "device_count"}
WORLD_SIZE_VARIABLES = ("WORLD_SIZE", "LOCAL_WORLD_SIZE")
# Names that are true on one process only (a call or a boolean).
MAIN_FLAG_RE = re.compile(
    r"^_?(is_)?(main|master|main_process|master_process|local_main_process|global_zero|"
    r"local_zero|rank_zero|rank0|chief|primary|leader|master_proc|main_proc|master_ordinal|"
    r"first_worker|local_master|main_worker_process)$",
    re.IGNORECASE,
)
# Loose vocabulary: a condition mentioning these may well single out one process.
LOOSE_RANK_RE = re.compile(
    r"rank|master|main_process|is_main|main_proc|global_zero|local_zero|rank_zero|primary|chief|"
    r"leader|process_index|ordinal|first_worker|distributed|ddp|world_size|is_initialized|"
    r"^(gpu|gpu_id|local_gpu|device_id|proc_id|process_id)$",
    re.IGNORECASE,
)


def identifier(expr: ast.AST) -> str | None:
    """The last name of `expr`: `rank`, `args.local_rank` → `local_rank`, `get_rank()`."""
    if isinstance(expr, ast.Call):
        expr = expr.func
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        return expr.attr
    return None


def is_rank_value(facts: Facts, expr: ast.AST, depth: int = 0) -> bool:
    """`rank`, `args.local_rank`, `dist.get_rank()`, `int(os.environ["RANK"])`,
    `rank % ngpus_per_node`, or a name bound to one of those."""
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mod):
        return is_rank_value(facts, expr.left, depth)
    return _names_value(facts, expr, depth, RANK_VARIABLES, RANK_CALLS, RANK_NAME_RE, is_rank_value)


def _is_world_size(facts: Facts, expr: ast.AST, depth: int = 0) -> bool:
    return _names_value(
        facts,
        expr,
        depth,
        WORLD_SIZE_VARIABLES,
        WORLD_SIZE_CALLS,
        WORLD_SIZE_NAME_RE,
        _is_world_size,
    )


def _names_value(
    facts: Facts,
    expr: ast.AST,
    depth: int,
    variables: Any,
    calls: Any,
    name_re: re.Pattern[str],
    again: Callable[[Facts, ast.AST, int], bool],
) -> bool:
    """`expr` is the value these names stand for: read from the environment variables, returned
    by one of the calls, `int(...)` of such a value, a matching name, or a name bound to one."""
    if _environ(expr, variables):
        return True
    if isinstance(expr, ast.Call):
        if identifier(expr) in calls:
            return True
        if isinstance(expr.func, ast.Name) and expr.func.id == "int" and expr.args:
            return again(facts, expr.args[0], depth)
        return False
    name = identifier(expr)
    if name is not None and name_re.match(name):
        return True
    if isinstance(expr, ast.Name) and depth < MAX_DEPTH:
        value = facts.binding_value(expr)
        if value is not None:
            return again(facts, value, depth + 1)
    return False
    name = identifier(expr)
    if name is not None and WORLD_SIZE_NAME_RE.match(name):
        return True
    if isinstance(expr, ast.Name) and depth < MAX_DEPTH:
        value = facts.binding_value(expr)
        if value is not None:
            return _is_world_size(facts, value, depth + 1)
    return False


def _environ(expr: ast.AST, names: tuple[str, ...]) -> bool:
    """`os.environ["RANK"]` / `os.environ.get("LOCAL_RANK", ...)` / `os.getenv("RANK")`."""
    key = None
    if isinstance(expr, ast.Subscript):
        key = expr.slice
    elif isinstance(expr, ast.Call) and expr.args and identifier(expr) in ("get", "getenv"):
        key = expr.args[0]
    return isinstance(key, ast.Constant) and key.value in names


def _number(expr: ast.AST) -> int | float | None:
    """The value of a numeric literal (`0`, `-1`, `"0"` as read from the environment)."""
    sign = 1
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, (ast.USub, ast.UAdd)):
        sign = -1 if isinstance(expr.op, ast.USub) else 1
        expr = expr.operand
    if not isinstance(expr, ast.Constant) or isinstance(expr.value, bool):
        return None
    value = expr.value
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            return None
    return sign * value if isinstance(value, (int, float)) else None


def _constant_like(expr: ast.AST) -> bool:
    if isinstance(expr, ast.Constant):
        return True
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.operand, ast.Constant):
        return True
    if isinstance(expr, (ast.Tuple, ast.List, ast.Set)):
        return all(_constant_like(e) for e in expr.elts)
    return False


_MIRRORED: dict[type, type] = {ast.Lt: ast.Gt, ast.Gt: ast.Lt, ast.LtE: ast.GtE, ast.GtE: ast.LtE}


def _splits_ranks(op: ast.cmpop, other: ast.AST, facts: Facts) -> bool:
    """`rank <op> other` is true on some ranks (0, 1, 2, ...) and false on others."""
    if isinstance(op, (ast.In, ast.NotIn)):
        if not isinstance(other, (ast.Tuple, ast.List, ast.Set)):
            return not _is_world_size(facts, other)  # `rank in ranks_to_log`
        for element in other.elts:
            value = _number(element)
            if value is not None and value >= 0:
                return True
            if value is None and not _constant_like(element):
                return True
        return False  # `local_rank in (-1,)`, `rank not in (None,)`
    if not _constant_like(other):
        # `rank == src`, `rank < n`: another value picks some ranks out; the world size does
        # not (`rank < world_size` holds everywhere).
        return not _is_world_size(facts, other) and not is_rank_value(facts, other)
    value = _number(other)
    if value is None:
        return False  # `rank is None`, `rank == "cpu"`: not a split between ranks
    if isinstance(op, (ast.Eq, ast.NotEq, ast.Is, ast.IsNot, ast.LtE, ast.Gt)):
        return value >= 0
    if isinstance(op, (ast.Lt, ast.GtE)):
        return value > 0
    return False


def rank_dependent(facts: Facts, test: ast.AST, depth: int = 0) -> bool:
    """True when `test` holds on some ranks only: `rank == 0`, `dist.get_rank() != 0`,
    `args.local_rank in [-1, 0]`, `rank % 8 == 0`, `rank < n`, `is_main_process()`,
    `accelerator.is_main_process`, `master_process` (bound to `ddp_rank == 0`), `not` of one
    of these. `local_rank != -1`, `world_size > 1` and `dist.is_initialized()` hold on every
    rank alike and are not rank tests."""
    if depth > MAX_DEPTH:
        return False
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return rank_dependent(facts, test.operand, depth + 1)
    if not isinstance(test, (ast.BinOp, ast.Compare)) and is_rank_value(facts, test):
        return True  # `if local_rank:` runs on the non-zero ranks
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        op, left, right = test.ops[0], test.left, test.comparators[0]
        if is_rank_value(facts, left):
            return _splits_ranks(op, right, facts)
        if is_rank_value(facts, right) and not isinstance(op, (ast.In, ast.NotIn)):
            mirrored = _MIRRORED.get(type(op), type(op))()
            return _splits_ranks(mirrored, left, facts)
        return False
    name = identifier(test)
    if name is not None and MAIN_FLAG_RE.match(name):
        return True
    if isinstance(test, ast.Name):
        value = facts.binding_value(test)
        if value is not None and not isinstance(value, ast.Name):
            return rank_dependent(facts, value, depth + 1)
    return False


def restricts_ranks(facts: Facts, test: ast.AST) -> bool:
    """The body of `if test:` runs on a subset of ranks (`and` keeps the restriction)."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return any(restricts_ranks(facts, value) for value in test.values)
    return rank_dependent(facts, test)


def mentions_rank(facts: Facts, expr: ast.AST) -> bool:
    """Loose: the expression mentions anything that might single out a process."""
    for node in ast.walk(expr):
        name = identifier(node) if isinstance(node, (ast.Name, ast.Attribute, ast.Call)) else None
        if name is not None and LOOSE_RANK_RE.search(name):
            return True
        if isinstance(node, ast.Name) and rank_dependent(facts, node):
            return True
    return False
