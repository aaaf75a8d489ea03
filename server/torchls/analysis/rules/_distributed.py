"""What the torch.distributed rules (TL801-TL803) share: the rank-zero decorators and how deep
they follow call sites and names.

In: a function node, a file's `Facts`. Out: whether a decorator such as `@rank_zero_only` makes
it run on rank 0 only (TL801, TL803), `wraps_ddp_through_helper` (a call of a project helper
that surely wraps the model in DDP: TL803), `RankExits` (per function, the rank tests that
leave it early, found once: TL803), and `MAX_DEPTH`, the bound on the callers and bindings
TL803 follows (TL802's loader tracing, in `_distributed_samplers`, allows twice as many steps),
and `multi_process_accelerator` (an `accelerate.Accelerator` asked which process it runs in: TL803).
"""

from __future__ import annotations

import ast

from torchls.analysis.facts import Facts, FunctionNode
from torchls.analysis.ranks import identifier, mentions_rank

RANK_ZERO_DECORATORS = {
    "rank_zero_only",
    "master_only",
    "main_process_only",
    "on_main_process",
    "on_local_main_process",
    "on_rank_0",
    "rank_zero",
}
MAX_DEPTH = 3


def _decorated_rank_zero(function: FunctionNode) -> bool:
    for decorator in function.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if identifier(target) in RANK_ZERO_DECORATORS:
            return True
    return False


class RankExits:
    """Per function of one file, the `if <rank test>:` statements whose body leaves it
    (`return`, `raise`, `continue`, `break`): found once per function, since every save and
    call below them asks."""

    def __init__(self, facts: Facts) -> None:
        self.facts = facts
        self._by_function: dict[FunctionNode, list[ast.If]] = {}
        # `_saves_below` answers, by (function, depth), for the calls that reach them again.
        self.saves_below: dict[tuple[FunctionNode, int], list[tuple[Facts, ast.Call]]] = {}

    def of(self, function: FunctionNode) -> list[ast.If]:
        found = self._by_function.get(function)
        if found is None:
            exits = (ast.Return, ast.Raise, ast.Continue, ast.Break)
            found = self._by_function[function] = [
                stmt
                for stmt in self.facts.walk_local(function)
                if isinstance(stmt, ast.If)
                and mentions_rank(self.facts, stmt.test)
                and any(isinstance(s, exits) for body in stmt.body for s in ast.walk(body))
            ]
        return found


def wraps_ddp_through_helper(facts: Facts) -> bool:
    """A call here of a project helper that surely wraps the model in DDP: always, or by a
    switch the call sets to a true constant (`prepare(model, distributed=True)` whose body,
    or a helper it passes the flag to, runs `if distributed: model = DDP(model)`)."""
    for call in facts.calls:
        target = facts.callee(call)
        if target is None:
            continue
        owner, function, method = target
        if owner.summary(function).wraps_ddp_at(call, method):
            return True
    return False


# What an `accelerate.Accelerator` tells about the process it runs in, or does across all of
# them: code that asks it is written for a multi-process launch.
ACCELERATOR_PROCESS_API = {
    "is_main_process",
    "is_local_main_process",
    "process_index",
    "local_process_index",
    "num_processes",
    "wait_for_everyone",
}

ACCELERATOR_CLASSES = {"accelerate.Accelerator", "accelerate.accelerator.Accelerator"}


def multi_process_accelerator(facts: Facts) -> bool:
    """The file binds an `accelerate.Accelerator(...)` to a name or attribute and asks that
    same object which process it is, or waits for the others (`self.accelerator =
    Accelerator()` ... `if self.accelerator.is_main_process:`): the script is written for
    `accelerate launch` on several processes, and a plain `torch.save` runs on each."""
    bound: set[str] = set()
    for call in facts.calls:
        if facts.call_qualname(call) not in ACCELERATOR_CLASSES:
            continue
        parent = facts.enclosing_statement(call)
        if isinstance(parent, ast.Assign) and parent.value is call:
            bound.update(ast.unparse(target) for target in parent.targets)
    if not bound:
        return False
    for node in ast.walk(facts.tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in ACCELERATOR_PROCESS_API
            and ast.unparse(node.value) in bound
        ):
            return True
    return False
