"""TL4xx: the optimizer, the learning-rate scheduler and mixed precision (GradScaler, autocast).

In: the file's `Facts`. Out: hits for schedulers stepped in the wrong place or at the wrong
rate, GradScaler steps without `update()`, clipping of still-scaled gradients, optimizers stepped
twice, deprecated AMP entry points, `ReduceLROnPlateau.step()` without its metric, and clipping
after the step. Helpers of other files' functions are read from their summaries
(`Facts.call_summary`): an engine module that steps the optimizer, a `train_step` elsewhere.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.findings import Edit, Fix
from torchls.analysis.registry import Hit, rule
from torchls.analysis.rules._edits import (
    delete_statement_line,
    insert_at,
    insert_line_after,
    insert_line_before,
    replace_node,
)
from torchls.analysis.schedulers import (
    call_argument,
    constructor_related,
    hand_written_scheduler,
    schedule_design,
    scheduler_type,
)

CLIP_FUNCTIONS = (
    "torch.nn.utils.clip_grad_norm_",
    "torch.nn.utils.clip_grad_value_",
    "torch.nn.utils.clip_grad_norm",
    "torch.nn.utils.clip_grad.clip_grad_norm_",
    "torch.nn.utils.clip_grad.clip_grad_value_",
)
_FUNCTION_TYPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.Module)
_LOOP_TYPES = (ast.For, ast.AsyncFor, ast.While)


def clips_nothing(facts: Facts, clip: ast.Call) -> bool:
    """`clip_grad_norm_(params, float("inf"))`: only measures the norm (for logging)."""
    limit = next((k.value for k in clip.keywords if k.arg in ("max_norm", "clip_value")), None)
    if limit is None and len(clip.args) > 1:
        limit = clip.args[1]
    if limit is None:
        return False
    text = facts.source.segment(limit).replace(" ", "").lower()
    return text.endswith((".inf", "inf')", 'inf")')) or text in ("inf", "math.inf")


# ---------------------------------------------------------------------- statement helpers
def block_of(facts: Facts, stmt: ast.stmt) -> list[ast.stmt] | None:
    """The statement list that directly contains `stmt` (a body, an else, a handler...)."""
    parent = facts.parents.get(stmt)
    if parent is None:
        return None
    blocks: list[list] = [getattr(parent, n, None) or [] for n in ("body", "orelse", "finalbody")]
    blocks += [h.body for h in getattr(parent, "handlers", ()) or ()]
    blocks += [c.body for c in getattr(parent, "cases", ()) or ()]
    for block in blocks:
        if isinstance(block, list) and any(item is stmt for item in block):
            return block
    if isinstance(parent, (ast.ExceptHandler, ast.match_case)):
        return parent.body
    return None


def index_in(block: list[ast.stmt], stmt: ast.stmt) -> int:
    return next(i for i, item in enumerate(block) if item is stmt)


def owns_lines(facts: Facts, stmt: ast.stmt) -> bool:
    """True when nothing but `stmt` (and a trailing comment) sits on its lines."""
    return delete_statement_line(facts, stmt) is not None


def movable(facts: Facts, stmt: ast.stmt) -> Edit | None:
    """The edit deleting `stmt`, when it can go without leaving an empty block."""
    block = block_of(facts, stmt)
    if block is None or len(block) < 2:
        return None
    return delete_statement_line(facts, stmt)


def statement_text(facts: Facts, stmt: ast.stmt) -> str:
    return facts.source.segment(stmt)


def names_in(expr: ast.AST) -> set[str]:
    """Identifiers read in `expr`: names and attribute names."""
    found: set[str] = set()
    for node in ast.walk(expr):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
    return found


def loop_counters(facts: Facts, loop: ast.AST) -> set[str]:
    """Names a loop iterates with or counts with: its targets and names `+=`-ed in its body."""
    found: set[str] = set()
    target = getattr(loop, "target", None)
    if target is not None:
        found |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    # The scope's node list (built once by the facts) is much cheaper to filter than walking
    # the loop's subtree again for every scheduler step asked about.
    scope = loop if loop in facts.scope_nodes else facts.scope(loop)
    for node in facts.scope_nodes.get(scope, ()):
        if isinstance(node, ast.AugAssign) and facts.is_inside(node, loop):
            found |= names_in(node.target)
    return found


def position(node: ast.AST) -> tuple[int, int]:
    return (node.lineno, node.col_offset)  # type: ignore[attr-defined]


def method_calls(facts: Facts, method: str) -> list[ast.Call]:
    """Calls of `.method(...)` in file order (the index lives on the facts)."""
    return facts.method_calls(method)


def _statement_of_call(facts: Facts, call: ast.Call) -> ast.stmt | None:
    """The statement when it is nothing but `call` (`scheduler.step()` on its own)."""
    parent = facts.parents.get(call)
    return parent if isinstance(parent, ast.Expr) else None


# ---------------------------------------------------------------------- training vocabulary
def is_scheduler_step(facts: Facts, call: ast.Call) -> bool:
    return facts.method_name(call) == "step" and facts.is_kind(facts.receiver(call), "scheduler")


def is_scaler_call(facts: Facts, call: ast.Call, method: str) -> bool:
    return facts.method_name(call) == method and facts.is_kind(facts.receiver(call), "scaler")


def is_plain_optimizer_step(facts: Facts, call: ast.Call) -> bool:
    """`optimizer.step()` (not `scaler.step(optimizer)`)."""
    return facts.method_name(call) == "step" and facts.is_kind(facts.receiver(call), "optimizer")


def is_optimizer_step(facts: Facts, call: ast.Call) -> bool:
    return facts.optimizer_of_step(call) is not None


def _scheduler_optimizer_key(facts: Facts, constructors: list[ast.Call]) -> str | None:
    keys = {facts.key(call_argument(c, "optimizer", 0)) for c in constructors}
    return keys.pop() if len(keys) == 1 else None


# ---------------------------------------------------------------------- TL401
@rule(
    "TL401",
    "scheduler-before-optimizer",
    "W",
    "scheduler.step() runs before the first optimizer.step() of the loop",
    fix="unsafe",
)
def scheduler_before_optimizer(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    `scheduler.step()` called in a loop before that loop's `optimizer.step()` (directly or in a
    helper such as `train_one_epoch(...)`, also one in another project module): at the top of
    the epoch loop before the batches, at the top of the batch loop before the update, or at
    the top of a helper that runs the batch loop itself. A scheduler of the project's own (a
    class with no base outside the project, whose `step()` typically writes the rate for the
    coming update into the param groups) follows its author's contract and is not reported.

    ## Why it is wrong
    Since PyTorch 1.1 the scheduler must be stepped *after* the optimizer. Stepping it first
    moves the learning rate on before a single update used the initial value: the first value
    of the schedule (the first epoch of a StepLR, the first warmup step) is skipped, and the
    whole schedule runs one step early. PyTorch warns about it at run time.

    ## Example
    ```python
    for epoch in range(epochs):
        scheduler.step()                 # TL401: before any optimizer.step() of the epoch
        train_one_epoch(model, loader, optimizer)
    ```

    ## Fix
    Step the scheduler after the optimizer: at the end of the epoch loop (after the batch
    loop) for epoch schedules, right after `optimizer.step()` for per-batch ones. The quick fix
    moves the call after the last statement that steps the optimizer; it is unsafe because it
    changes the learning rate of every epoch.
    """
    for call in method_calls(facts, "step"):
        if not is_scheduler_step(facts, call) or call.args or call.keywords:
            continue
        stmt = _statement_of_call(facts, call)
        loops: list[ast.AST] = list(facts.enclosing_loops(call))
        if stmt is not None and not loops:
            # At the top of a helper that runs the batch loop (`train_one_epoch`): the helper
            # is one epoch, so its body plays the part of the epoch loop's.
            function = facts.enclosing_function(call)
            if function is not None and facts.contains_training_batch_loop(function):
                loops = [function]
        if stmt is None or not loops:
            continue
        found = scheduler_type(facts, facts.receiver(call))
        if found is None and hand_written_scheduler(facts, facts.receiver(call)):
            continue  # its own step() contract: setting the rate for the coming update, say
        optimizer_key = _scheduler_optimizer_key(facts, found[1]) if found else None

        def steps_optimizer(node: ast.AST, wanted: str | None = optimizer_key) -> bool:
            def predicate(candidate: ast.Call) -> bool:
                optimizer = facts.optimizer_of_step(candidate)
                if optimizer is None:
                    return _steps_in_other_file(facts, candidate)
                key = facts.key(optimizer)
                return wanted is None or key is None or key == wanted

            return facts.node_reaches(node, predicate)

        verdict = _scheduler_position(facts, stmt, loops[0], steps_optimizer)
        if verdict is None:
            continue
        later = verdict if verdict is not stmt else None
        scheduler_text = facts.source.segment(facts.receiver(call))  # type: ignore[arg-type]
        fix = None
        deletion = movable(facts, stmt)
        if later is not None and deletion is not None and owns_lines(facts, later):
            fix = Fix(
                "unsafe",
                f"Move `{scheduler_text}.step()` after the optimizer step",
                (deletion, insert_line_after(facts, later, statement_text(facts, stmt))),
            )
        yield Hit(
            call,
            f"`{scheduler_text}.step()` runs before the optimizer is stepped in this loop: the "
            "first value of the schedule is skipped; step the scheduler after the optimizer",
            fix,
        )


def _steps_in_other_file(facts: Facts, call: ast.Call) -> bool:
    """`call` runs a function of another project file whose summary steps an optimizer
    (`engine.train_one_epoch(...)`); in-file helpers are followed by `node_reaches` itself."""
    asked = facts.call_summary(call)
    return asked is not None and asked[2] is not facts and asked[0].steps_optimizer


def _scheduler_position(
    facts: Facts, stmt: ast.stmt, loop: ast.AST, steps_optimizer: Callable[[ast.AST], bool]
) -> ast.stmt | None:
    """For a `scheduler.step()` statement inside `loop`: the last later sibling statement that
    steps the optimizer when the scheduler is stepped first in the iteration; else None."""
    counters = loop_counters(facts, loop)
    current: ast.stmt = stmt
    later_sibling: ast.stmt | None = None
    found_later = False
    while True:
        block = block_of(facts, current)
        if block is None:
            return None
        index = index_in(block, current)
        if any(steps_optimizer(earlier) for earlier in block[:index]):
            return None
        if not found_later:
            later = [s for s in block[index + 1 :] if steps_optimizer(s)]
            if later:
                found_later = True
                if current is stmt:
                    later_sibling = later[-1]
        parent = facts.parents.get(current)
        if parent is loop:
            break
        if parent is None or isinstance(parent, _FUNCTION_TYPES):
            return None
        if isinstance(parent, _LOOP_TYPES):
            return None
        if isinstance(parent, ast.If) and not found_later and names_in(parent.test) & counters:
            return None  # `if epoch > 0: scheduler.step()` skips the first iteration on purpose
        current = parent  # type: ignore[assignment]
    if not found_later:
        return None
    return later_sibling if later_sibling is not None else stmt


# ---------------------------------------------------------------------- TL402
def _per_batch_loop(facts: Facts, call: ast.Call) -> ast.AST | None:
    """The outermost training batch loop `call` runs in, in its own function."""
    loops = [loop for loop in facts.enclosing_loops(call) if facts.is_training_batch_loop(loop)]
    return loops[-1] if loops else None


def _optimizer_step_inside(facts: Facts, node: ast.AST) -> bool:
    return facts.node_reaches(node, lambda c: is_optimizer_step(facts, c))


def _stepped_per_batch(facts: Facts, call: ast.Call) -> tuple[bool, ast.AST | None]:
    """(True, batch loop) when `call` runs once per training batch (the loop is None when the
    call sits in a helper called from batch loops)."""
    loop = _per_batch_loop(facts, call)
    if loop is not None:
        counters = loop_counters(facts, loop)
        for condition in facts.conditions_between(call, loop):
            mentions_len = any(
                isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "len"
                for n in ast.walk(condition.test)
            )
            if (names_in(condition.test) & counters or mentions_len) and not (
                _optimizer_step_inside(facts, condition)
            ):
                return False, None  # once per epoch / per evaluation, not per batch
        return True, loop
    function = facts.enclosing_function(call)
    if function is None or facts.enclosing_loops(call):
        return False, None
    sites = facts.call_sites(function)
    if not sites or not all(_per_batch_loop(facts, site) is not None for site in sites):
        return False, None
    if any(not _optimizer_step_inside(facts, c) for c in facts.conditions_between(call, function)):
        return False, None
    return True, None


def _stepped_per_epoch(facts: Facts, call: ast.Call) -> bool:
    """True when `call` runs once per epoch: after (not inside) the training batch loop."""
    if _per_batch_loop(facts, call) is not None:
        return False
    loops = facts.enclosing_loops(call)
    if loops:
        loop = loops[0]
        if facts.is_training_batch_loop(loop) or loop in facts.batch_loops:
            return False
        return facts.contains_training_batch_loop(loop) or facts.calls_training_helper(loop)
    function = facts.enclosing_function(call)
    if function is None or not facts.contains_training_batch_loop(function):
        return False
    sites = facts.call_sites(function)
    return bool(sites) and all(
        facts.enclosing_loops(site) and _per_batch_loop(facts, site) is None for site in sites
    )


@rule(
    "TL402",
    "epoch-scheduler-stepped-per-batch",
    "W",
    "Scheduler stepped at the wrong rate (epoch schedule per batch, or the reverse)",
    fix="unsafe",
)
def epoch_scheduler_stepped_per_batch(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    An epoch-based scheduler (`StepLR`, `MultiStepLR`, `ExponentialLR`, `ReduceLROnPlateau`,
    or a `CosineAnnealingLR` whose `T_max` is a number of epochs) stepped inside the training
    batch loop; or a per-batch schedule (`OneCycleLR` sized with `steps_per_epoch` or a step
    count, `CyclicLR`) stepped once per epoch. Warmup `LambdaLR`s, HF schedules and any
    schedule sized in steps (`T_max=epochs * len(loader)`) are per-batch by design and are not
    reported; when the unit of the schedule cannot be told, nothing is reported. A scheduler
    that a training function receives as a parameter is the one its in-file callers pass.

    ## Why it is wrong
    A schedule's length is counted in calls to `step()`. A `StepLR(step_size=30)` meant as
    "every 30 epochs" stepped every batch decays the learning rate every 30 *batches*: after a
    few hundred batches the learning rate is effectively zero and training stalls. The
    reverse, a `OneCycleLR` sized in batches stepped once per epoch, never leaves its warmup.

    ## Example
    ```python
    scheduler = StepLR(optimizer, step_size=30, gamma=0.1)
    for epoch in range(epochs):
        for x, y in train_loader:
            ...
            optimizer.step()
            scheduler.step()        # TL402: epoch schedule stepped per batch
    ```

    ## Fix
    Step epoch schedules once per epoch, after the batch loop; step per-batch schedules right
    after `optimizer.step()`. For an epoch schedule stepped per batch, the quick fix moves the
    call after the batch loop; it is unsafe because it changes the learning rate.
    """
    for call in method_calls(facts, "step"):
        if not is_scheduler_step(facts, call):
            continue
        found = scheduler_type(facts, facts.receiver(call))
        if found is None:
            continue
        name, constructors = found
        designs = {schedule_design(facts, c) for c in constructors}
        if len(designs) != 1:
            continue
        design = designs.pop()
        scheduler_text = facts.source.segment(facts.receiver(call))  # type: ignore[arg-type]
        if design == "epoch":
            per_batch, loop = _stepped_per_batch(facts, call)
            if not per_batch:
                continue
            yield Hit(
                call,
                f"`{scheduler_text}` ({name}) is an epoch schedule, but it is stepped every "
                "batch: the schedule runs as many times too fast as there are batches per "
                "epoch; step it once per epoch, after the batch loop",
                _move_after_loop(facts, call, loop),
                constructor_related(facts, constructors),
            )
        elif design == "batch":
            if not _stepped_per_epoch(facts, call):
                continue
            yield Hit(
                call,
                f"`{scheduler_text}` ({name}) is sized in batches, but it is stepped once per "
                "epoch: the schedule barely moves; step it after every `optimizer.step()`",
                related=constructor_related(facts, constructors),
            )


def _move_after_loop(facts: Facts, call: ast.Call, loop: ast.AST | None) -> Fix | None:
    stmt = _statement_of_call(facts, call)
    if stmt is None or not isinstance(loop, ast.stmt) or not owns_lines(facts, loop):
        return None
    deletion = movable(facts, stmt)
    if deletion is None:
        return None
    text = statement_text(facts, stmt)
    return Fix(
        "unsafe",
        "Move the scheduler step after the batch loop",
        (deletion, insert_line_after(facts, loop, text)),
    )


# ---------------------------------------------------------------------- TL403
def _iteration_of(facts: Facts, node: ast.AST) -> ast.AST | None:
    """The loop that is one training iteration around `node`: the innermost enclosing loop that
    reaches backward(), else the innermost loop that is not a loop over the optimizers a
    `scaler.step(optimizer)` steps (`for optimizer in self.optimizers: ...` runs inside one
    iteration, whose update may come after it)."""
    loops = facts.enclosing_loops(node)
    for loop in loops:
        if facts.node_reaches(loop, facts.is_backward):
            return loop
    stepped = node.args[0] if isinstance(node, ast.Call) and node.args else None
    for loop in loops:
        targets = (
            {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
            if isinstance(loop, (ast.For, ast.AsyncFor))
            else set()
        )
        if isinstance(stepped, ast.Name) and stepped.id in targets:
            continue
        return loop
    return None


def _updates_scaler(facts: Facts, node: ast.AST) -> bool:
    return facts.node_reaches(node, lambda c: is_scaler_call(facts, c, "update"))


def _update_in_iteration(facts: Facts, node: ast.AST, depth: int = 0) -> bool | None:
    """Whether the iteration running `node` also calls `scaler.update()`; None if unknown."""
    iteration = _iteration_of(facts, node)
    if iteration is not None:
        return _updates_scaler(facts, iteration)
    function = facts.enclosing_function(node)
    if function is None:
        return None
    if _updates_scaler(facts, function):
        return True
    sites = facts.call_sites(function)
    if not sites or depth >= 3:
        return None
    answers = {_update_in_iteration(facts, site, depth + 1) for site in sites}
    if True in answers:
        return True
    return None if None in answers else False


@rule(
    "TL403",
    "grad-scaler-without-update",
    "E",
    "scaler.step(optimizer) without scaler.update() in the same iteration",
    fix="safe",
)
def grad_scaler_without_update(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    `scaler.step(optimizer)` on a `GradScaler` in a training iteration that never calls
    `scaler.update()` (or calls it only after the loop). A loop over several optimizers
    inside one iteration (`for opt in optimizers: scaler.step(opt)`, then one update) is not
    the iteration.

    ## Why it is wrong
    `update()` is what adapts the loss scale: it lowers it after an overflow and resets the
    per-iteration inf checks. Without it the scale never changes, so a step that overflowed
    once keeps being skipped (the scaler still sees the old infs) or the scale stays too small
    for fp16 gradients to be represented; the model silently stops learning.

    ## Example
    ```python
    scaler.scale(loss).backward()
    scaler.step(optimizer)          # TL403: no scaler.update() follows
    optimizer.zero_grad()
    ```

    ## Fix
    Call `scaler.update()` once per iteration, right after the last `scaler.step(...)`. The
    fix inserts it after the step (after the loop over optimizers when there is one).
    """
    for call in method_calls(facts, "step"):
        if not is_scaler_call(facts, call, "step") or not call.args:
            continue
        answer = _update_in_iteration(facts, call)
        if answer is True or (answer is None and not _no_update_anywhere(facts)):
            continue
        scaler_text = facts.source.segment(facts.receiver(call))  # type: ignore[arg-type]
        yield Hit(
            call,
            f"`{facts.source.segment(call)}` is never followed by `{scaler_text}.update()` in "
            "the same iteration: the loss scale never adapts",
            _insert_update(facts, call, scaler_text),
        )


def _no_update_anywhere(facts: Facts) -> bool:
    return not any(is_scaler_call(facts, c, "update") for c in method_calls(facts, "update"))


def _insert_update(facts: Facts, call: ast.Call, scaler_text: str) -> Fix | None:
    stmt = facts.enclosing_statement(call)
    if stmt is None or facts.parents.get(call) is not stmt:
        return None
    scope = facts.enclosing_function(call) or facts.tree
    if _updates_scaler(facts, scope):
        return None  # an update elsewhere (after the loop): moving it is the author's call
    iteration = _iteration_of(facts, call)
    anchor: ast.stmt = stmt
    for loop in facts.enclosing_loops(call):
        if loop is iteration:
            break
        anchor = loop  # a loop over optimizers: update once, after it
    if not owns_lines(facts, anchor):
        return None
    return Fix(
        "safe",
        f"Insert `{scaler_text}.update()` after the step",
        (insert_line_after(facts, anchor, f"{scaler_text}.update()"),),
    )


# ---------------------------------------------------------------------- TL404
def _scaled_backward(facts: Facts, call: ast.Call) -> bool:
    """`scaler.scale(loss).backward()`."""
    if facts.method_name(call) != "backward":
        return False
    inner = facts.receiver(call)
    return isinstance(inner, ast.Call) and is_scaler_call(facts, inner, "scale")


def _scaler_disabled(facts: Facts, scaler: ast.expr | None) -> bool:
    kind = facts.kind_of(scaler)
    constructor = kind.node if kind is not None else None
    if not isinstance(constructor, ast.Call):
        return False
    enabled = next((k.value for k in constructor.keywords if k.arg == "enabled"), None)
    return isinstance(enabled, ast.Constant) and enabled.value is False


@rule(
    "TL404",
    "clip-scaled-gradients",
    "E",
    "Gradient clipping on GradScaler-scaled gradients without unscale_()",
    fix="safe",
)
def clip_scaled_gradients(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    `clip_grad_norm_` / `clip_grad_value_` called between `scaler.scale(loss).backward()` and
    `scaler.step(optimizer)` with no `scaler.unscale_(optimizer)` before the clip.

    ## Why it is wrong
    After a scaled backward the gradients are multiplied by the loss scale (65536 at the
    start). Clipping them to `max_norm=1.0` compares the threshold with a norm thousands of
    times too large, so every step is clipped far too hard (and `clip_grad_value_` clips at a
    meaningless value); `scaler.step` then divides the already-clipped gradients by the scale
    again. Training crawls or diverges depending on the scale.

    ## Example
    ```python
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)   # TL404: still scaled
    scaler.step(optimizer)
    scaler.update()
    ```

    ## Fix
    Call `scaler.unscale_(optimizer)` right before clipping; `scaler.step` knows the gradients
    are already unscaled. The fix inserts it.
    """
    for clip in facts.calls_to(*CLIP_FUNCTIONS):
        if clips_nothing(facts, clip):
            continue
        scope = facts.enclosing_function(clip) or facts.tree
        calls = facts.calls_in(scope)
        here = position(clip)
        backwards = [c for c in calls if position(c) < here and _scaled_backward(facts, c)]
        if not backwards:
            continue
        last_backward = backwards[-1]
        scaler = facts.receiver(facts.receiver(last_backward))  # type: ignore[arg-type]
        if _scaler_disabled(facts, scaler):
            continue
        if any(
            position(last_backward) < position(c) < here and facts.method_name(c) == "unscale_"
            for c in calls
        ):
            continue
        # The next scaled backward that always runs ends this clip's step; an optional one in
        # between (`if use_awp: scaler.scale(adv_loss).backward()`) leaves the gradients
        # scaled all the same.
        next_backward = next(
            (
                position(c)
                for c in calls
                if position(c) > here
                and _scaled_backward(facts, c)
                and _path_unconditional(facts, c, _lowest_common_ancestor(facts, c, clip))
            ),
            None,
        )
        steps = [
            c
            for c in calls
            if position(c) > here
            and (next_backward is None or position(c) < next_backward)
            and is_scaler_call(facts, c, "step")
            and c.args
        ]
        if not steps:
            continue
        # An optional scaled backward between the clip and the step adds scaled gradients
        # after an unscale_() inserted here: the fix would be wrong, the finding is not.
        between = any(
            here < position(c) < position(steps[0]) and _scaled_backward(facts, c) for c in calls
        )
        yield Hit(
            clip,
            f"`{facts.source.segment(clip.func)}` clips gradients that are still multiplied by "
            "the loss scale; call `scaler.unscale_(optimizer)` first",
            None if between else _insert_unscale(facts, clip, steps),
        )


def _insert_unscale(facts: Facts, clip: ast.Call, steps: list[ast.Call]) -> Fix | None:
    if len(steps) != 1:
        return None
    step = steps[0]
    clip_stmt = facts.enclosing_statement(clip)
    step_stmt = _statement_of_call(facts, step)
    if clip_stmt is None or step_stmt is None or not owns_lines(facts, clip_stmt):
        return None
    step_block = block_of(facts, step_stmt)
    current: ast.AST = clip_stmt
    while step_block is not None and not any(item is current for item in step_block):
        # Up through `if`/`with` only: the clip then runs at most once per step. A clip that
        # runs where the step is conditional (accumulation) would unscale twice and raise.
        current = facts.parents.get(current)  # type: ignore[assignment]
        if not isinstance(current, (ast.If, ast.With, ast.AsyncWith)):
            return None
    if step_block is None:
        return None
    if index_in(step_block, current) > index_in(step_block, step_stmt):  # type: ignore[arg-type]
        return None
    scaler_text = facts.source.segment(facts.receiver(step))  # type: ignore[arg-type]
    optimizer_text = facts.source.segment(step.args[0])
    return Fix(
        "safe",
        f"Insert `{scaler_text}.unscale_({optimizer_text})` before clipping",
        (insert_line_before(facts, clip_stmt, f"{scaler_text}.unscale_({optimizer_text})"),),
    )


# ---------------------------------------------------------------------- TL405
_UNCONDITIONAL = (
    ast.Expr,
    ast.Assign,
    ast.AugAssign,
    ast.AnnAssign,
    ast.With,
    ast.AsyncWith,
    ast.expr,
    ast.keyword,
)


_BRANCHING = (ast.If, ast.Try, ast.IfExp, ast.BoolOp, ast.Match, getattr(ast, "TryStar", ast.Try))


def _lowest_common_ancestor(facts: Facts, first: ast.AST, second: ast.AST) -> ast.AST | None:
    chain = []
    current: ast.AST | None = first
    while current is not None:
        chain.append(current)
        current = facts.parents.get(current)
    current = second
    while current is not None:
        if any(current is item for item in chain):
            return current
        current = facts.parents.get(current)
    return None


def _path_unconditional(facts: Facts, node: ast.AST, ancestor: ast.AST) -> bool:
    current = facts.parents.get(node)
    while current is not None and current is not ancestor:
        if not isinstance(current, _UNCONDITIONAL):
            return False
        current = facts.parents.get(current)
    return current is ancestor


def run_together(facts: Facts, first: ast.AST, second: ast.AST) -> bool:
    """True when `first` and `second` always run together: same function, no branch or inner
    loop separating them."""
    ancestor = _lowest_common_ancestor(facts, first, second)
    if ancestor is None or isinstance(ancestor, _BRANCHING):
        return False
    return _path_unconditional(facts, first, ancestor) and _path_unconditional(
        facts, second, ancestor
    )


@rule(
    "TL405",
    "double-optimizer-step",
    "E",
    "scaler.step(optimizer) and optimizer.step() on the same optimizer",
)
def double_optimizer_step(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    The same optimizer stepped twice in one iteration: once through the GradScaler
    (`scaler.step(optimizer)`) and once directly (`optimizer.step()`), with no branch between
    them (the usual `if use_amp: scaler.step(opt) else: opt.step()` is fine).

    ## Why it is wrong
    `scaler.step(optimizer)` already calls `optimizer.step()` (unless it skips the step
    because of an overflow). The second call applies the update again: the effective learning
    rate doubles, momentum and Adam statistics advance twice, and the steps the scaler skipped
    on purpose happen anyway with inf/NaN gradients.

    ## Example
    ```python
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.step()                 # TL405: second update of the same parameters
    ```

    ## Fix
    Keep only `scaler.step(optimizer)` when mixed precision is on. No automatic fix.
    """
    steps = method_calls(facts, "step")
    scaler_steps = [c for c in steps if is_scaler_call(facts, c, "step") and c.args]
    if not scaler_steps:
        return
    for call in steps:
        if not is_plain_optimizer_step(facts, call):
            continue
        key = facts.key(facts.receiver(call))
        if key is None:
            continue
        for scaler_step in scaler_steps:
            if facts.key(scaler_step.args[0]) != key:
                continue
            if facts.scope(scaler_step) is not facts.scope(call):
                continue
            if not run_together(facts, scaler_step, call):
                continue
            yield Hit(
                call,
                f"`{key}` is stepped twice: by `{facts.source.segment(scaler_step)}` on line "
                f"{scaler_step.lineno} and again here",
            )
            break


# ---------------------------------------------------------------------- TL406
AMP_REPLACEMENTS = {
    "torch.cuda.amp.autocast": ("autocast", "cuda"),
    "torch.cuda.amp.autocast_mode.autocast": ("autocast", "cuda"),
    "torch.cpu.amp.autocast": ("autocast", "cpu"),
    "torch.cpu.amp.autocast_mode.autocast": ("autocast", "cpu"),
    "torch.cuda.amp.GradScaler": ("GradScaler", "cuda"),
    "torch.cuda.amp.grad_scaler.GradScaler": ("GradScaler", "cuda"),
    "torch.cpu.amp.GradScaler": ("GradScaler", "cpu"),
    "torch.cpu.amp.grad_scaler.GradScaler": ("GradScaler", "cpu"),
    "torch.cuda.amp.custom_fwd": ("custom_fwd", "cuda"),
    "torch.cuda.amp.custom_bwd": ("custom_bwd", "cuda"),
}
# The old autocast's positional parameters; torch.amp.autocast orders them differently.
AUTOCAST_POSITIONAL = ("enabled", "dtype", "cache_enabled")


def _amp_uses(facts: Facts) -> Iterator[tuple[ast.AST, ast.expr, str]]:
    """(node to report, callee expression, deprecated qualname) for each call or decorator."""
    for call in facts.calls:
        qualname = facts.call_qualname(call)
        if qualname in AMP_REPLACEMENTS:
            yield call, call.func, qualname
    for function in facts.scope_nodes:
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for decorator in function.decorator_list:
            qualname = facts.qualname(decorator)
            if qualname in AMP_REPLACEMENTS and not isinstance(decorator, ast.Call):
                yield decorator, decorator, qualname


@rule(
    "TL406",
    "deprecated-amp-api",
    "I",
    "Deprecated torch.cuda.amp / torch.cpu.amp API",
    fix="safe",
)
def deprecated_amp_api(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    `torch.cuda.amp.autocast(...)`, `torch.cuda.amp.GradScaler(...)`,
    `torch.cuda.amp.custom_fwd` / `custom_bwd`, and `torch.cpu.amp.autocast` /
    `torch.cpu.amp.GradScaler`, spelled out or imported with `from torch.cuda.amp import ...`.

    ## Why it is wrong
    These device-specific entry points are deprecated since PyTorch 2.4 in favour of the
    device-generic `torch.amp` ones. Every call emits a `FutureWarning` (in every process of a
    distributed job), and they are scheduled for removal.

    ## Example
    ```python
    scaler = torch.cuda.amp.GradScaler()          # TL406
    with torch.cuda.amp.autocast(dtype=torch.bfloat16):   # TL406
        loss = model(x)
    ```

    ## Fix
    `torch.amp.GradScaler("cuda", ...)` and `torch.amp.autocast("cuda", ...)` (`"cpu"` for the
    `torch.cpu.amp` ones), `torch.amp.custom_fwd(device_type="cuda")`. The fix rewrites the
    call and keeps the other arguments (positional `autocast` arguments become keywords, since
    the new signature orders them differently). It is offered only when the edit is certain:
    the file imports `torch` and the call passes no `*args`.
    """
    torch = facts.torch_alias
    for node, func, qualname in _amp_uses(facts):
        name, device = AMP_REPLACEMENTS[qualname]
        old = facts.source.segment(func)
        new = f"torch.amp.{name}"
        yield Hit(
            func,
            f'`{old}` is deprecated; use `{new}("{device}", ...)`'
            if name in ("autocast", "GradScaler")
            else f'`{old}` is deprecated; use `{new}(device_type="{device}")`',
            _amp_fix(facts, node, func, name, device, torch),
        )


def _open_paren(facts: Facts, call: ast.Call) -> tuple[int, int] | None:
    """(row, column) just after the `(` of `call`, when it directly follows the callee."""
    row = call.func.end_lineno or call.func.lineno
    column = facts.source.column(row, call.func.end_col_offset or 0)
    line = facts.source.lines[row - 1]
    rest = line[column:]
    stripped = rest.lstrip()
    if not stripped.startswith("("):
        return None
    return row, column + (len(rest) - len(stripped)) + 1


def _amp_fix(
    facts: Facts,
    node: ast.AST,
    func: ast.expr,
    name: str,
    device: str,
    torch: str | None,
) -> Fix | None:
    if torch is None:
        return None
    scope = facts.scope(node)
    if scope is not facts.tree and facts.assignments_of(torch, scope):  # type: ignore[arg-type]
        return None  # `torch` means something else here
    new_func = f"{torch}.amp.{name}"
    message = f"Use `{new_func}` for {device}"
    if not isinstance(node, ast.Call):
        # A bare decorator: `@torch.cuda.amp.custom_fwd`.
        return Fix("safe", message, (replace_node(facts, func, f'{new_func}(device_type="cuda")'),))
    call = node
    if any(isinstance(a, ast.Starred) for a in call.args):
        return None
    opening = _open_paren(facts, call)
    if opening is None:
        return None
    edits = [replace_node(facts, func, new_func)]
    if name in ("custom_fwd", "custom_bwd"):
        if call.args:
            return None
        first = f'device_type="{device}"' + (", " if call.keywords else "")
        edits.append(insert_at(*opening, first))
        return Fix("safe", message, tuple(edits))
    arguments = sorted([*call.args, *call.keywords], key=position)
    if arguments:
        # Before the first argument (keeps a multi-line call's layout). Inserts at the same
        # position merge into one edit: `autocast(True)` → `autocast("cuda", enabled=True)`.
        row = arguments[0].lineno
        first = (row, facts.source.column(row, arguments[0].col_offset))
        inserts = {first: f'"{device}", '}
    else:
        inserts = {opening: f'"{device}"'}
    if name == "autocast":
        if len(call.args) > len(AUTOCAST_POSITIONAL):
            return None
        for argument, parameter in zip(call.args, AUTOCAST_POSITIONAL, strict=False):
            if any(k.arg == parameter for k in call.keywords):
                return None
            row = argument.lineno
            where = (row, facts.source.column(row, argument.col_offset))
            inserts[where] = inserts.get(where, "") + f"{parameter}="
    edits.extend(insert_at(row, column, text) for (row, column), text in inserts.items())
    return Fix("safe", message, tuple(edits))


# ---------------------------------------------------------------------- TL407
@rule(
    "TL407",
    "plateau-step-without-metric",
    "E",
    "ReduceLROnPlateau.step() called without the monitored metric",
)
def plateau_step_without_metric(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    `scheduler.step()` with no argument where `scheduler` is a `ReduceLROnPlateau` (every
    binding of the name builds one).

    ## Why it is wrong
    `ReduceLROnPlateau` decides from the value it is given: `step(metrics)` is its required
    argument. Called without it, `step()` raises a `TypeError` at the end of the first epoch,
    typically after a full epoch of training was spent, and the epoch's checkpoint is never
    written.

    ## Example
    ```python
    scheduler = ReduceLROnPlateau(optimizer, mode="min", patience=5)
    for epoch in range(epochs):
        train_one_epoch(...)
        val_loss = evaluate(...)
        scheduler.step()             # TL407: pass val_loss
    ```

    ## Fix
    Pass the monitored value: `scheduler.step(val_loss)`. No automatic fix (which metric to
    pass is the author's choice).
    """
    for call in method_calls(facts, "step"):
        if call.args or call.keywords:
            continue
        found = scheduler_type(facts, facts.receiver(call))
        if found is None or found[0] != "ReduceLROnPlateau":
            continue
        branches = facts.conditions_between(call, facts.scope(call))
        if any(
            {"isinstance", "ReduceLROnPlateau", "type"} & names_in(branch.test)
            for branch in branches
        ):
            continue
        text = facts.source.segment(facts.receiver(call))  # type: ignore[arg-type]
        yield Hit(
            call,
            f"`{text}` is a ReduceLROnPlateau: `step()` needs the monitored metric, e.g. "
            f"`{text}.step(val_loss)` (without it, it raises TypeError)",
        )


# ---------------------------------------------------------------------- TL408
_SIMPLE = (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign)


def _previous_event(facts: Facts, stmt: ast.stmt) -> tuple[str, ast.stmt] | None:
    """Walking back from `stmt` within its iteration: ("step", statement) when the nearest
    earlier statement that matters steps an optimizer unconditionally, ("backward", ...) when
    it is a backward pass, None when unknown."""
    current: ast.stmt = stmt
    while True:
        block = block_of(facts, current)
        if block is None:
            return None
        for earlier in reversed(block[: index_in(block, current)]):
            if facts.node_reaches(earlier, facts.is_backward):
                return "backward", earlier
            if _optimizer_step_inside(facts, earlier):
                return ("step", earlier) if isinstance(earlier, _SIMPLE) else None
        parent = facts.parents.get(current)
        if parent is None or isinstance(parent, (*_FUNCTION_TYPES, *_LOOP_TYPES)):
            return None
        current = parent  # type: ignore[assignment]


def _steps_before_next_backward(facts: Facts, stmt: ast.stmt) -> bool:
    """True when an optimizer step follows `stmt` before any backward pass."""
    current: ast.stmt = stmt
    while True:
        block = block_of(facts, current)
        if block is None:
            return False
        for later in block[index_in(block, current) + 1 :]:
            if facts.node_reaches(later, facts.is_backward):
                return False
            if _optimizer_step_inside(facts, later):
                return True
        parent = facts.parents.get(current)
        if parent is None or isinstance(parent, (*_FUNCTION_TYPES, *_LOOP_TYPES)):
            return False
        current = parent  # type: ignore[assignment]


@rule(
    "TL408",
    "clip-after-step",
    "E",
    "Gradient clipping after optimizer.step(): the step used unclipped gradients",
    fix="unsafe",
)
def clip_after_step(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    `clip_grad_norm_` / `clip_grad_value_` called after `optimizer.step()` with no backward
    pass in between (and no other optimizer step after it that the clip could be meant for).

    ## Why it is wrong
    Clipping only matters before the update. After `step()` the gradients were already
    applied unclipped; the clip then changes gradients that are about to be zeroed. Exploding
    gradients go straight into the weights, which is exactly what the clip was added to stop.

    ## Example
    ```python
    loss.backward()
    optimizer.step()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)   # TL408: too late
    ```

    ## Fix
    Clip between `backward()` and `step()`. The quick fix moves the clip before the step; it
    is unsafe because it changes the updates (that is the point).
    """
    for clip in facts.calls_to(*CLIP_FUNCTIONS):
        stmt = facts.enclosing_statement(clip)
        if stmt is None or clips_nothing(facts, clip):
            continue
        previous = _previous_event(facts, stmt)
        if previous is None or previous[0] != "step":
            continue
        if _steps_before_next_backward(facts, stmt):
            continue
        step_stmt = previous[1]
        yield Hit(
            clip,
            f"`{facts.source.segment(clip.func)}` runs after "
            f"`{facts.source.segment(step_stmt).strip()}` (line {step_stmt.lineno}): the "
            "update already used the unclipped gradients; clip before the step",
            _move_clip_before(facts, stmt, step_stmt),
        )


def _move_clip_before(facts: Facts, clip_stmt: ast.stmt, step_stmt: ast.stmt) -> Fix | None:
    block = block_of(facts, clip_stmt)
    if block is None or not any(item is step_stmt for item in block):
        return None
    if not isinstance(clip_stmt, _SIMPLE) or not owns_lines(facts, step_stmt):
        return None
    if any(is_scaler_call(facts, c, "step") for c in facts.calls_in(step_stmt)):
        return None  # would also need scaler.unscale_ before the clip
    deletion = movable(facts, clip_stmt)
    if deletion is None:
        return None
    return Fix(
        "unsafe",
        "Move the clipping before the optimizer step",
        (deletion, insert_line_before(facts, step_stmt, statement_text(facts, clip_stmt))),
    )
