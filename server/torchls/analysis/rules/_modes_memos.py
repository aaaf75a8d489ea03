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


class LoopAssignments:
    """Per file: the assignments with a value under each loop, in `ast.walk` order. Asked
    for every model call in the loop: one walk of the loop, not one per call."""

    def __init__(self, facts: Facts) -> None:
        self.by_loop: dict[ast.AST, list[ast.Assign | ast.AnnAssign]] = {}

    def of(self, loop: ast.AST) -> list[ast.Assign | ast.AnnAssign]:
        found = self.by_loop.get(loop)
        if found is None:
            found = self.by_loop[loop] = [
                node
                for node in ast.walk(loop)
                if isinstance(node, ast.Assign)
                or (isinstance(node, ast.AnnAssign) and node.value is not None)
            ]
        return found


class GradientClearings:
    """Per file: the nodes that clear gradients in place (`Facts.clears_gradients`: an
    assignment to `.grad`, a `p.grad.zero_()`), found once over the index. `inside(node)`
    says whether one sits under `node` (itself included), the question TL204 asked by walking
    every loop and function it looked at; most files have none, so the answer is immediate."""

    def __init__(self, facts: Facts) -> None:
        self.facts = facts
        assign, call = ast.Assign, ast.Call
        self.nodes = [
            node
            for nodes in facts.scope_nodes.values()
            for node in nodes
            if (type(node) is assign or type(node) is call) and facts.clears_gradients(node)
        ]

    def inside(self, node: ast.AST) -> bool:
        return any(self.facts.is_inside(found, node) for found in self.nodes)
