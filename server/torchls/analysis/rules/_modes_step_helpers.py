"""Training forwards one call away for TL203 train-mode-not-restored: a batch loop that hands
each batch to an in-file step helper (`self._train_step(x, y)`), whose body runs the model
and backwards, while something later in the same loop (a validation every N batches, a metric
pass) leaves that model in eval mode for the next iteration's step.

Why a module of its own: the TL203 rule module is near its size limit, and the question (which
helper calls of a training loop run a training forward, and in which modes the model reaches
that forward from this call) is a topic of its own. In: `Facts` and the file's mode analysis.
Out: (site, model, modes, training loops) records in the shape of TL203's own uses.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts, FunctionNode
from torchls.analysis.modes import ModeFact, run_key, run_module, runs_generation
from torchls.analysis.rules._modes import _function_trains, modes_of


def forwards_in_step_helpers(
    facts: Facts,
) -> Iterator[tuple[ast.Call, ast.expr, frozenset[ModeFact], list]]:
    """(site, model, modes, loops): a call in a training loop runs an in-file function that
    trains (backward or an optimizer step, itself or below) and runs a model outside
    `no_grad` and outside any loop of its own; `modes` are the modes that model is in at that
    forward which this site handed in (what the helper switches before the forward, a
    `self.model.train()` as its first statement, replaces them). `model` names the module
    in the caller's terms: the same `self` attribute for a method of the caller's own
    object, or the argument the caller passes for a parameter."""
    analysis = modes_of(facts)
    for site, entry in analysis.site_entry.items():
        if not entry:
            continue
        loops = [loop for loop in facts.enclosing_loops(site) if loop in facts.training_loops]
        if not loops:
            continue
        function = facts.called_function(site)
        if function is None or not _function_trains(facts, function):
            continue
        seen: set[str] = set()
        for call in facts.calls_in(function):
            key = run_key(facts, call)
            if key is None or key in seen or key not in entry:
                continue
            reached = analysis.at_call.get(call)
            if reached is None or facts.in_no_grad(call) or runs_generation(facts, call):
                continue
            if facts.enclosing_loops(call):
                continue  # a loop of the helper's own is judged as a training loop by itself
            module = run_module(call)
            if not facts.trains_model(function, module):
                continue  # a frozen model the helper only reads
            # What survives from the site to the forward; an eval() left by a loop around
            # this one (a retry loop of the caller) is not this loop's to report.
            handed = frozenset(
                fact
                for fact in entry[key] & reached
                if fact.mode != "eval"
                or (fact.setter is not None and facts.is_inside(fact.setter, loops[0]))
            )
            if not any(fact.mode == "eval" for fact in handed):
                continue
            model = _in_caller_terms(facts, site, function, key, module)
            if model is None:
                continue
            seen.add(key)
            yield site, model, handed, loops


def _in_caller_terms(
    facts: Facts, site: ast.Call, function: FunctionNode, key: str, module: ast.expr
) -> ast.expr | None:
    """The caller's expression for the helper's module `key`: the helper's own `self.net`
    when the site is `self.step(...)` (one object), or the argument bound to the parameter
    `key` names."""
    func = site.func
    on_self = (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id == "self"
    )
    if key.startswith("self."):
        return module if on_self else None
    params = [a.arg for a in [*function.args.posonlyargs, *function.args.args]]
    if params and params[0] == "self" and isinstance(func, ast.Attribute):
        params = params[1:]
    if any(isinstance(a, ast.Starred) for a in site.args):
        return None
    for position, argument in enumerate(site.args):
        if position < len(params) and params[position] == key:
            return argument
    for keyword in site.keywords:
        if keyword.arg == key:
            return keyword.value
    return None
