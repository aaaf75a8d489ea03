"""TL203 train-mode-not-restored: something inside the epoch (or batch) loop puts a model the
loop trains in eval mode, and nothing calls train() again before its training forward runs.

In: `Facts`, through the shared mode helpers of `_modes.py`. Out: `Hit`s at the call that leaves
eval mode, with an unsafe fix inserting `train()`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.findings import Fix, Related
from torchls.analysis.layers import mode_sensitive
from torchls.analysis.modes import built_in_eval_mode, run_module, runs_generation
from torchls.analysis.registry import Hit, exemption, rule
from torchls.analysis.rules._edits import insert_line_after, insert_line_before
from torchls.analysis.rules._modes import _trainer, modes_of
from torchls.analysis.rules._modes_memos import BackpropagatedCalls, TrainingForwards
from torchls.analysis.rules._modes_step_helpers import forwards_in_step_helpers
from torchls.analysis.rules._modes_trainer_hooks import evals_in_training_steps


@exemption("TL203", "neg_inference_only_flag.py")
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
    `model.eval()` (directly or inside a helper such as `evaluate(model)`, however deep, in
    this file or in another project module whose helper switches it on every call, also
    through an object such as `ctx.model`, or in a method of an object that holds the trainer,
    `self.hook = Hook(self)` switching `self.trainer.model`) runs inside the epoch loop, while
    `model.train()` is called only before the loop: from the second epoch on, the model trains
    in eval mode. Models switched together count one by one: a loop over them
    (`for net in (encoder, decoder): net.eval()`) or a helper given a list of them
    (`set_mode("eval", [encoder, decoder])`) switches each listed model. A validation every
    N batches from inside the batch loop is reported the same way, also when the training
    forward runs in a loss helper given the model (`loss = loss_fn(model, x)` ...
    `loss.backward()`), or in a step helper the loop hands each batch to (`self.update(x, y)`
    or `descend(model, opt, x, y)`, whose body runs the model and backwards) when a later call
    of the same loop (a score every N batches, a metric pass) leaves that model in eval mode
    for the next step. Models the
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
    A loop out of sight counts too: in a subclass of a transformers or trl `Trainer`, whose
    loop puts the model in train mode and then runs `compute_loss(model, inputs)` for every
    step, an `eval()` in that hook (or a method of the class it hands the model to) on the
    model, on `self.model`, or on an attribute some method binds to `self.model` (a teacher
    that may be the student itself), followed by a read of the model outside `no_grad`
    with no `train()` before it, is reported: that step trains in eval mode.

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
            first = loops[0].body[0]
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
                _switched_elsewhere(facts, setter),
            )
    yield from _evals_in_library_steps(facts)


def _switched_elsewhere(facts: Facts, setter: ast.AST) -> tuple[Related, ...]:
    """The `eval()` inside a helper of another file that the call `setter` runs."""
    target = facts.callee(setter) if isinstance(setter, ast.Call) else None
    if target is None or target[0] is facts:
        return ()
    owner, function, _ = target
    switch = next((c for c in owner.calls_in(function) if owner.method_name(c) == "eval"), None)
    if switch is None:
        return ()
    return (Related(owner.source.span(switch), "eval() called here", owner.filename),)


def _evals_in_library_steps(facts: Facts) -> Iterator[Hit]:
    """`eval()` on the trained model (or an attribute bound to it) in a Trainer's loss hook
    (`_modes_trainer_hooks.py`): the library's loop trains every step in eval mode."""
    for switch, alias in evals_in_training_steps(facts):
        key = facts.source.segment(facts.receiver(switch))
        same = f" (bound to `self.model` on line {alias.lineno})" if alias is not None else ""
        yield Hit(
            switch,
            f"`{key}`{same} is the model the Trainer's loop trains, and this eval() runs in "
            "its loss hook on every training step before the model runs: it trains in eval "
            "mode",
            None,
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
        if loops and not runs_generation(facts, call):  # decoding samples is no training forward
            yield call, run_module(call), modes, loops
    for site, held in analysis.at_site.items():
        loops = [loop for loop in facts.enclosing_loops(site) if loop in facts.training_loops]
        if not loops or site not in _backpropagated_calls(facts, loops[0]):
            continue
        for position, argument in enumerate(site.args):
            key = facts.key(argument)
            if key in held and _runs_argument(facts, site, position):
                yield site, argument, held[key], loops
    yield from forwards_in_step_helpers(facts)


def _backpropagated_calls(facts: Facts, loop: ast.AST) -> set[ast.Call]:
    """Calls in `loop` whose value a backward() of the loop runs through, followed through
    local assignments (every binding an `if` may choose) and the operands around them."""
    cache = facts.get(BackpropagatedCalls).by_loop
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
        for assignment in facts.assignments_of(name, scope):
            if facts.is_inside(assignment.stmt, loop):
                return False  # the test may change inside the loop
    return True


@exemption("TL203", "neg_mode_picked_per_epoch_by_branch.py")
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
    cache = facts.get(TrainingForwards).by_loop
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
