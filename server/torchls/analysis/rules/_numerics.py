"""Helpers shared by TL502 (log of a softmax) and TL503 (log without a guard): which calls
are a natural log, and what they take the log of.

In: `Facts` and calls. Out: the `torch.log(x)` / `x.log()` calls of the file, and `x`.
"""

from __future__ import annotations

import ast

from torchls.analysis.facts import Facts

LOG_FUNCTIONS = {"torch.log"}


def _log_calls(facts: Facts) -> list[ast.Call]:
    methods = [c for c in facts.method_calls("log") if facts.call_qualname(c) is None]
    return [*facts.calls_to(*LOG_FUNCTIONS), *methods]


def _log_argument(facts: Facts, call: ast.Call) -> ast.expr | None:
    if facts.call_qualname(call) in LOG_FUNCTIONS and call.args:
        return call.args[0]
    if facts.call_qualname(call) is None and facts.method_name(call) == "log" and not call.args:
        return facts.receiver(call)
    return None
