"""Forwards an evaluation loop runs through in-file helpers shared with training: the model
call inside `self._forward_pass(x, y)` (or two helpers down, `self.total_loss(b)` ->
`self.part_loss(b)`), with the modes the model is in at the loop's call of the helper. Read
by TL201 and TL202.

In: `Facts` and their mode analysis. Out: (site, loop, helper, forward, key, modes).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts, FunctionNode
from torchls.analysis.modes import _is_mode_call, model_part_key, run_key
from torchls.analysis.rules._modes import _function_trains, evaluation_context, modes_of


def _helper_forwards_in_evaluation(
    facts: Facts,
) -> Iterator[tuple[ast.Call, ast.AST, FunctionNode, ast.Call, str, frozenset]]:
    """(site, loop, helper, forward, key, modes): an evaluation loop runs a model through an
    in-file helper shared with training (`output, loss = self._forward_pass(x, y)`, whose
    body calls `self.model(x)`), with the modes the model is in when that site calls it. The
    helper itself switches no mode and trains nothing, and its forward sits in no loop of
    its own (a helper looping over a loader is judged as an evaluation loop by itself)."""
    analysis = modes_of(facts)
    seen: set[tuple[int, str]] = set()
    for site, entry in sorted(analysis.site_entry.items(), key=lambda i: i[0].lineno):
        if not entry:
            continue
        function = facts.called_function(site)
        if function is None or facts.function_reaches(function, _is_mode_call):
            continue
        context = evaluation_context(facts, site)
        if context is None or _function_trains(facts, function):
            continue
        for call, key in _forwards_through_helpers(facts, function, entry):
            if (id(context), key) in seen:
                continue
            seen.add((id(context), key))
            yield site, context, function, call, key, entry[key]


def _forwards_through_helpers(
    facts: Facts, function: FunctionNode, entry: dict[str, frozenset], depth: int = 0
) -> Iterator[tuple[ast.Call, str]]:
    """(call, key) for each call in `function` that runs a module of `entry` (a submodule or
    a method of one, `self.net.encoder(x)`, runs in that module's mode), also inside the
    `self.` helpers it calls in turn (`self.total_loss(b)` -> `self.part_loss(b)`), which
    switch no mode and train nothing; not a call in a loop of the helper's own."""
    analysis = modes_of(facts)
    for call in facts.calls_in(function):
        if any(facts.is_inside(loop, function) for loop in facts.enclosing_loops(call)) and (
            depth == 0 or evaluation_context(facts, call) is not None
        ):
            continue  # the helper's own loop over a loader is judged by itself
        key = run_key(facts, call)
        if key is not None and key not in entry:
            key = model_part_key(facts, call, key, entry)
        if key is not None and analysis.at_call.get(call) is not None:
            yield call, key
            continue
        func = call.func
        if depth >= 2 or not (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "self"
        ):
            continue
        nested = facts.called_function(call)
        if (
            nested is None
            or nested is function
            or nested.decorator_list  # `@torch.no_grad()` on the inner helper, maybe
            or facts.in_no_grad(call)
            or facts.function_reaches(nested, _is_mode_call)
            or _function_trains(facts, nested)
        ):
            continue
        inherited = {k: v for k, v in entry.items() if k.startswith("self.")}
        if inherited:
            yield from _forwards_through_helpers(facts, nested, inherited, depth + 1)
