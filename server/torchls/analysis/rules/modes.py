"""TL2xx: train/eval modes and gradient bookkeeping."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import EVAL_FUNCTION_RE, Facts, FunctionNode
from torchls.analysis.findings import Fix
from torchls.analysis.layers import built_mode_sensitive, mode_sensitive, runs_no_module
from torchls.analysis.modes import ModeAnalysis, _is_mode_call, analyse_modes, built_in_eval_mode
from torchls.analysis.queries.flow import guard_holds, guard_of
from torchls.analysis.queries.tensors import detached_value
from torchls.analysis.queries.vocabulary import argument_at
from torchls.analysis.registry import Hit, rule
from torchls.analysis.rules._edits import (
    delete_statement_line,
    insert_at,
    insert_line_after,
    insert_line_before,
)


def modes_of(facts: Facts) -> ModeAnalysis:
    """The mode analysis of this file, computed once and shared by TL201-TL203."""
    cached = getattr(facts, "_mode_analysis", None)
    if cached is None:
        cached = analyse_modes(facts)
        facts._mode_analysis = cached  # type: ignore[attr-defined]
    return cached


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


def _function_trains(facts: Facts, function: ast.AST) -> bool:
    """`function` (or what it calls) backwards or steps an optimizer; asked once per
    function, for every model call in its loops."""
    cache = getattr(facts, "_function_trains", None)
    if cache is None:
        cache = facts._function_trains = {}  # type: ignore[attr-defined]
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
    if not isinstance(loop, (ast.For, ast.AsyncFor)) or _on_training_path(facts, function):
        return False
    targets = _derived_from_target(facts, loop, call)
    arguments = [*call.args, *(k.value for k in call.keywords)]
    names = {n.id for a in arguments for n in ast.walk(a) if isinstance(n, ast.Name)}
    if targets & names:
        return True
    scope = facts.scope(call)
    for name in names:
        for assignment in facts.assignments_of(name, scope):  # type: ignore[arg-type]
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
        for node in ast.walk(loop)
        if isinstance(node, ast.Assign)
        and (node.lineno, node.col_offset) < (call.lineno, call.col_offset)
        and facts.scope(node) is facts.scope(call)
    ]
    for _ in range(3):  # a chain of a few assignments is enough
        grown = False
        for node in bindings:
            if not any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node.value)):
                continue
            for target in node.targets:
                for bound in ast.walk(target):
                    if isinstance(bound, ast.Name) and bound.id not in names:
                        names.add(bound.id)
                        grown = True
        if not grown:
            break
    return names


def _on_training_path(facts: Facts, function: ast.AST, depth: int = 0) -> bool:
    """Some call of `function` runs inside a training loop, or in a step function that
    trains, directly or through its callers: an inference helper used while training."""
    if depth > 3:
        return True
    for site in facts.call_sites(function):  # type: ignore[arg-type]
        if any(loop in facts.training_loops for loop in facts.enclosing_loops(site)):
            return True
        caller = facts.enclosing_function(site)
        if caller is None:
            continue
        loops_in_caller = any(facts.is_inside(loop, caller) for loop in facts.loops)
        if not loops_in_caller and _function_trains(facts, caller):
            return True  # a step function that backwards
        if _on_training_path(facts, caller, depth + 1):
            return True
    return False


def _model_calls_in_eval(facts: Facts) -> Iterator[tuple[ast.Call, ast.AST, str, frozenset]]:
    seen: set[tuple[int, str]] = set()
    analysis = modes_of(facts)
    for call, modes in sorted(
        analysis.at_call.items(), key=lambda i: (i[0].lineno, i[0].col_offset)
    ):
        context = evaluation_context(facts, call)
        key = facts.key(call.func)
        if context is None or key is None:
            continue
        if (id(context), key) in seen:
            continue
        seen.add((id(context), key))
        yield call, context, key, modes


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
        for call in facts.calls_in(function):
            modes = analysis.at_call.get(call)
            key = facts.key(call.func)
            if modes is None or key is None or key not in entry:
                continue
            if any(facts.is_inside(loop, function) for loop in facts.enclosing_loops(call)):
                continue
            if (id(context), key) in seen:
                continue
            seen.add((id(context), key))
            yield site, context, function, call, key, entry[key]


def _put_in_train_for_this_loop(facts: Facts, context: ast.AST, modes: frozenset) -> bool:
    """Every mode reaching the loop comes from an explicit `train()` that precedes the loop
    (or the `with` block around it) in the same block, with no training in between: the
    author put the model in training mode for this very loop (re-estimating batch-norm
    statistics, a data-dependent initialisation), not for an earlier training loop it forgot
    to switch out of."""
    if not modes:
        return False
    for fact in modes:
        if fact.mode != "train" or not isinstance(fact.setter, ast.Call):
            return False
        if facts.method_name(fact.setter) != "train" or fact.setter.args:
            return False  # a construction (built in train mode) or `train(flag)`: not explicit
        setter = facts.enclosing_statement(fact.setter)
        anchor: ast.AST = context
        while True:
            parent = facts.parents.get(anchor)
            statements = _block_of(parent, anchor)
            if statements is None:
                return False
            if setter in statements:
                break
            if not isinstance(parent, (ast.With, ast.AsyncWith)):
                return False
            anchor = parent
        first, last = statements.index(setter), statements.index(anchor)  # type: ignore[arg-type]
        if first > last:
            return False
        if any(facts.node_reaches(s, facts.is_backward) for s in statements[first + 1 : last]):
            return False
    return True


def _wraps_what_was_evaluated(facts: Facts, call: ast.Call, context: ast.AST) -> bool:
    """`evaluate(sampler, net)` puts `net` in eval() and runs `sampler(x)`: at every call site
    the sampler passed in is a project module built on the very network passed for `net`
    (`GaussianDiffusionSampler(net_model, ...)`), so what runs inside it is in eval mode."""
    func = call.func
    function = facts.enclosing_function(call)
    if not isinstance(func, ast.Name) or function is None:
        return False
    params = {a.arg for a in [*function.args.posonlyargs, *function.args.args]}
    evaluated = set()
    for switch in facts.calls_in(function):
        receiver = facts.receiver(switch)
        if (
            facts.method_name(switch) == "eval"
            and not switch.args
            and switch.lineno < getattr(context, "lineno", 0)
            and isinstance(receiver, ast.Name)
            and receiver.id in params
            and receiver.id != func.id
        ):
            evaluated.add(receiver.id)
    sites = facts.call_sites(function)
    if func.id not in params or not evaluated or not sites:
        return False
    for site in sites:
        bound = isinstance(site.func, ast.Attribute)
        told, wrapper = argument_at(site, function, func.id, bound)
        module = facts.module_object(wrapper) if told and wrapper is not None else None
        if module is None:
            return False
        built = module[2]
        arguments = [*built.args, *(k.value for k in built.keywords)]
        inner = {n.id for a in arguments for n in ast.walk(a) if isinstance(n, ast.Name)}
        passed = [argument_at(site, function, name, bound) for name in evaluated]
        if not any(ok and isinstance(a, ast.Name) and a.id in inner for ok, a in passed):
            return False
    return True


def _block_of(parent: ast.AST | None, statement: ast.AST) -> list[ast.stmt] | None:
    """The statement list of `parent` that holds `statement`."""
    if parent is None:
        return None
    for name in ("body", "orelse", "finalbody"):
        block = getattr(parent, name, None)
        if isinstance(block, list) and statement in block:
            return block
    for handler in getattr(parent, "handlers", ()):
        if statement in handler.body:
            return handler.body
    return None


@rule(
    "TL201",
    "eval-without-eval-mode",
    "W",
    "Evaluation loop runs the model in training mode",
    fix="unsafe",
)
def eval_without_eval_mode(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    An evaluation loop calls the model while the model is, on every path that reaches it,
    still in training mode: `model.eval()` was never called, or a `train()` inside the loop
    (directly or in a helper it calls) undoes it. Evaluation is recognised by behaviour: a
    loop in a function that never backwards or steps an optimizer and is not run on a training
    path, feeding the model what it iterates or the model's own outputs (greedy decoding);
    a loader named val/test or a function named like validate/evaluate also counts. A helper
    nobody in the file calls is judged by the file's habit: where other helpers put the model
    they are given in eval() themselves, one that does not is reported. A loop shared by both
    passes, whose backward and step run only under a test of one parameter
    (`run_epoch(..., train=False)`, `phase="val"`), is evaluation at the sites that pass the
    value that skips them. A module with no layer that reads the mode (as built here, or by
    the caller that hands it over: `nn.Upsample(...)`, a loss class around `nn.MSELoss`),
    run on another module's outputs (`criterion(model(x), y)`), has nothing to switch and
    is not reported; nor is one of torch's own layers that ignores the mode
    (`up = nn.Upsample(size)`), whatever it is run on. A model handed back by an in-file
    function that switched it before returning it (`net.eval(); return net` in a checkpoint
    loader) is in the mode that function left it in. A module of the project whose forward
    runs nothing it holds (a target smoother or mask builder written as an `nn.Module`) has
    no layer for eval() to switch and is not reported either, nor a loop the code puts the
    model in `train()` for just before it, with no training in between (re-estimating
    batch-norm statistics, a data-dependent initialisation). A model that comes into being
    in eval mode is in eval mode: `from_pretrained` of transformers, diffusers or peft (they
    call `eval()` before returning it), or a project module whose constructor puts the
    networks it holds in eval (a frozen feature extractor). A wrapper run after the network
    it wraps was put in eval (`evaluate(sampler, net)`: `net.eval()`, then `sampler(x)`, where
    every caller built the sampler on that network) is not reported either. A forward the
    evaluation loop runs through an in-file helper it shares with training (`output, loss =
    self._forward_pass(x, y)`, whose body calls `self.model(x)`) is judged by the mode the
    model is in at that call and reported there.

    ## Why it is wrong
    In training mode dropout keeps dropping units and batch-norm normalises with the current
    batch's statistics (and updates its running averages with validation data). Validation
    metrics come out noisy and pessimistic, and batch-norm statistics drift.

    ## Example
    ```python
    model.train()
    for x, y in train_loader: ...
    for x, y in val_loader:        # model still in train mode
        preds = model(x)           # TL201
    ```

    ## Fix
    Call `model.eval()` before the evaluation loop (and `model.train()` before training
    resumes). The quick fix inserts `model.eval()`; it is unsafe because it changes results.
    """
    for call, context, key, modes in _model_calls_in_eval(facts):
        undone = [
            fact
            for fact in modes
            if fact.mode == "train"
            and fact.setter is not None
            and facts.is_inside(fact.setter, context)
        ]
        if undone and any(fact.mode == "eval" for fact in modes):
            # eval() before the loop, but a train() inside it (maybe in a helper it calls)
            # switches the model back for the following batches.
            setter = min(undone, key=lambda f: (f.setter.lineno, f.setter.col_offset)).setter
            yield Hit(
                call,
                f"`{key}` is switched back to training mode inside this evaluation loop (line "
                f"{setter.lineno}): the following batches are evaluated with dropout and "
                "batch-norm updates on",
                None,
            )
            continue
        # "default": nothing in sight ever put this model in eval mode, and a module is
        # built in training mode.
        if not modes or any(fact.mode not in ("train", "default") for fact in modes):
            continue
        if _mode_free(facts, call, modes) and _applied_to_outputs(facts, call, key):
            continue  # a mode-free loss or metric module run on the model's outputs
        if _torch_layer_without_mode(facts, call, modes):
            continue  # `nn.Upsample(...)` itself: eval() can never change what it computes
        if _function_module(facts, modes):
            continue  # a target smoother written as a module: it runs nothing it holds
        if _put_in_train_for_this_loop(facts, context, modes):
            continue  # `model.train()` right before it: batch-norm re-estimation, data init
        if _wraps_what_was_evaluated(facts, call, context):
            continue  # `sampler(x)` after `net.eval()`: every caller built the sampler on net
        edits = [insert_line_before(facts, context, f"{key}.eval()")]  # type: ignore[arg-type]
        if any(
            facts.node_reaches(outer, facts.is_backward) for outer in facts.enclosing_loops(context)
        ):
            # Evaluation inside the training loop: switch back, or the next epoch trains in
            # eval mode (TL203).
            edits.append(insert_line_after(facts, context, f"{key}.train()"))  # type: ignore[arg-type]
        fix = Fix("unsafe", f"Insert `{key}.eval()` before the evaluation loop", tuple(edits))
        yield Hit(
            call,
            f"`{key}` is called in an evaluation loop while in training mode; call "
            f"`{key}.eval()` first ({_why_mode_matters(facts, call)})",
            fix,
        )
    yield from _flag_evaluations(facts)
    for site, context, function, call, key, modes in _helper_forwards_in_evaluation(facts):
        if any(fact.mode not in ("train", "default") for fact in modes):
            continue
        if _mode_free(facts, call, modes) or _torch_layer_without_mode(facts, call, modes):
            continue  # nothing eval() could change in what the helper runs
        if _function_module(facts, modes) or _put_in_train_for_this_loop(facts, context, modes):
            continue
        yield Hit(
            site,
            f"`{function.name}` runs `{key}` (line {call.lineno}) for this evaluation loop while "
            f"it is in training mode; call `eval()` on it before the loop "
            f"({_why_mode_matters(facts, call)})",
            None,
        )


def _mode_free(facts: Facts, call: ast.Call, modes: frozenset) -> bool:
    """No layer of the module `call` runs reads the mode: known from its binding here, or,
    for a module handed to this helper, from the construction its mode facts point to
    (`criterion = JointsMSELoss()` in the caller)."""
    if not mode_sensitive(facts, call.func):
        return True
    built = [fact.setter for fact in modes]
    return bool(built) and all(
        isinstance(setter, ast.Call)
        and setter in facts.parents
        and facts.method_name(setter) not in ("train", "eval")
        and not built_mode_sensitive(facts, setter)
        for setter in built
    )


def _function_module(facts: Facts, modes: frozenset) -> bool:
    """Every mode fact of the module comes from its construction here, and what each
    constructor builds runs nothing it holds (`LabelSmoothing(eps, pad, vocab)`, whose
    forward only fills a tensor): there is no layer whose behaviour eval() could change."""
    built = [fact.setter for fact in modes]
    return bool(built) and all(
        isinstance(setter, ast.Call)
        and setter in facts.parents
        and facts.method_name(setter) not in ("train", "eval")
        and runs_no_module(facts, setter)
        for setter in built
    )


def _torch_layer_without_mode(facts: Facts, call: ast.Call, modes: frozenset) -> bool:
    """The module `call` runs is, wherever it is built, one of torch's own layers that
    ignores the mode (`up = nn.Upsample(size)`, `nn.MaxPool2d(2)`): unlike a project class,
    no layer can ever be added to it, so train and eval mode compute the same thing."""
    kind = facts.kind_of(call.func)
    built = [fact.setter for fact in modes]
    if kind is not None and isinstance(kind.node, ast.Call):
        built.append(kind.node)
    constructors = [
        b
        for b in built
        if isinstance(b, ast.Call) and facts.method_name(b) not in ("train", "eval")
    ]
    if not constructors or len(constructors) != len(built):
        return False
    for constructor in constructors:
        qualname = facts.call_qualname(constructor) or ""
        if not (qualname.startswith("torch.nn.") and qualname.count(".") == 2):
            return False
        if qualname.rsplit(".", 1)[1] in ("Sequential", "ModuleList", "ModuleDict"):
            return False  # containers: judged by the outputs exception above
        if built_mode_sensitive(facts, constructor):
            return False
    return True


def _applied_to_outputs(facts: Facts, call: ast.Call, key: str) -> bool:
    """Some argument of `call` is the output of another module's forward (`criterion(
    model(x), y)`, or through a local): the called module post-processes a model's outputs,
    like a loss written as an `nn.Module`."""
    for argument in [*call.args, *(k.value for k in call.keywords)]:
        for origin in facts.origins(argument):
            for node in (origin.node, *origin.via):
                if not isinstance(node, ast.Call) or node not in facts.parents:
                    continue  # only calls of this file
                module = node.func
                if facts.method_name(node) == "forward":
                    module = facts.receiver(node)  # `model.forward(x)`
                    if not facts.is_kind(module, "model"):
                        continue
                elif not facts.is_forward_call(node):
                    continue
                if facts.key(module) != key:
                    return True
    return False


def _why_mode_matters(facts: Facts, call: ast.Call) -> str:
    if mode_sensitive(facts, call.func):
        return "dropout and batch-norm behave differently"
    # Every layer is known and none reads the mode: honest about what is at stake.
    return "it has no dropout or batch-norm yet, so results change only once one is added"


def _flag_evaluations(facts: Facts) -> Iterator[Hit]:
    """A function that trains or evaluates by a parameter (`run_epoch(..., train=False)`):
    at each site that passes the evaluating constant, the model its loop runs must be in
    eval mode. No fix: the function's own loop also trains, so the mode is the caller's."""
    reported: set[tuple[int, str]] = set()
    for site, function, param, argument, entry in _evaluating_calls(facts):
        for call in facts.calls_in(function):
            key = facts.key(call.func)
            if key is None or key not in entry or not facts.enclosing_loops(call):
                continue
            if _switched_to_eval_by_flag(facts, function, key, param, argument):
                continue  # `if is_train: model.train() else: model.eval()` inside the helper
            modes = entry[key]
            if not modes or any(fact.mode not in ("train", "default") for fact in modes):
                continue
            if _function_module(facts, modes):
                continue
            if (id(function), key) in reported:
                continue
            reported.add((id(function), key))
            yield Hit(
                call,
                f"`{key}` is in training mode when the call on line {site.lineno} "
                f"(`{param}={facts.source.segment(argument)}`) runs this loop as evaluation; "
                f"call `eval()` on it before that call ({_why_mode_matters(facts, call)})",
                None,
            )


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


@rule(
    "TL202",
    "eval-without-no-grad",
    "W",
    "Evaluation in eval() mode but with gradients enabled",
    fix="unsafe",
)
def eval_without_no_grad(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    An evaluation loop that put the model in `eval()` mode but runs it outside
    `torch.no_grad()` / `torch.inference_mode()` (or a function decorated with them). A
    function under a decorator we cannot read (a project's own `@inference_decorator()`)
    may disable gradients itself and is not reported, nor is a loop that asks autograd for
    gradients itself (an adversarial attack: `torch.autograd.grad`, `requires_grad = True`,
    an attack object from advertorch, torchattacks, foolbox or ART), nor a model whose
    parameters were all frozen before the loop (`model.requires_grad_(False)`, or
    `requires_grad = False` set on each of `model.parameters()`), there or by every in-file
    caller before it hands the model over, nor a project model whose `forward` itself
    returns, on some path, what a `@torch.no_grad()` method or a `no_grad` block computed
    (a detector whose forward hands over to `self.inference(x)` when not training), nor a
    helper that only other project files call, each time under `torch.no_grad()` (found when
    the whole project is checked, and in the editor's pass that reads the project).
    Two more shapes are reported: an epoch function shared by training and validation
    (`run_epoch(loader, validating=True)` skips backward and step) called for validation
    with the model in eval mode and gradients on, unless the function switches autograd by
    that flag itself (`torch.set_grad_enabled(training)`); and a helper module's loop
    (`metrics(model, loader)`) that only other project files call, each after putting the
    model they pass in `eval()`, outside `no_grad`. A forward the evaluation loop runs through
    an in-file helper shared with training (`self._forward_pass(x, y)`) is reported at that
    call, unless the helper turns gradients off itself.

    ## Why it is wrong
    `eval()` only changes how layers behave; it does not stop autograd. Every forward pass
    still records the graph, so evaluation uses several times the memory (often running out
    of memory on large validation batches) and is slower, for gradients nobody uses.

    ## Example
    ```python
    model.eval()
    for x, y in val_loader:
        preds = model(x)            # TL202: builds a graph for nothing
    ```

    ## Fix
    Wrap the loop in `with torch.no_grad():` (or decorate the function with
    `@torch.no_grad()`). The quick fix wraps the loop; it is unsafe because it re-indents code.
    """
    analysis = modes_of(facts)
    for call, context, key, modes in _model_calls_in_eval(facts):
        if not modes:
            continue
        if any(fact.mode != "eval" for fact in modes) and not (
            all(fact.mode in ("unknown", "default") for fact in modes)
            and _evaluated_by_callers_elsewhere(facts, call, key)
        ):
            continue
        hit = _graph_built_for_nothing(facts, call, context, key)
        if hit is not None:
            yield hit
    # A parameter nothing in this file shows to be a model (`scorer(users, items)` in a
    # helper module): what other files pass for it, and the mode they leave it in, decide.
    seen: set[tuple[int, str]] = set()
    for function in facts.functions.values():
        if facts.scope(function) is not facts.tree or facts.call_sites(function):
            continue
        params = {a.arg for a in [*function.args.posonlyargs, *function.args.args]}
        for call in facts.calls_in(function):
            if not isinstance(call.func, ast.Name) or call.func.id not in params:
                continue  # only a parameter called itself: `scorer.rank(x)` may be anything
            if call in analysis.at_call:
                continue
            key = call.func.id
            context = evaluation_context(facts, call)
            if context is None or (id(context), key) in seen:
                continue
            seen.add((id(context), key))
            if _evaluated_by_callers_elsewhere(facts, call, key):
                hit = _graph_built_for_nothing(facts, call, context, key)
                if hit is not None:
                    yield hit
    yield from _flag_evaluations_with_grad(facts)
    for site, context, function, call, key, modes in _helper_forwards_in_evaluation(facts):
        if not modes or any(fact.mode != "eval" for fact in modes):
            continue
        if facts.in_no_grad(site) or facts.under_unknown_decorator(site):
            continue
        if facts.grad_disabling_decorator(function) or _grad_switched_around(facts, function, call):
            continue  # the helper turns gradients off (or may) around its forward
        if _needs_gradients(facts, context) or _needs_gradients(facts, function):
            continue
        if facts.parameters_frozen_before(key, context) or facts.forward_may_disable_grad(call):
            continue
        yield Hit(
            site,
            f"`{function.name}` runs `{key}` (line {call.lineno}) for this evaluation loop with "
            "gradients enabled; wrap the loop in `torch.no_grad()` or `torch.inference_mode()`",
            _wrap_in_no_grad(facts, context),
        )


def _graph_built_for_nothing(
    facts: Facts, call: ast.Call, context: ast.AST, key: str
) -> Hit | None:
    """TL202's finding for a forward of `key` in eval mode in the evaluation loop `context`,
    unless something there keeps autograd from recording (or needs it)."""
    if facts.in_no_grad(call) or facts.under_unknown_decorator(call):
        return None
    if _needs_gradients(facts, context):
        return None  # an attack or a saliency map: the loop asks autograd for gradients
    if facts.parameters_frozen_before(key, context):
        return None  # no parameter requires a gradient: the forward records no graph
    if facts.forward_may_disable_grad(call):
        return None  # the module turns gradients off itself when it is not training
    function = facts.enclosing_function(context)
    if function is not None and facts.callers_elsewhere_disable_grad(function):
        return None  # every caller, in the project's other files, runs it under no_grad
    return Hit(
        call,
        f"`{key}` runs in an evaluation loop with gradients enabled; wrap the loop in "
        "`torch.no_grad()` or `torch.inference_mode()`",
        _wrap_in_no_grad(facts, context),
    )


def _evaluated_by_callers_elsewhere(facts: Facts, call: ast.Call, key: str) -> bool:
    """`key` (or the object it is an attribute of) is a parameter of a plain function that
    no code in this file calls, and every call of that function in the project's other files
    hands over a model it put in eval() there, outside `no_grad` (`model.eval()` then
    `evaluate.metrics(model, loader)` in main.py): the loop here runs that model in eval mode.
    Asked of a full view of the project only, like `callers_elsewhere_disable_grad`."""
    function = facts.enclosing_function(call)
    if function is None or facts.call_sites(function) or facts.scope(function) is not facts.tree:
        return False
    root = key.split(".")[0]
    params = [a.arg for a in [*function.args.posonlyargs, *function.args.args]]
    if root not in params or any(
        a.stmt is not function for a in facts.assignments_of(root, function)
    ):
        return False  # not a parameter, or rebound inside: the caller's model may not run
    found = facts.calls_from_other_files(function)
    if not found:
        return False
    for other, site in found:
        told, argument = argument_at(site, function, root, False)
        passed = other.key(argument) if told and argument is not None else None
        if passed is None or other.in_no_grad(site) or other.under_unknown_decorator(site):
            return False
        if not other.is_kind(argument, "model"):
            return False  # an agent or a wrapper with its own eval(): its calls may be anything
        modes = modes_of(other).at_site.get(site, {}).get(passed)
        if not modes or any(fact.mode != "eval" for fact in modes):
            return False
        if other.parameters_frozen_before(passed, site):
            return False
    return True


def _flag_evaluations_with_grad(facts: Facts) -> Iterator[Hit]:
    """A loop shared by training and evaluation through a parameter (`run_epoch(...,
    cross_valid=True)` skips backward and step): at a site that passes the evaluating
    constant with the model in eval mode (or that makes the helper call `eval()` itself),
    outside `no_grad`, every forward of that pass records a graph nobody uses. Not reported
    when anything in the helper may switch gradients by the flag (`torch.set_grad_enabled(
    train)`, a context manager chosen at run time) or the forward itself sits under a test
    of the flag. No fix: the loop also trains, so no_grad belongs around the call site."""
    reported: set[tuple[int, str]] = set()
    for site, function, param, argument, entry in _evaluating_calls(facts):
        if facts.in_no_grad(site) or facts.under_unknown_decorator(site):
            continue
        for call in facts.calls_in(function):
            key = facts.key(call.func)
            loops = facts.enclosing_loops(call)
            if key is None or not loops or (id(function), key) in reported:
                continue
            modes = entry.get(key)
            in_eval = bool(modes) and all(fact.mode == "eval" for fact in modes)
            if not in_eval and not (
                key in entry and _switched_to_eval_by_flag(facts, function, key, param, argument)
            ):
                continue
            if _grad_may_follow_flag(facts, function, call, param):
                continue
            if facts.in_no_grad(call) or _needs_gradients(facts, loops[-1]):
                continue
            if facts.parameters_frozen_before(key, loops[-1]) or facts.forward_may_disable_grad(
                call
            ):
                continue
            reported.add((id(function), key))
            yield Hit(
                call,
                f"`{key}` is in eval mode but gradients are on when the call on line "
                f"{site.lineno} (`{param}={facts.source.segment(argument)}`) runs this loop as "
                "evaluation; wrap that call in `torch.no_grad()`",
                None,
            )


def _grad_may_follow_flag(facts: Facts, function: FunctionNode, call: ast.Call, param: str) -> bool:
    """Between `call` and its function: a `with` that may turn gradients off
    (`_grad_switched_around`), or an `if` testing `param` (the pass that evaluates may take
    another branch)."""
    if _grad_switched_around(facts, function, call):
        return True
    child: ast.AST = call
    current = facts.parents.get(call)
    while current is not None and current is not function:
        if isinstance(current, ast.If):
            guard = guard_of(facts, function, current.test, child in current.body)
            if guard is not None and guard[0] == param:
                return True
        child, current = current, facts.parents.get(current)
    return False


def _grad_switched_around(facts: Facts, function: FunctionNode, call: ast.Call) -> bool:
    """Between `call` and its function, a `with` that may turn gradients off at run time
    (`torch.set_grad_enabled(train)`, `torch.no_grad() if not train else nullcontext()`,
    a context manager held in a name)."""
    current = facts.parents.get(call)
    while current is not None and current is not function:
        if isinstance(current, (ast.With, ast.AsyncWith)):
            for item in current.items:
                context = item.context_expr
                if not isinstance(context, ast.Call):
                    return True  # `with ctx:` or a conditional expression: may be no_grad
                qualname = facts.call_qualname(context) or ""
                if "grad" in qualname or "inference_mode" in qualname:
                    return True
        current = facts.parents.get(current)
    return False


def _needs_gradients(facts: Facts, loop: ast.AST) -> bool:
    """The loop computes gradients itself (`torch.autograd.grad(...)`, `x.requires_grad =
    True`, `x.requires_grad_()`): no_grad would break it."""
    attackers = _attack_objects(facts)
    for node in ast.walk(loop):
        if isinstance(node, ast.Call):
            qualname = facts.call_qualname(node) or ""
            if qualname in ("torch.autograd.grad", "torch.autograd.functional.jacobian"):
                return True
            if qualname.split(".")[0] in ATTACK_LIBRARIES:
                return True  # `torchattacks.PGD(model)(images, labels)` runs backward itself
            if facts.key(facts.receiver(node)) in attackers:
                return True  # `adversary.perturb(x, y)` of an attack built from such a library
            if facts.method_name(node) == "requires_grad_":
                return True
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Attribute) and t.attr == "requires_grad" for t in node.targets
        ):
            return True
    return False


# Adversarial-attack libraries: their attacks need autograd through the model.
ATTACK_LIBRARIES = frozenset({"advertorch", "torchattacks", "foolbox", "art", "cleverhans"})


def _attack_objects(facts: Facts) -> set[str]:
    """Names bound to an object built by an attack library (`adversary = LinfPGDAttack(...)`)."""
    found: set[str] = set()
    if not any(t.split(".")[0] in ATTACK_LIBRARIES for t in facts.imports.values()):
        return found
    for table in facts.assignments.values():
        for name, bindings in table.items():
            for binding in bindings:
                value = binding.value
                if isinstance(value, ast.Call):
                    root = (facts.call_qualname(value) or "").split(".")[0]
                    if root in ATTACK_LIBRARIES:
                        found.add(name)
    return found


def _wrap_in_no_grad(facts: Facts, loop: ast.AST) -> Fix | None:
    torch = facts.torch_alias
    if torch is None or not isinstance(loop, ast.stmt):
        return None
    first, last = loop.lineno, loop.end_lineno or loop.lineno
    if any(
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and (node.end_lineno or node.lineno) > node.lineno
        for node in ast.walk(loop)
    ):
        return None  # re-indenting would change a multi-line string
    indent = facts.source.indent_of(first)
    edits = [insert_at(first, 0, f"{indent}with {torch}.no_grad():\n")]
    for row in range(first, last + 1):
        if facts.source.lines[row - 1].strip():
            edits.append(insert_at(row, 0, "    "))
    # Both edits at the loop's first row insert at column 0; merge them into one.
    merged = edits[0].content + edits[1].content if len(edits) > 1 else edits[0].content
    edits = [insert_at(first, 0, merged), *edits[2:]]
    return Fix("unsafe", "Wrap the evaluation loop in `torch.no_grad()`", tuple(edits))


def _skipped_by_same_test(facts: Facts, setter: ast.AST, call: ast.Call) -> bool:
    """The eval() runs only under `if <test>:`, and every iteration that reaches `call`
    first passes an `if <test>: break` (or return/continue/raise) on the same test: the
    path from that eval() to this training step cannot be taken (an inference-only flag)."""
    tests: set[str] = set()
    child, current = setter, facts.parents.get(setter)
    while current is not None and not isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if isinstance(current, ast.If) and child in current.body:
            tests.add(ast.dump(current.test))
        child, current = current, facts.parents.get(current)
    if not tests:
        return False
    exits = (ast.Break, ast.Return, ast.Continue, ast.Raise)
    for loop in facts.enclosing_loops(call):
        for statement in loop.body:
            if facts.is_inside(call, statement) or statement is call:
                break
            if (
                isinstance(statement, ast.If)
                and ast.dump(statement.test) in tests
                and any(isinstance(s, exits) for s in statement.body)
            ):
                return True
    return False


@rule(
    "TL203",
    "train-mode-not-restored",
    "E",
    "model.eval() inside the epoch loop without model.train() before training resumes",
    fix="unsafe",
)
def train_mode_not_restored(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    `model.eval()` (directly or inside a helper such as `evaluate(model)`, however deep, also
    through an object such as `ctx.model`, or in a method of an object that holds the trainer,
    `self.hook = Hook(self)` switching `self.trainer.model`) runs inside the epoch loop, while
    `model.train()` is called only before the loop: from the second epoch on, the model trains
    in eval mode. Models switched together count one by one: a loop over them
    (`for net in (encoder, decoder): net.eval()`) or a helper given a list of them
    (`set_mode("eval", [encoder, decoder])`) switches each listed model. A validation every
    N batches from inside the batch loop is reported the same way, also when the training
    forward runs in a loss helper given the model (`loss = loss_fn(model, x)` ...
    `loss.backward()`). Models the
    loop does not train (a frozen teacher no optimizer there steps, or only run under
    `no_grad`), models whose every layer ignores the mode (linear, convolution and activation
    layers only: eval() changes nothing for them) and helpers that restore the mode they
    found (`was_training = model.training` ... `model.train(was_training)`) are not reported
    (a helper's model parameter that only other project files fill is judged by the modules
    they pass),
    nor is an `eval()` (or `train(False)`) chosen on purpose by one arm of an `if` whose other
    arm calls `train()` (`if finetune: model.train() else: model.eval()`, a frozen backbone).
    A helper whose parameter picks the mode (`def net_mode(self, train): if train: ...`) is
    read with the constant each call passes: `net_mode(train=True)` restores training mode.
    A method of the module's own class called from its epoch loop (`self.run_train_epoch(
    loader)`) is a helper, not the module running: the mode that matters is the one the
    method's own forwards see (`self.train()` as its first statement restores it).

    ## Why it is wrong
    In eval mode dropout is off and batch-norm uses frozen running statistics, so every epoch
    after the first trains a different network than intended: regularisation silently
    disappears and batch-norm statistics stop adapting. Nothing crashes; results just get worse.

    ## Example
    ```python
    model.train()
    for epoch in range(epochs):
        for x, y in train_loader: ...   # epoch 2+: still in eval mode
        evaluate(model)                 # TL203: calls model.eval()
    ```

    ## Fix
    Call `model.train()` at the start of each epoch's training loop. The quick fix inserts it
    before the training loop; it is unsafe because it changes results.
    """
    reported: set[tuple[int, str]] = set()
    for call, model, modes, loops in _uses_in_training_loops(facts):
        if not any(fact.mode == "eval" for fact in modes):
            continue
        if not facts.trains_model(loops[0], model):
            continue  # a frozen teacher kept in eval() on purpose: this loop never trains it
        if not mode_sensitive(facts, model):
            continue  # eval() changes nothing in a model without dropout or batch-norm
        direct = {fact.setter for fact in modes if not fact.back_edge}
        # A forward whose loss this loop backwards is meant to run in train mode: when it
        # may also see eval() left by an earlier step of the same loop (a validation every N
        # batches, in a helper), that eval() leaks into training even within one iteration.
        trains = model is not call.func or _trains_forward(facts, loops[0], call)
        leaks = trains and any(fact.mode in ("train", "default") for fact in modes)
        for fact in modes:
            if fact.mode != "eval":
                continue
            if not leaks and (not fact.back_edge or fact.setter in direct):
                continue
            setter = fact.setter
            key = facts.key(model) or "model"
            # One finding per model a setter leaves in eval: `for net in (enc, dec): net.eval()`
            # leaves both.
            if setter is None or (id(setter), key) in reported:
                continue
            if _skipped_by_same_test(facts, setter, call):
                continue  # `if test: model.eval()` ... `if test: break` before training
            if isinstance(setter, ast.Call) and built_in_eval_mode(facts, setter):
                continue  # built in eval mode (`from_pretrained`), not switched in the loop
            if _guarded_apart(facts, setter, loops[0]):
                continue  # `if phase == "train": ... else: model.eval()`: that path never trains
            if _mode_chosen_by_branch(facts, setter):
                continue  # `if finetune: model.train() else: model.eval()`: eval on purpose
            reported.add((id(setter), key))
            # At the top of the training loop's body: before the loop is not enough when the
            # loop itself is the epoch loop (full-batch training).
            first = loops[0].body[0]  # type: ignore[attr-defined]
            fix = Fix(
                "unsafe",
                f"Insert `{key}.train()` at the start of the training loop",
                (insert_line_before(facts, first, f"{key}.train()"),),
            )
            statement = facts.enclosing_statement(setter)
            if (
                statement is not None
                and facts.is_inside(statement, loops[0])
                and facts.method_name(setter) not in ("eval", "train")
                and (setter.lineno, setter.col_offset) < (call.lineno, call.col_offset)
            ):
                # eval() set inside the training loop itself (mid-epoch validation): switch
                # back right after it, the top of the loop has already run.
                fix = Fix(
                    "unsafe",
                    f"Insert `{key}.train()` after the call that leaves eval mode",
                    (insert_line_after(facts, statement, f"{key}.train()"),),
                )
            yield Hit(
                setter,
                f"`{key}` is put in eval mode here, inside the epoch loop, and "
                f"`{key}.train()` is not called again before training (line {loops[0].lineno})",
                fix,
            )


def _uses_in_training_loops(
    facts: Facts,
) -> Iterator[tuple[ast.Call, ast.expr, frozenset, list]]:
    """(call, model, modes the model may be in there, training loops around the call): each
    model call in a training loop, and each call in one that hands a model to a project
    function running it, whose result this loop backpropagates (`loss = loss_fn(model, x)`
    ... `loss.backward()`): a training forward, one call away."""
    analysis = modes_of(facts)
    for call, modes in analysis.at_call.items():
        loops = [loop for loop in facts.enclosing_loops(call) if loop in facts.training_loops]
        if loops:
            yield call, call.func, modes, loops
    for site, held in analysis.at_site.items():
        loops = [loop for loop in facts.enclosing_loops(site) if loop in facts.training_loops]
        if not loops or site not in _backpropagated_calls(facts, loops[0]):
            continue
        for position, argument in enumerate(site.args):
            key = facts.key(argument)
            if key in held and _runs_argument(facts, site, position):
                yield site, argument, held[key], loops  # type: ignore[index]


def _backpropagated_calls(facts: Facts, loop: ast.AST) -> set[ast.Call]:
    """Calls in `loop` whose value a backward() of the loop runs through, followed through
    local assignments (every binding an `if` may choose) and the operands around them."""
    cache = facts.__dict__.setdefault("_backpropagated_calls", {})
    found = cache.get(loop)
    if found is not None:
        return found
    found = cache[loop] = set()
    todo: list[tuple[ast.AST, int]] = []
    for backward in facts.calls_in(loop):
        if facts.is_backward(backward):
            subject = facts.receiver(backward) or (backward.args[0] if backward.args else None)
            if subject is not None:
                todo.append((subject, 0))
    seen: set[int] = set()
    while todo:
        node, depth = todo.pop()
        if id(node) in seen or depth > 4:
            continue
        seen.add(id(node))
        for child in ast.walk(node):
            if isinstance(child, ast.Call) and facts.is_inside(child, loop):
                if facts.method_name(child) in ("detach", "item"):
                    continue
                found.add(child)
            elif isinstance(child, ast.Name) and isinstance(child.ctx, ast.Load):
                bindings = facts.binding_alternatives(child) or [facts.reaching_assignment(child)]
                for binding in bindings:
                    if binding is not None and binding.value is not None and binding.loop is None:
                        if not facts.in_no_grad(binding.stmt):
                            todo.append((binding.value, depth + 1))
    return found


def _runs_argument(facts: Facts, call: ast.Call, position: int) -> bool:
    """The project function `call` runs (in this file or another) calls the parameter that
    receives its positional argument `position` (`def loss_fn(model, x): model(x)`)."""
    found = facts.callee(call)
    if found is None or any(isinstance(a, ast.Starred) for a in call.args[: position + 1]):
        return False
    owner, function, bound = found
    params = [a.arg for a in [*function.args.posonlyargs, *function.args.args]]
    if bound:
        params = params[1:]
    if position >= len(params):
        return False
    name = params[position]
    if any(
        isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store)
        for n in owner.walk_local(function)
    ):
        return False  # rebound inside: the call may run something else
    return any(isinstance(c.func, ast.Name) and c.func.id == name for c in owner.calls_in(function))


def _branch_test(facts: Facts, node: ast.AST, stop: ast.AST | None) -> tuple[ast.If, bool] | None:
    """The nearest `if` around `node` (below `stop`) and whether its test is true there."""
    child, current = node, facts.parents.get(node)
    while current is not None and current is not stop:
        if isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return None
        if isinstance(current, ast.If):
            if any(child is stmt for stmt in current.body):
                return current, True
            if any(child is stmt for stmt in current.orelse):
                return current, False
        child, current = current, facts.parents.get(current)
    return None


def _guarded_apart(facts: Facts, setter: ast.AST, loop: ast.AST) -> bool:
    """The eval() and every training call of `loop` sit on opposite sides of the same test
    of unchanged names: `if phase == "train": model.train() else: model.eval()`, then in
    the loop `if phase == "train": loss.backward(); optimizer.step()`."""
    guard = _branch_test(facts, setter, None)
    if guard is None or facts.enclosing_function(setter) is not facts.enclosing_function(loop):
        return False
    branch, truth = guard
    test = ast.dump(branch.test)
    trainers = [call for call in facts.calls_in(loop) if facts.reaches(call, _trainer(facts))]
    if not trainers:
        return False
    for call in trainers:
        found = _branch_test(facts, call, loop)
        if found is None or ast.dump(found[0].test) != test or found[1] == truth:
            return False
    scope = facts.scope(loop)
    for name in {node.id for node in ast.walk(branch.test) if isinstance(node, ast.Name)}:
        for assignment in facts.assignments_of(name, scope):  # type: ignore[arg-type]
            if facts.is_inside(assignment.stmt, loop):
                return False  # the test may change inside the loop
    return True


def _mode_chosen_by_branch(facts: Facts, setter: ast.AST) -> bool:
    """`setter` is a plain `model.eval()` statement in one arm of an `if`/`elif` chain whose
    other arm calls `model.train()` on the same model: the mode is picked on purpose for what
    follows (a frozen backbone kept in eval mode for a linear probe), not left over.
    `model.train(False)` is the same statement as `model.eval()`."""
    if not isinstance(setter, ast.Call) or setter.keywords:
        return False
    method = facts.method_name(setter)
    plain_eval = method == "eval" and not setter.args
    train_false = (
        method == "train"
        and len(setter.args) == 1
        and isinstance(setter.args[0], ast.Constant)
        and setter.args[0].value is False
    )
    if not (plain_eval or train_false):
        return False
    statement = facts.parents.get(setter)
    key = facts.key(facts.receiver(setter))
    if not isinstance(statement, ast.Expr) or key is None:
        return False
    branch = facts.parents.get(statement)
    if not isinstance(branch, ast.If):
        return False
    top = branch
    while True:  # climb `elif` links to the head of the chain
        parent = facts.parents.get(top)
        if isinstance(parent, ast.If) and len(parent.orelse) == 1 and parent.orelse[0] is top:
            top = parent
        else:
            break
    arms: list[list[ast.stmt]] = []
    link: ast.If = top
    while True:
        arms.append(link.body)
        if len(link.orelse) == 1 and isinstance(link.orelse[0], ast.If):
            link = link.orelse[0]
            continue
        arms.append(link.orelse)
        break
    own = next((arm for arm in arms if statement in arm), None)
    if own is None:
        return False
    for arm in arms:
        if arm is own:
            continue
        for other in arm:
            call = other.value if isinstance(other, ast.Expr) else None
            if (
                isinstance(call, ast.Call)
                and facts.method_name(call) == "train"
                and facts.key(facts.receiver(call)) == key
                and not call.keywords
                and (
                    not call.args
                    or (isinstance(call.args[0], ast.Constant) and call.args[0].value is True)
                )
            ):
                return True
    return False


def _trains_forward(facts: Facts, loop: ast.AST, call: ast.Call) -> bool:
    """`call` is a forward pass whose graph a backward() in `loop` runs through."""
    cache = getattr(facts, "_training_forwards", None)
    if cache is None:
        cache = facts._training_forwards = {}  # type: ignore[attr-defined]
    forwards = cache.get(loop)
    if forwards is None:
        forwards = set()
        for backward in facts.calls_in(loop):
            if facts.is_backward(backward):
                subject = facts.receiver(backward) or (backward.args[0] if backward.args else None)
                if subject is not None:
                    forwards |= facts.graph_forwards(subject)
        cache[loop] = forwards
    return call in forwards


def _steps(facts: Facts) -> Iterator[tuple[ast.Call, ast.expr]]:
    for call in facts.method_calls("step"):
        optimizer = facts.optimizer_of_step(call)
        if optimizer is not None:
            yield call, optimizer


def _privacy_wrapped(facts: Facts) -> set[str]:
    """Optimizers handed to an Opacus privacy engine (`engine.attach(optimizer)`,
    `engine.make_private(optimizer=...)`): its step rebuilds `.grad` from per-sample
    gradients each time, so stale gradients never reach the update."""
    if not any(target.startswith("opacus") for target in facts.imports.values()):
        return set()
    engines = set()
    for table in facts.assignments.values():
        for name, bindings in table.items():
            if any(
                isinstance(b.value, ast.Call)
                and (facts.call_qualname(b.value) or "").startswith("opacus.")
                for b in bindings
            ):
                engines.add(name)
    for info in facts.classes.values():
        for attribute, values in info.attributes.items():
            if any(
                isinstance(v, ast.Call) and (facts.call_qualname(v) or "").startswith("opacus.")
                for v in values
            ):
                engines.add(f"self.{attribute}")
    found: set[str] = set()
    for call in facts.calls:
        receiver = facts.key(facts.receiver(call))
        if receiver in engines or (facts.call_qualname(call) or "").startswith("opacus."):
            for argument in [*call.args, *(k.value for k in call.keywords)]:
                key = facts.key(argument)
                if key is not None:
                    found.add(key)
    return found


def _other_framework(facts: Facts) -> bool:
    """The file trains with another framework and never imports torch."""
    modules = {target.split(".")[0] for target in facts.imports.values()}
    return "torch" not in modules and bool(modules & OTHER_FRAMEWORKS)


OTHER_FRAMEWORKS = frozenset({"mxnet", "tensorflow", "jax", "flax", "paddle", "mindspore"})


def _uncleared_steps(facts: Facts, loop: ast.AST) -> set[int]:
    """Ids of the optimizer steps in `loop` whose parameters no `zero_grad()` in the loop
    clears, when every clearing there is a direct `zero_grad()` on a known optimizer or model
    and every stepped optimizer's parameters are known (`optimizer_D.step()` where only
    `optimizer_G.zero_grad()` runs). Empty as soon as anything cannot be told."""
    stepped = {
        facts.key(optimizer)
        for call in facts.calls_in(loop)
        if (optimizer := facts.optimizer_of_step(call)) is not None
    }
    if len(stepped) < 2:
        return set()  # one optimizer: the loop-wide check above already covers it
    if any(facts.clears_gradients(node) for node in ast.walk(loop)):
        return set()  # `p.grad = None`: which parameters is not tracked
    cleared: list[set[str]] = []
    for call in facts.calls_in(loop):
        if not facts.is_zero_grad(call):
            if facts.reaches(call, lambda c: _clears(facts, c)):
                return set()  # a helper or a closure (LBFGS) clears something
            continue
        receiver = facts.receiver(call)
        kind = facts.kind_of(receiver)
        key = facts.key(receiver)
        if kind is None or kind.by_name or key is None:
            return set()
        if kind.kind == "optimizer":
            owners = facts.optimizer_parameter_owners(receiver)
        elif kind.kind == "model":
            owners = {key}
        else:
            return set()
        if not owners:
            return set()
        cleared.append(owners)
    found: set[int] = set()
    for step in facts.calls_in(loop):
        optimizer = facts.optimizer_of_step(step)
        if optimizer is None or facts.enclosing_loops(step)[:1] != [loop]:
            continue
        owners = facts.optimizer_parameter_owners(optimizer)
        if not owners:
            return set()
        if not any(_overlap(owners, other) for other in cleared):
            found.add(id(step))
    return found


def _overlap(first: set[str], second: set[str]) -> bool:
    """Two sets of module keys share parameters (`D` and `D.net` do)."""
    return any(
        a == b or a.startswith(b + ".") or b.startswith(a + ".") for a in first for b in second
    )


def _clears(facts: Facts, call: ast.Call) -> bool:
    return facts.is_zero_grad(call) or facts.clears_gradients(call)


def _clearings_in(facts: Facts, loop: ast.AST) -> list[ast.AST]:
    """Every clearing of gradients in `loop`: a `zero_grad()`, a call that reaches one (a
    helper, an LBFGS closure), `p.grad = None`."""
    return [
        node
        for node in ast.walk(loop)
        if facts.clears_gradients(node)
        or (
            isinstance(node, ast.Call)
            and (facts.is_zero_grad(node) or facts.reaches(node, lambda c: _clears(facts, c)))
        )
    ]


def _arm_that_never_clears(
    facts: Facts, loop: ast.AST, step: ast.Call, clearings: list[ast.AST]
) -> ast.If | None:
    """The `if` inside `loop` one of whose arms holds `step` and no clearing of gradients,
    while every one of the loop's `clearings` sits in its other arm: whenever the step's arm
    runs, the gradients of earlier iterations are still there (`if not use_amp: zero_grad,
    backward, step / else: scaler.step`)."""
    if not clearings:
        return None
    current = facts.parents.get(step)
    while current is not None and current is not loop:
        if isinstance(current, ast.If) and current.orelse:
            arms = (current.body, current.orelse)
            mine = next(
                (arm for arm in arms if any(facts.is_inside(step, stmt) for stmt in arm)), None
            )
            other = arms[1] if mine is arms[0] else arms[0]
            if mine is not None and all(
                any(facts.is_inside(node, stmt) for stmt in other) for node in clearings
            ):
                return current
        current = facts.parents.get(current)
    return None


def _clears_grads_in(facts: Facts, loop: ast.AST) -> bool:
    if facts.node_reaches(loop, lambda c: _clears(facts, c)):
        return True
    return any(facts.clears_gradients(node) for node in ast.walk(loop))


@rule(
    "TL204",
    "missing-zero-grad",
    "E",
    "Loop steps the optimizer but never clears gradients",
    fix="unsafe",
)
def missing_zero_grad(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    A loop that calls `backward()` and `optimizer.step()` (or `scaler.step(optimizer)`) but
    never clears gradients: no `optimizer.zero_grad()`, `model.zero_grad()` or
    `p.grad = None` anywhere in the loop (helpers and LBFGS closures included). Distributed
    autograd (`dist_autograd.backward(context_id, ...)` with a `DistributedOptimizer`) keeps
    gradients per context, not in `.grad`, and is not reported. With two optimizers in one
    loop (a GAN), an optimizer whose parameters no `zero_grad()` there clears is reported
    too, when every clearing in the loop names a known optimizer or model; when the loop
    clears nothing at all, each optimizer it steps is reported once; a step in one arm of an
    `if` whose other arm holds every clearing of the loop is reported too. Files that train
    with another framework and never import torch (MXNet's Gluon) are not checked, nor are
    optimizers handed to an Opacus privacy engine (its step rebuilds `.grad` itself).

    ## Why it is wrong
    `backward()` adds into `.grad`. Without clearing, step *k* uses the sum of all gradients so
    far: the effective learning rate grows every step and training diverges or oscillates.
    Gradient accumulation (clearing every *k* steps inside the loop) is correct and is not
    reported.

    ## Example
    ```python
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()          # TL204
    ```

    ## Fix
    Call `optimizer.zero_grad(set_to_none=True)` at the start of each iteration. Offered as
    an unsafe fix (it changes training).
    """
    if _other_framework(facts):
        return  # MXNet's or TensorFlow's backward overwrites gradients: nothing to clear
    # Each optimizer once per loop: with two optimizers and no clearing at all, each gets its
    # own finding and fix (clearing one leaves the other's gradients accumulating).
    reported: set[tuple[int, str]] = set()
    clearings: dict[int, list[ast.AST]] = {}  # per loop, for all the steps in it
    private = _privacy_wrapped(facts)
    for step, optimizer in _steps(facts):
        loops = facts.enclosing_loops(step)
        if not loops or facts.key(optimizer) in private:
            continue
        loop = loops[0]
        seen = (id(loop), facts.key(optimizer) or facts.source.segment(optimizer))
        if seen in reported or not facts.node_reaches(loop, facts.accumulates_grad):
            continue
        if _clears_grads_in(facts, loop):
            if id(loop) not in clearings:
                clearings[id(loop)] = _clearings_in(facts, loop)
            branch = _arm_that_never_clears(facts, loop, step, clearings[id(loop)])
            if branch is not None:
                optimizer_text = facts.source.segment(optimizer)
                yield Hit(
                    step,
                    f"`{optimizer_text}` is stepped in an arm of the `if` on line "
                    f"{branch.lineno} that never clears gradients (only the other arm does); "
                    "whenever this arm runs they accumulate across iterations",
                    None,
                )
            elif id(step) in _uncleared_steps(facts, loop):
                # Two optimizers in one loop, and only the other one's gradients are cleared.
                optimizer_text = facts.source.segment(optimizer)
                yield Hit(
                    step,
                    f"`{optimizer_text}` is stepped in a loop that clears other gradients but "
                    f"never the ones `{optimizer_text}` updates; they accumulate across "
                    "iterations",
                    None,
                )
            continue
        reported.add(seen)
        optimizer_text = facts.source.segment(optimizer)
        body_start = loop.body[0]  # type: ignore[attr-defined]
        yield Hit(
            step,
            f"`{optimizer_text}` is stepped in a loop that never clears gradients; they "
            "accumulate across iterations",
            Fix(
                "unsafe",
                f"Insert `{optimizer_text}.zero_grad(set_to_none=True)` at the start of the loop",
                (
                    insert_line_before(
                        facts, body_start, f"{optimizer_text}.zero_grad(set_to_none=True)"
                    ),
                ),
            ),
        )


def _zero_grad_statements(facts: Facts) -> Iterator[tuple[ast.Call, ast.stmt, list[ast.stmt]]]:
    for call in facts.method_calls("zero_grad"):
        statement = facts.parents.get(call)
        if isinstance(statement, ast.Expr):
            block = facts.block_of(statement)
            if block is not None:
                yield call, statement, block


@rule(
    "TL205",
    "zero-grad-between-backward-and-step",
    "E",
    "zero_grad() between backward() and step() wipes the gradients",
    fix="unsafe",
)
def zero_grad_between_backward_and_step(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    `optimizer.zero_grad()` (or `model.zero_grad()`) called after `loss.backward()` and before
    `optimizer.step()` of the same optimizer.

    ## Why it is wrong
    The gradients `backward()` just computed are erased before the optimizer uses them, so
    `step()` sees zeros (or `None`): the parameters never change, or only weight decay and
    momentum move them. The loss stays flat.

    ## Example
    ```python
    loss.backward()
    optimizer.zero_grad()   # TL205
    optimizer.step()
    ```

    ## Fix
    Clear gradients before the forward pass (start of the iteration), or after `step()`.
    The quick fix moves the call to the start of the block; it is unsafe.
    """
    for call, stmt, block in _zero_grad_statements(facts):
        index = next(i for i, item in enumerate(block) if item is stmt)
        cleared = facts.receiver(call)
        cleared_key = facts.key(cleared)
        clears_model = facts.is_kind(cleared, "model") or cleared_key == "self"
        if not any(facts.node_reaches(s, facts.is_backward) for s in block[:index]):
            continue
        for later in block[index + 1 :]:
            if facts.node_reaches(later, facts.is_backward):
                break
            steps = [c for c in facts.calls_in(later) if facts.optimizer_of_step(c) is not None]
            matched = [
                s
                for s in steps
                if clears_model or facts.key(facts.optimizer_of_step(s)) == cleared_key
            ]
            if matched:
                yield Hit(
                    call,
                    f"`{facts.source.segment(call)}` runs after backward() and before "
                    f"`{facts.source.segment(matched[0])}`: the step sees no gradients",
                    _move_to_block_start(facts, block, stmt),
                )
                break


def _move_to_block_start(facts: Facts, block: list[ast.stmt], stmt: ast.stmt) -> Fix | None:
    deletion = delete_statement_line(facts, stmt)
    if deletion is None or block[0] is stmt:
        return None
    text = facts.source.segment(stmt)
    return Fix(
        "unsafe",
        "Move the zero_grad() call before the forward pass",
        (insert_line_before(facts, block[0], text), deletion),
    )


TENSOR_USES = {"item", "detach", "cpu", "numpy", "backward", "to", "cuda", "tolist", "clone"}


def _returns_graph(facts: Facts, value: ast.AST, project_calls: set[ast.Call]) -> bool:
    """`value` calls a project function whose summary says it hands back a loss it
    backward()-ed, still attached to the graph (`train_step` returning `loss`)."""
    if not isinstance(value, ast.Call) or value not in project_calls:
        return False
    asked = facts.call_summary(value)
    return asked is not None and asked[0].returns_graph


def _loss_names(
    facts: Facts, scope: ast.AST, project_calls: set[ast.Call]
) -> tuple[set[str], dict[str, list[ast.Subscript]]]:
    """Names in `scope` that hold a loss tensor (assigned from a loss call or from a helper
    returning its graph-attached loss, or backward()-ed), and names of containers shown to
    hold one because an item of theirs is backward()-ed (`output["loss"].backward()`), with
    those backward()-ed items."""
    names: set[str] = set()
    containers: dict[str, list[ast.Subscript]] = {}
    loss_call_nodes = facts.loss_call_nodes
    for node in facts.calls_in(scope):
        if facts.method_name(node) == "backward" and not node.args:
            receiver = facts.receiver(node)
            if isinstance(receiver, ast.Name):
                names.add(receiver.id)
            elif isinstance(receiver, ast.Subscript) and isinstance(receiver.value, ast.Name):
                containers.setdefault(receiver.value.id, []).append(receiver)
    # The scope's binding table already lists every `name = value` it holds.
    for name, bindings in facts.assignments.get(scope, {}).items():
        for binding in bindings:
            node = binding.stmt
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and (
                    node.value in loss_call_nodes
                    or _returns_graph(facts, node.value, project_calls)
                )
            ):
                names.add(name)
    return names, {k: v for k, v in containers.items() if k not in names}


def _accumulation(stmt: ast.stmt) -> tuple[str, ast.expr, str] | None:
    """(accumulator, value, how) for `acc.append(v)`, `acc += v`, `acc[k] = v`, `acc[k] += v`
    (an assignment to a constant key replaces the value it held: no accumulation)."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        call = stmt.value
        func = call.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "append"
            and isinstance(func.value, ast.Name)
            and len(call.args) == 1
        ):
            return func.value.id, call.args[0], "append"
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.op, ast.Add):
        if isinstance(stmt.target, ast.Name):
            return stmt.target.id, stmt.value, "+="
        if isinstance(stmt.target, ast.Subscript) and isinstance(stmt.target.value, ast.Name):
            return stmt.target.value.id, stmt.value, "[]+="
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        target = stmt.targets[0]
        if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
            if isinstance(target.slice, ast.Constant):
                return None  # `latest["d"] = d_loss`: one slot, overwritten every step
            return target.value.id, stmt.value, "[]="
    return None


def _rebound_detached(facts: Facts, use: ast.Name, assignment: object) -> bool:
    """The binding of `use` that reaches it is a plain rebinding to a detached value
    (`loss = loss.detach().cpu()`, `loss = loss.item()`) in a block that encloses the use,
    so every path to the use goes through it."""
    if assignment is None:
        return False
    stmt = assignment.stmt  # type: ignore[attr-defined]
    value = assignment.value  # type: ignore[attr-defined]
    if not isinstance(stmt, ast.Assign) or assignment.index is not None or value is None:  # type: ignore[attr-defined]
        return False
    block = facts.parents.get(stmt)
    if block is None or not facts.is_inside(use, block):
        return False
    return detached_value(value)


def _live_container(
    facts: Facts, value: ast.Name, containers: dict[str, list[ast.Subscript]]
) -> bool:
    """`value` still holds the binding whose item was backward()-ed, and that item was not
    replaced by a detached value in between (`output["loss"] = output["loss"].detach()`,
    the packnet-sfm fix)."""
    binding = facts.reaching_assignment(value)
    for item in containers.get(value.id, ()):
        if not isinstance(item.value, ast.Name):
            continue
        if facts.reaching_assignment(item.value) is not binding:
            continue  # the name was rebound (say, to a detached copy) since the backward()
        key = ast.dump(item.slice)
        replaced = any(
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Subscript)
            and isinstance(node.targets[0].value, ast.Name)
            and node.targets[0].value.id == value.id
            and ast.dump(node.targets[0].slice) == key
            and detached_value(node.value)
            and item.lineno <= node.lineno <= value.lineno
            for node in facts.walk_local(facts.scope(value))
        )
        if not replaced:
            return True
    return False


def _holds_graph(
    facts: Facts,
    value: ast.expr,
    loss_names: set[str],
    containers: dict[str, list[ast.Subscript]],
    project_calls: set[ast.Call],
) -> ast.expr | None:
    """What in `value` keeps a graph alive: the loss name (possibly scaled), a container name
    holding one, a call of a helper returning one, or such an element of a dict, tuple or
    list display (`{"loss": loss}`, `(step, loss)`); None for Python numbers and detached
    values."""
    parts = _dict_parts(facts, value)
    if parts and any(
        not isinstance(part, (ast.Dict, ast.Tuple, ast.List, ast.Subscript))
        and _holds_graph(facts, part, loss_names, containers, project_calls) is not None
        for part in parts
    ):
        return value  # an item of a dict of loss parts: `parts["box"]`, `for k, v in parts.items()`
    if isinstance(value, ast.Name):
        if value.id in loss_names or _live_container(facts, value, containers):
            return value
        return None
    if isinstance(value, ast.BinOp) and isinstance(value.op, (ast.Mult, ast.Div)):
        for side in (value.left, value.right):
            if isinstance(side, ast.Name) and side.id in loss_names:
                return side
            if isinstance(side, (ast.Name, ast.Subscript)) and _dict_parts(facts, side):
                held = _holds_graph(facts, side, loss_names, containers, project_calls)
                if held is not None:
                    return held
    if _returns_graph(facts, value, project_calls):
        return value
    elements: list[ast.expr] = []
    if isinstance(value, ast.Dict):
        elements = [v for v in value.values if v is not None]
    elif isinstance(value, (ast.Tuple, ast.List)):
        elements = list(value.elts)
    for element in elements:
        # One level down only: a display's element is a name, a scaled name or a call here.
        if isinstance(element, (ast.Dict, ast.Tuple, ast.List)):
            continue
        held = _holds_graph(facts, element, loss_names, containers, project_calls)
        if held is not None:
            return held
    return None


def _dict_display(facts: Facts, expr: ast.expr) -> ast.Dict | None:
    """The dict display a plain local name is bound to (`parts = {"box": box, "cls": cls}`)."""
    if not isinstance(expr, ast.Name):
        return None
    value = facts.binding_value(expr)
    return value if isinstance(value, ast.Dict) else None


def _dict_iteration(facts: Facts, name: ast.Name) -> tuple[ast.Dict, str] | None:
    """(display, role) when `name` is a target of a loop over a dict display's `items()`
    (role "key" or "value"), `values()` ("value") or `keys()` / the dict itself ("key")."""
    assignment = facts.reaching_assignment(name)
    loop = assignment.loop if assignment is not None else None
    if loop is None:
        return None
    source, method = loop.iter, None
    if isinstance(source, ast.Call) and isinstance(source.func, ast.Attribute) and not source.args:
        source, method = source.func.value, source.func.attr
    display = _dict_display(facts, source)  # type: ignore[arg-type]
    if display is None:
        return None
    target = loop.target
    if method == "items":
        if (
            isinstance(target, ast.Tuple)
            and len(target.elts) == 2
            and all(isinstance(e, ast.Name) for e in target.elts)
        ):
            if target.elts[1].id == name.id:  # type: ignore[attr-defined]
                return display, "value"
            if target.elts[0].id == name.id:  # type: ignore[attr-defined]
                return display, "key"
        return None
    if isinstance(target, ast.Name) and target.id == name.id:
        if method == "values":
            return display, "value"
        if method in (None, "keys"):
            return display, "key"
    return None


def _dict_parts(facts: Facts, value: ast.expr) -> list[ast.expr] | None:
    """The values of a dict display of loss parts that `value` reads: `parts["box"]` (the
    item under that key), `parts[k]` (any item), or the value target of a loop over
    `parts.items()` / `parts.values()` (any item)."""
    if isinstance(value, ast.Subscript):
        display = _dict_display(facts, value.value)
        if display is None:
            return None
        if isinstance(value.slice, ast.Constant):
            return [
                item
                for key, item in zip(display.keys, display.values, strict=True)
                if isinstance(key, ast.Constant) and key.value == value.slice.value
            ]
        return [
            item for key, item in zip(display.keys, display.values, strict=True) if key is not None
        ]
    if isinstance(value, ast.Name):
        found = _dict_iteration(facts, value)
        if found is not None and found[1] == "value":
            return [
                item
                for key, item in zip(found[0].keys, found[0].values, strict=True)
                if key is not None
            ]
    return None


def _fixed_key(facts: Facts, key: ast.expr) -> bool:
    """`key` walks the keys of a dict display (`for name, value in parts.items():
    latest[name] = value`): the same few slots, overwritten every step."""
    return isinstance(key, ast.Name) and (_dict_iteration(facts, key) or (None, ""))[1] == "key"


def _feeds_backward(facts: Facts, scope: ast.AST, accumulator: str) -> bool:
    """True if the accumulator is (part of) something that gets backward()-ed: through
    assignments (`loss = losses[i]`), loops over it (`for opt, loss in zip(opts, losses)`)
    and `accelerator.backward(loss)`-style calls that take it as an argument."""
    derived = {accumulator}

    def mentions(expr: ast.AST) -> bool:
        return any(isinstance(n, ast.Name) and n.id in derived for n in ast.walk(expr))

    for node in facts.walk_local(scope):
        if isinstance(node, ast.Assign) and mentions(node.value):
            for target in node.targets:
                derived.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.For, ast.AsyncFor)) and mentions(node.iter):
            derived.update(n.id for n in ast.walk(node.target) if isinstance(n, ast.Name))
    for node in facts.walk_local(scope):
        if isinstance(node, ast.Call) and facts.is_backward(node):
            subjects = [facts.receiver(node), *node.args]
            if any(subject is not None and mentions(subject) for subject in subjects):
                return True
    return False


def _over_a_built_loader(facts: Facts, loop: ast.AST) -> bool:
    """`for batch in loader:` where the loader's construction is in sight (a name that only
    sounds like one, `minibatches`, may be a handful of per-domain batches of one step)."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return False
    iterable = facts.loop_source(loop)
    kind = facts.kind_of(iterable) if iterable is not None else None
    return kind is not None and kind.kind == "loader" and not kind.by_name


def _outlives_a_step(facts: Facts, loops: list, assignments: list) -> bool:
    """Some loop around the accumulation trains or iterates data once per iteration (a
    step or batch loop) and the accumulator is created outside it, so it lives across steps.
    A list rebuilt every batch, or a loop over layers or classifiers, keeps nothing alive."""
    for loop in loops:
        steps = facts.node_reaches(loop, facts.is_backward) or any(
            facts.backwards_in_other_file(call) for call in facts.calls_in(loop)
        )
        if not steps and not _over_a_built_loader(facts, loop):
            continue
        if not any(facts.is_inside(a.stmt, loop) for a in assignments):
            return True
    return False


def _used_as_tensor_later(facts: Facts, scope: ast.AST, accumulator: str, after: int) -> bool:
    for node in facts.walk_local(scope):
        if getattr(node, "lineno", 0) <= after:
            continue
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == accumulator
            and node.attr in TENSOR_USES
        ):
            return True
        if isinstance(node, ast.Call) and (facts.call_qualname(node) or "").startswith("torch."):
            if any(isinstance(a, ast.Name) and a.id == accumulator for a in node.args):
                return True
    return False


@rule(
    "TL206",
    "graph-kept-alive",
    "W",
    "Loss tensor accumulated across iterations keeps every graph alive",
    fix="safe",
)
def graph_kept_alive(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    A loss (a tensor attached to the autograd graph) accumulated across loop iterations:
    `losses.append(loss)`, `total += loss`, `history[step] = loss`, `totals["ce"] += ce`,
    without `.item()`, `.detach()` or `float(...)`; also through containers: a dict or tuple
    holding the loss appended to a list (`history.append({"loss": loss})`), a step's output
    dict whose `output["loss"]` is backward()-ed kept in a list, the loss a project helper
    (`train_step`, in this file or another) returns after backward()-ing it, and the items
    of a dict of loss parts (`for name, part in parts.items(): totals[name] += part`).

    ## Why it is wrong
    Each stored loss keeps its whole computation graph, activations included, alive. Memory
    grows every iteration until the run dies with an out-of-memory error hours in. Summing
    losses that are backward()-ed together afterwards is intended and is not reported, nor is
    a slot under a constant key (`latest["d"] = d_loss`, or `latest[name] = part` over a dict's
    keys) that every step overwrites, nor a loss name rebound to a detached copy before it
    is stored (`loss = loss.detach().cpu()`).

    ## Example
    ```python
    total = 0
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        total += loss             # TL206
    ```

    ## Fix
    Store a Python number: `total += loss.item()` (or `loss.detach()` to keep a tensor). The
    fix adds `.item()`; it is offered as unsafe when the accumulator is later used as a tensor.
    """
    scopes = [facts.tree, *facts.functions.values()]
    scopes += [m for c in facts.classes.values() for m in c.methods.values()]
    project_calls = set(facts.project_calls)
    # Only scopes that hold a backward(), a loss call or a project call can hold a loss: the
    # others are not walked at all (most functions of a file are neither).
    lossy = {
        facts.scope(call)
        for call in facts.calls
        if call in project_calls
        or call in facts.loss_call_nodes
        or (facts.method_name(call) == "backward" and not call.args)
    }
    for scope in scopes:
        if scope not in lossy:
            continue
        loss_names, containers = _loss_names(facts, scope, project_calls)
        if not loss_names and not containers:
            continue
        for node in facts.walk_local(scope):
            if not isinstance(node, ast.stmt):
                continue
            found = _accumulation(node)
            if found is None:
                continue
            accumulator, value, how = found
            if how == "[]=" and _fixed_key(facts, node.targets[0].slice):  # type: ignore[attr-defined]
                continue
            loss = _holds_graph(facts, value, loss_names, containers, project_calls)
            loops = facts.enclosing_loops(node)
            if loss is None or not loops or facts.in_no_grad(node):
                continue
            assignments = facts.assignments_of(accumulator, scope)  # type: ignore[arg-type]
            if not assignments or not _outlives_a_step(facts, loops, assignments):
                continue
            if how == "+=" and accumulator in loss_names:
                continue
            if _feeds_backward(facts, scope, accumulator):
                continue
            if isinstance(loss, ast.Name):
                loss_assignment = facts.reaching_assignment(loss)
                if loss_assignment is not None and facts.in_no_grad(loss_assignment.stmt):
                    continue
                if _rebound_detached(facts, loss, loss_assignment):
                    continue  # `loss = loss.detach().cpu()` before `total += loss`
            if isinstance(loss, ast.Call):
                label = f"{facts.source.segment(loss.func)}(...)"
            elif isinstance(loss, ast.Name):
                label = loss.id
            else:
                label = facts.source.segment(loss)
            if isinstance(loss, ast.Name) and loss.id in containers:
                # A container (a step's output dict): `.item()` on it is no fix.
                yield Hit(
                    node,
                    f"`{label}` holds a loss still attached to its autograd graph and is kept "
                    f"in `{accumulator}`; store `.item()` or `.detach()` values instead",
                    None,
                )
                continue
            fix = None
            from_parts = not isinstance(loss, ast.Call) and not (
                isinstance(loss, ast.Name) and loss.id in loss_names
            )
            if how in ("append", "+=") and value is loss and not from_parts:
                applicability = (
                    "unsafe"
                    if _used_as_tensor_later(facts, scope, accumulator, node.lineno)
                    else "safe"
                )
                fix = Fix(
                    applicability,  # type: ignore[arg-type]
                    f"Accumulate `{label}.item()`",
                    (
                        insert_at(
                            loss.end_lineno,
                            facts.source.column(loss.end_lineno, loss.end_col_offset),
                            ".item()",
                        ),
                    ),  # type: ignore[arg-type]
                )
            if isinstance(loss, ast.Call):
                message = (
                    f"`{label}` returns a loss still attached to its autograd graph and it is "
                    f"accumulated into `{accumulator}`; use `.item()` or `.detach()` on it"
                )
            else:
                message = (
                    f"`{label}` is accumulated into `{accumulator}` with its autograd graph; "
                    f"use `{label}.item()` or `{label}.detach()`"
                )
            yield Hit(node, message, fix)
