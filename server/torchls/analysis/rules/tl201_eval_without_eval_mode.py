"""TL201 eval-without-eval-mode: an evaluation loop (recognised by its loader, its function's
name or its behaviour) runs a model that every path leaves in training mode, or that a train()
inside the loop switches back.

In: `Facts`, through the shared mode helpers of `_modes.py`. Out: `Hit`s at the model call (or at
the call of an in-file helper that runs it), with an unsafe fix inserting `eval()`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.findings import Fix
from torchls.analysis.layers import built_mode_sensitive, mode_sensitive, runs_no_module
from torchls.analysis.modes import owning_model, run_key
from torchls.analysis.queries.vocabulary import argument_at
from torchls.analysis.registry import Hit, exemption, rule
from torchls.analysis.rules._edits import insert_line_after, insert_line_before
from torchls.analysis.rules._modes import (
    _evaluating_calls,
    _model_calls_in_eval,
    _switched_to_eval_by_flag,
    modes_of,
)
from torchls.analysis.rules._modes_helpers import _helper_forwards_in_evaluation
from torchls.analysis.rules._modes_scripts import unswitched_loaded_modules


@exemption("TL201", "neg_train_mode_for_statistics_pass.py")
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


@exemption("TL201", "neg_sampler_built_on_the_evaluated_network.py")
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
    model is in at that call and reported there. An explicit `model.forward(...)` runs the
    model like `model(...)` and is judged the same way, and so is `model.generate(...)` of a
    transformers or peft model (decoding never calls `eval()`, it only turns gradients off).
    The mode follows a model through in-file helpers several calls down (`fit` puts
    `net = ctx.model` in train(), then `score(ctx)` hands `ctx.model` to a decoding helper),
    and a helper looping over a loader that an epoch loop calls after its batch loop, on a
    result no training reads, is evaluation, not part of training. A script (or a function
    that never trains) that takes a module from a loader out of sight (`net = bundle[
    "encoder"].cpu()`), only moves it and runs it under `no_grad` on what a loop iterates,
    with nothing in the file ever switching its mode or handed it, is reported too: a module
    starts in training mode. Loaders that may keep a saved mode (`torch.load`,
    `torch.jit.load`, `from_pretrained`, `load_from_checkpoint`) are left alone.

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
    yield from _loaded_out_of_sight(facts)
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


def _loaded_out_of_sight(facts: Facts) -> Iterator[Hit]:
    """A module from a loader out of sight, only moved and run under `no_grad` over the
    data a loop iterates, that nothing in the file ever switches (`_modes_scripts.py`)."""
    at_call = modes_of(facts).at_call
    for call, loop, key in unswitched_loaded_modules(facts):
        if any(fact.mode != "unknown" for fact in at_call.get(call, ())):
            continue  # the mode analysis knows its mode: judged above
        edit = insert_line_before(facts, loop, f"{key}.eval()")
        yield Hit(
            call,
            f"`{key}` is run for inference here, but nothing ever puts it in eval mode (a "
            f"module starts in training mode); call `{key}.eval()` before the loop",
            Fix("unsafe", f"Insert `{key}.eval()` before the inference loop", (edit,)),
        )


@exemption("TL201", "neg_mode_free_modules_handed_to_validate.py")
def _mode_free(facts: Facts, call: ast.Call, modes: frozenset) -> bool:
    """No layer of the module `call` runs reads the mode: known from its binding here, or,
    for a module handed to this helper, from the construction its mode facts point to
    (`criterion = JointsMSELoss()` in the caller)."""
    if not mode_sensitive(facts, owning_model(facts, call) or call.func):
        return True
    built = [fact.setter for fact in modes]
    return bool(built) and all(
        isinstance(setter, ast.Call)
        and setter in facts.parents
        and facts.method_name(setter) not in ("train", "eval")
        and not built_mode_sensitive(facts, setter)
        for setter in built
    )


@exemption("TL201", "neg_target_smoother_module.py")
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


@exemption("TL201", "neg_torch_layer_ignores_mode.py")
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


@exemption("TL201", "neg_loss_module_on_explicit_forward.py")
def _applied_to_outputs(facts: Facts, call: ast.Call, key: str) -> bool:
    """Some argument of `call` is the output of another module's forward (`criterion(
    model(x), y)`, or through a local): the called module post-processes a model's outputs,
    like a loss written as an `nn.Module`."""
    for argument in [*call.args, *(k.value for k in call.keywords)]:
        for origin in facts.origins(argument):
            for node in (origin.node, *origin.via):
                if not isinstance(node, ast.Call) or node not in facts.parents:
                    continue  # only calls of this file
                module: ast.expr | None = node.func
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
    if mode_sensitive(facts, owning_model(facts, call) or call.func):
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
            key = run_key(facts, call)
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
