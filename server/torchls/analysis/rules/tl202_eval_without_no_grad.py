"""TL202 eval-without-no-grad: a model in eval() mode runs in an evaluation loop with autograd
still recording, outside `no_grad` / `inference_mode`, with nothing there needing gradients.
In: `Facts` (other project files too), through the mode helpers of `_modes.py`. Out: `Hit`s at
the forward (or the helper call), with an unsafe fix wrapping the loop in `no_grad`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts, FunctionNode
from torchls.analysis.findings import Fix, Related
from torchls.analysis.modes import run_key, runs_generation
from torchls.analysis.queries.flow import guard_of
from torchls.analysis.queries.vocabulary import argument_at
from torchls.analysis.registry import Hit, exemption, rule
from torchls.analysis.rules._edits import insert_at
from torchls.analysis.rules._modes import (
    _evaluating_calls,
    _model_calls_in_eval,
    _nested_helper_forwards,
    _switched_to_eval_by_flag,
    evaluation_context,
    modes_of,
)
from torchls.analysis.rules._modes_helpers import _helper_forwards_in_evaluation
from torchls.analysis.rules._modes_methods import eval_loops_through_own_methods
from torchls.analysis.rules._modes_paths import eval_loops_through_model_methods


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
    may disable gradients itself and is not reported (an experiment or command-line
    library's own, such as sacred's `@ex.main` or `@hydra.main`, only registers the
    function and does not count), nor is a loop that asks autograd for
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
    call, unless the helper turns gradients off itself. An explicit `model.forward(...)`
    runs the model like `model(...)` and counts as its forward everywhere above. A step
    method that a batch loop calls, which puts the model in `eval()` itself and then runs it
    through a further helper (`self.module_.eval()`, then `self.infer(x)`), is reported at
    that helper call, when neither the loop nor its function trains directly. A loop over
    the batches of each item an outer loop iterates (`for split in splits:` then
    `for batch in batches(split):`) feeds the model what the outer loop iterates. A loop that
    puts the model in `eval()` and hands it, with each fetched batch, to a helper calling a
    method of the model's class (`model.predict_step(x)`, in this file or another) that
    runs the model's own forward (`self(x)`, a few methods down) is reported at the helper
    call. So is a loop that feeds each batch to a method of the model itself
    (`self.model.predict(batch)`, not one of `nn.Module`'s own) after `self.model.eval()`,
    when the model's class is out of sight (handed to the constructor) or its method
    reaches its forward; so does a model's submodule or method (`self.gen.encoder(x)`), also
    two `self.` helpers down (`self.total_loss(b)` -> `self.part_loss(b)`). Decoding with
    transformers' `generate()` turns gradients off itself and is not reported.

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
        if not modes or runs_generation(facts, call):
            continue  # transformers' generate() turns gradients off itself
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
    reported: set[ast.Call] = set()  # one finding per site: a helper's model seen twice
    for site, loop, key, method, owner, forward in eval_loops_through_model_methods(facts):
        if facts.in_no_grad(site) or facts.under_unknown_decorator(site):
            continue
        if _needs_gradients(facts, loop) or facts.parameters_frozen_before(key, loop):
            continue
        where = owner.filename if owner is not facts else None
        reported.add(site)
        yield Hit(
            site,
            f"`{key}` is in eval mode and this call runs its forward through "
            f"`{facts.source.segment(method.func)}` (line {method.lineno}) with gradients "
            "enabled, for every batch; wrap the loop in `torch.no_grad()`",
            _wrap_in_no_grad(facts, loop),
            (Related(owner.source.span(forward), "the model's forward runs here", where),),
        )
    for site, context, function, call, key, modes in _helper_forwards_in_evaluation(facts):
        if site in reported or not modes or any(fact.mode != "eval" for fact in modes):
            continue
        if runs_generation(facts, call):
            continue
        if facts.in_no_grad(site) or facts.under_unknown_decorator(site):
            continue
        if facts.grad_disabling_decorator(function) or _grad_switched_around(facts, function, call):
            continue  # the helper turns gradients off (or may) around its forward
        if _needs_gradients(facts, context) or _needs_gradients(facts, function):
            continue
        if facts.parameters_frozen_before(key, context) or facts.forward_may_disable_grad(call):
            continue
        reported.add(site)
        yield Hit(
            site,
            f"`{function.name}` runs `{key}` (line {call.lineno}) for this evaluation loop with "
            "gradients enabled; wrap the loop in `torch.no_grad()` or `torch.inference_mode()`",
            _wrap_in_no_grad(facts, context),
        )
    yield from _step_helper_forwards_with_grad(facts)
    for call, loop, key in eval_loops_through_own_methods(facts):
        hit = _graph_built_for_nothing(facts, call, loop, key)
        if hit is not None:
            yield hit


def _step_helper_forwards_with_grad(facts: Facts) -> Iterator[Hit]:
    """A batch loop's step method puts the model in eval() and runs it through a further
    helper (`self.infer(x)`) with autograd on: reported at the step's call of that helper,
    where no_grad belongs. Quiet when anything on the way turns gradients off (or may), or
    needs them."""
    for site, context, step, inner, helper, call, key, modes in _nested_helper_forwards(facts):
        if not modes or any(fact.mode != "eval" for fact in modes):
            continue
        if runs_generation(facts, call):
            continue
        if any(facts.in_no_grad(n) or facts.under_unknown_decorator(n) for n in (site, inner)):
            continue
        if any(facts.grad_disabling_decorator(f) for f in (step, helper)):
            continue
        if _grad_switched_around(facts, step, inner) or _grad_switched_around(facts, helper, call):
            continue
        if any(_needs_gradients(facts, node) for node in (context, step, helper)):
            continue
        if facts.parameters_frozen_before(key, inner) or facts.forward_may_disable_grad(call):
            continue
        yield Hit(
            inner,
            f"`{key}` is in eval mode here and `{helper.name}` runs it (line {call.lineno}) with "
            f"gradients enabled, for every batch of the loop on line {context.lineno}; wrap "
            "this call in `torch.no_grad()`",
            None,
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
            key = run_key(facts, call)
            loops = facts.enclosing_loops(call)
            if key is None or not loops or (id(function), key) in reported:
                continue
            modes = entry.get(key)
            in_eval = bool(modes) and all(fact.mode == "eval" for fact in modes or ())
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


@exemption("TL202", "neg_shared_epoch_loop_grad_follows_flag.py")
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


@exemption("TL202", "neg_attack_loop_needs_gradients.py")
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
