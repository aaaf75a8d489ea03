"""What the torch.distributed rules (TL801-TL803) share: the rank-zero decorators and how deep
they follow call sites and names.

In: a function node. Out: whether a decorator such as `@rank_zero_only` makes it run on rank 0
only (TL801, TL803), and `MAX_DEPTH`, the bound on the callers and bindings TL803 follows
(TL802's loader tracing, in `_distributed_samplers`, allows twice as many steps).
"""

from __future__ import annotations

import ast

from torchls.analysis.facts import FunctionNode
from torchls.analysis.ranks import identifier

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
