"""Per-file memos of the train/eval-mode rules, kept by `facts.get(...)` providers so `Facts`
carries no rule-specific state.

In: the file's `Facts` (unused beyond construction). Out: empty tables that TL201-TL203 fill
as they answer (which functions train, which calls and forwards a training loop backwards).
"""

from __future__ import annotations

import ast

from torchls.analysis.facts import Facts


class TrainingFunctions:
    """Per file: whether each function asked about trains (`_function_trains`), so the
    question is answered once per function, however many model calls its loops hold."""

    def __init__(self, facts: Facts) -> None:
        self.by_function: dict[ast.AST, bool] = {}


class BackpropagatedCalls:
    """Per file: for each training loop TL203 asks about, the calls whose value a backward()
    of the loop runs through (filled by TL203's `_backpropagated_calls`)."""

    def __init__(self, facts: Facts) -> None:
        self.by_loop: dict[ast.AST, set[ast.Call]] = {}


class TrainingForwards:
    """Per file: for each training loop TL203 asks about, the forward passes whose graph a
    backward() of the loop runs through (filled by TL203's `_trains_forward`)."""

    def __init__(self, facts: Facts) -> None:
        self.by_loop: dict[ast.AST, set[ast.Call]] = {}
