"""Helpers shared by the train/eval-mode rules (TL201 eval-without-eval-mode, TL202
eval-without-no-grad, TL203 train-mode-not-restored).

Why a module of its own: those rules ask the same questions of a file (which loop evaluates,
which function trains, which model calls an evaluation loop runs, and in which modes), and rule
modules never import one another. It also holds the per-file providers (`facts.get(...)`) that
keep what those questions compute, so `Facts` carries no rule-specific state.
In: `Facts` and nodes. Out: the file's mode analysis, evaluation contexts, the model calls and
helper forwards evaluation runs with their modes, and the providers' memos.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import EVAL_FUNCTION_RE, Facts, FunctionNode
from torchls.analysis.modes import (
    ModeAnalysis,
    _is_mode_call,
    _owning_key,
    analyse_modes,
    owning_model,
    run_key,
)
from torchls.analysis.queries.flow import guard_holds, guard_of
from torchls.analysis.registry import exemption
from torchls.analysis.rules._modes_memos import LoopAssignments, TrainingFunctions


class FileModes:
    """The mode analysis of one file (`analyse_modes`), run once when first asked for and
    shared by TL201-TL203 through `facts.get(FileModes)`."""

    def __init__(self, facts: Facts) -> None:
        self.analysis = analyse_modes(facts)


def modes_of(facts: Facts) -> ModeAnalysis:
    """The mode analysis of this file, computed once and shared by TL201-TL203."""
    return facts.get(FileModes).analysis


def evaluation_context(facts: Facts, call: ast.Call) -> ast.AST | None:
    """The evaluation loop `call` runs in, if any: a loop over a val/test loader, the
    outermost loop of a function named like validate/evaluate/test, or a loop that behaves
    like evaluation whatever its names (see `_evaluates_by_behaviour`). A context that calls
    backward() is training (test-time adaptation, say), not evaluation."""
    loops = facts.enclosing_loops(call)
    if not loops:
        return None
    context = next((loop for loop in loops if facts.batch_loops.get(loop) == "eval"), None)
    if context is None:
        function = facts.enclosing_function(call)
        if function is None:
            return None
        if _function_trains(facts, function):
            return None
        if EVAL_FUNCTION_RE.match(function.name) or _evaluates_by_behaviour(
            facts, call, loops[-1], function
        ):
            context = loops[-1]
        else:
            return None
    if facts.node_reaches(context, facts.is_backward) or _handles_optimizer(facts, context):
        return None
    return context


@exemption("TL201", "neg_backward_inside_scaler_object.py")
def _handles_optimizer(facts: Facts, loop: ast.AST) -> bool:
    """The loop clears gradients or hands an optimizer to something (`optimizer.zero_grad()`,
    `loss_scaler(loss, optimizer)` whose backward is out of sight): it trains. Over a loader
    named for evaluation, a lone `zero_grad()` with nothing stepped and no optimizer handed
    on is a leftover, not training."""
    calls = facts.calls_in(loop)
    leftover = facts.batch_loops.get(loop) == "eval" and not any(
        facts.method_name(call) == "step" for call in calls
    )
    for call in calls:
        if facts.is_zero_grad(call) and not leftover:
            return True
        arguments = [*call.args, *(k.value for k in call.keywords)]
        if any(facts.is_kind(a, "optimizer") for a in arguments if isinstance(a, ast.Name)):
            return True
    return False


def _trainer(facts: Facts):
    """A predicate for what makes a path a training path: backward() or an optimizer step
    (an environment's `env.step(action)` is not one)."""

    def trains(call: ast.Call) -> bool:
        return facts.is_backward(call) or facts.optimizer_of_step(call) is not None

    return trains


@exemption("TL202", "neg_step_method_evals_then_runs_helper.py")
def _function_trains(facts: Facts, function: ast.AST) -> bool:
    """The function holding the model call trains (it, or a helper it calls, runs
    `backward()` or steps an optimizer): its loops are training, not evaluation."""
    # Asked once per function, for every model call in its loops: cached per file.
    cache = facts.get(TrainingFunctions).by_function
    found = cache.get(function)
    if found is None:
        found = cache[function] = facts.node_reaches(function, _trainer(facts))
    return found


def _evaluates_by_behaviour(facts: Facts, call: ast.Call, loop: ast.AST, function: ast.AST) -> bool:
    """A loop that runs the model the way evaluation does, names aside: in a function that
    never trains (no backward, no step) and is never run on a training path (no call of it
    sits in a training loop, or in a step function that backwards), the loop feeds the model
    with what it iterates (`for x, y in data: model(x)`), or feeds the model's outputs back
    into it (greedy decoding: `y = model.decoder(y, state)` around the loop). What it
    iterates includes what the body builds from it first (`x = dataset[i]`)."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)) or _on_training_path(
        facts, function, loader=loop in facts.batch_loops
    ):
        return False
    targets = _derived_from_target(facts, loop, call)
    arguments = [*call.args, *(k.value for k in call.keywords)]
    names = {n.id for a in arguments for n in ast.walk(a) if isinstance(n, ast.Name)}
    if targets & names:
        return True
    scope = facts.scope(call)
    for name in names:
        for assignment in facts.assignments_of(name, scope):
            statement = assignment.stmt
            if (
                assignment.value is not None
                and statement.lineno > call.lineno
                and facts.is_inside(statement, loop)
                and any(
                    facts.is_inside(forward, loop)
                    for forward in facts.graph_forwards(assignment.value)
                )
            ):
                return True  # flows around the loop's back edge into the next call
    return False


def _derived_from_target(facts: Facts, loop: ast.For | ast.AsyncFor, call: ast.Call) -> set[str]:
    """The loop's target names, and the names the loop body binds before `call` from values
    built on them (`x = dataset[i].unsqueeze(0)`, `idx = order[i : i + size]`): what the
    loop iterates, as it reaches the model."""
    names = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    bindings = [
        node
        for node in facts.get(LoopAssignments).of(loop)
        if (node.lineno, node.col_offset) < (call.lineno, call.col_offset)
        and facts.scope(node) is facts.scope(call)
    ]
    flows: list[tuple[ast.expr, list[ast.expr]]] = []
    for node in bindings:
        if node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            flows.append((node.value, list(targets)))
    # A nested loop around `call` over what the loop builds (`for batch in batches(split)`
    # inside `for split in splits`): its target carries the outer loop's data on.
    flows.extend(
        (inner.iter, [inner.target])
        for inner in facts.enclosing_loops(call)
        if inner is not loop
        and isinstance(inner, (ast.For, ast.AsyncFor))
        and facts.is_inside(inner, loop)
    )
    for _ in range(3):  # a chain of a few assignments is enough
        grown = False
        for value, targets in flows:
            if not any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(value)):
                continue
            for target in targets:
                for bound in ast.walk(target):
                    if isinstance(bound, ast.Name) and bound.id not in names:
                        names.add(bound.id)
                        grown = True
        if not grown:
            break
    return names


@exemption("TL201", "neg_inference_helper_inside_training.py")
def _on_training_path(
    facts: Facts, function: ast.AST, depth: int = 0, loader: bool = False
) -> bool:
    """Some call of `function` runs inside a training loop, or in a step function that
    trains, directly or through its callers: an inference helper used while training. For
    a helper looping over a data loader (`loader`), a call in an epoch loop after its batch
    loop, whose result that training does not read, is no part of training
    (`_trains_alongside`): validation between epochs."""
    if depth > 3:
        return True
    for site in facts.call_sites(function):  # type: ignore[arg-type]
        if any(
            _trains_alongside(facts, loop, site) if loader else loop in facts.training_loops
            for loop in facts.enclosing_loops(site)
        ):
            return True
        caller = facts.enclosing_function(site)
        if caller is None:
            continue
        loops_in_caller = any(facts.is_inside(loop, caller) for loop in facts.loops)
        if not loops_in_caller and _function_trains(facts, caller):
            return True  # a step function that backwards
        if _on_training_path(facts, caller, depth + 1, loader):
            return True
    return False


@exemption("TL201", "neg_generate_helper_in_train_mode.py")
def _trains_alongside(facts: Facts, loop: ast.AST, site: ast.Call) -> bool:
    """`loop` trains in the iterations that run `site`: some backward or optimizer step (or
    an in-file helper that does one) sits in `loop` outside every nested loop that leaves
    `site` out, or in such a nested loop that reads what `site` returned. `validate(model)`
    after an epoch's batch loop is no part of the batches' training; `feats = extract(model,
    x)` beside their backward() is, and so is `pseudo = predict(model, loader)` before a
    batch loop over `pseudo`."""
    trains = _trainer(facts)
    statement = facts.enclosing_statement(site)
    bound = {
        n.id
        for target in getattr(statement, "targets", ())
        for n in ast.walk(target)
        if isinstance(n, ast.Name)
    }
    for call in facts.calls_in(loop):
        called = facts.called_function(call)
        if not (trains(call) or (called is not None and _function_trains(facts, called))):
            continue
        inner = [other for other in facts.enclosing_loops(call) if facts.is_inside(other, loop)]
        apart = [other for other in inner if other is not loop and not facts.is_inside(site, other)]
        if not apart:
            return True
        if any(isinstance(n, ast.Name) and n.id in bound for n in ast.walk(apart[-1])):
            return True  # `pseudo = predict(model, loader)`, then a batch loop trains on it
    return False


def _model_calls_in_eval(facts: Facts) -> Iterator[tuple[ast.Call, ast.AST, str, frozenset]]:
    seen: set[tuple[int, str]] = set()
    analysis = modes_of(facts)
    for call, modes in sorted(
        analysis.at_call.items(), key=lambda i: (i[0].lineno, i[0].col_offset)
    ):
        context = evaluation_context(facts, call)
        key = run_key(facts, call)
        if context is None or key is None:
            continue
        owner = owning_model(facts, call) if key not in analysis._possible_keys else None
        key = facts.key(owner) or key if owner is not None else key  # `model` for `model.pi(x)`
        # One finding per model and loop: its submodules and methods run in its mode.
        model = key if key in analysis._possible_keys else _owning_key(key, analysis._possible_keys)
        if (id(context), model or key) in seen:
            continue
        seen.add((id(context), model or key))
        yield call, context, key, modes


def _evaluating_calls(
    facts: Facts,
) -> Iterator[tuple[ast.Call, FunctionNode, str, ast.expr, dict[str, frozenset]]]:
    """(site, helper, parameter, argument, entry modes) for each call that runs a helper's
    loop as evaluation by a constant argument (`run_epoch(..., train=False)`), in line
    order: what TL201 and TL202 ask of a loop shared by training and evaluation."""
    analysis = modes_of(facts)
    for site, entry in sorted(analysis.evaluating_entry.items(), key=lambda i: i[0].lineno):
        function = facts.called_function(site)
        if function is None:
            continue
        found = next((f for f in facts.evaluating_sites(function) if f[0] is site), None)
        if found is not None:
            yield site, function, found[1], found[2], entry


@exemption("TL201", "neg_shared_loop_switches_mode_by_flag.py")
def _switched_to_eval_by_flag(
    facts: Facts, function: FunctionNode, key: str, param: str, argument: ast.expr
) -> bool:
    """The helper itself puts `key` in eval mode under a test of `param` that the site's
    constant `argument` passes (`if is_train: net.train() else: net.eval()`)."""
    if not isinstance(argument, ast.Constant):
        return False
    for call in facts.calls_in(function):
        method = facts.method_name(call)
        evaluates = (method == "eval" and not call.args) or (
            method == "train"
            and len(call.args) == 1
            and isinstance(call.args[0], ast.Constant)
            and call.args[0].value is False
        )
        if not evaluates or facts.key(facts.receiver(call)) != key:
            continue
        child: ast.AST = call
        current = facts.parents.get(call)
        while current is not None and current is not function:
            if isinstance(current, ast.If):
                guard = guard_of(facts, function, current.test, child in current.body)
                if guard is not None and guard[0] == param:
                    if guard_holds(guard, argument.value):
                        return True
                    break
            child, current = current, facts.parents.get(current)
    return False


NestedForward = tuple[
    ast.Call, ast.AST, FunctionNode, ast.Call, FunctionNode, ast.Call, str, frozenset
]


def _nested_helper_forwards(facts: Facts) -> Iterator[NestedForward]:
    """(site, loop, step, inner, helper, forward, key, modes): a batch loop calls a step
    method that switches the model's mode itself and then runs it through a further in-file
    helper (`self.module_.eval()`, then `y = self.infer(x)`, whose body calls
    `self.module_(x)`), with the modes the model is in when the step calls that helper. Neither
    the step nor the helper trains, and the helper switches no mode. The loop is evaluation
    when `evaluation_context` says so, or when the step puts the model in eval() itself, the
    loop feeds it what it iterates, and neither the loop nor its function trains directly."""
    analysis = modes_of(facts)
    seen: set[tuple[int, str]] = set()
    for site in sorted(analysis.site_entry, key=lambda c: (c.lineno, c.col_offset)):
        step = facts.called_function(site)
        if step is None or not facts.enclosing_loops(site) or _function_trains(facts, step):
            continue
        evaluated = {
            facts.key(facts.receiver(call))
            for call in facts.calls_in(step)
            if facts.method_name(call) == "eval" and not call.args and not call.keywords
        }
        if not evaluated:
            continue  # a step that switches no mode is `_helper_forwards_in_evaluation`'s
        context = evaluation_context(facts, site) or _evaluating_step_loop(facts, site)
        if context is None:
            continue
        for inner in facts.calls_in(step):
            helper = facts.called_function(inner)
            entry = analysis.site_entry.get(inner)
            if helper is None or not entry or helper is step:
                continue
            if facts.function_reaches(helper, _is_mode_call) or _function_trains(facts, helper):
                continue
            for call in facts.calls_in(helper):
                key = run_key(facts, call)
                if call not in analysis.at_call or key not in entry or key not in evaluated:
                    continue
                if any(facts.is_inside(loop, helper) for loop in facts.enclosing_loops(call)):
                    continue
                if (id(context), key) in seen:
                    continue
                seen.add((id(context), key))
                yield site, context, step, inner, helper, call, key, entry[key]


def _evaluating_step_loop(facts: Facts, site: ast.Call) -> ast.AST | None:
    """The innermost loop around `site` when it passes the step what it iterates
    (`for xb, yb in batches: self.validation_step(xb, yb)`) and neither the loop nor the
    function around it backwards, steps or clears an optimizer itself (a rollout whose
    outputs a later backward() uses is training)."""
    loop = facts.enclosing_loops(site)[0]  # the innermost
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return None
    targets = _derived_from_target(facts, loop, site)
    arguments = [*site.args, *(k.value for k in site.keywords)]
    if not any(isinstance(n, ast.Name) and n.id in targets for a in arguments for n in ast.walk(a)):
        return None
    if facts.node_reaches(loop, facts.is_backward) or _handles_optimizer(facts, loop):
        return None
    function = facts.enclosing_function(site)
    trains = _trainer(facts)
    if function is not None and any(trains(call) for call in facts.calls_in(function)):
        return None
    return loop
