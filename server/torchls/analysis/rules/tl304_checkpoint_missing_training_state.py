"""TL304 checkpoint-missing-training-state: a training checkpoint holds the model's
weights but not the optimizer's (or scheduler's, or GradScaler's) state.

It counts the stateful training objects the save can see (built in its scope, handed back by
an in-file function, held by a trainer instance) and the state dicts the checkpoint dict
stores. In: the file's `Facts`. Out: `Hit`s on the save, no fix.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.findings import Related
from torchls.analysis.queries.vocabulary import argument_at
from torchls.analysis.registry import Hit, exemption, rule
from torchls.analysis.rules._checkpoints import SAVE, _dict_values


def _state_dict_owner(facts: Facts, value: ast.expr, depth: int = 0) -> ast.expr | None:
    """`model` for a value `model.state_dict()` (or `model.module.state_dict()`), also when
    it is saved only where the object exists (`sched.state_dict() if sched else None`) or
    through a local name bound to such a value (`opt_state = opt.state_dict() if keep else
    None`, then `"optimizer": opt_state`)."""
    if isinstance(value, ast.IfExp):
        return _state_dict_owner(facts, value.body, depth) or _state_dict_owner(
            facts, value.orelse, depth
        )
    if isinstance(value, ast.Call) and facts.method_name(value) == "state_dict":
        return _element_of(facts, facts.receiver(value))
    if (
        isinstance(value, (ast.ListComp, ast.GeneratorExp))
        and len(value.generators) == 1
        and isinstance(value.generators[0].target, ast.Name)
    ):
        # `[opt.state_dict() for opt in optimizers]`: the state of each optimizer listed.
        owner = _state_dict_owner(facts, value.elt, depth)
        generator = value.generators[0]
        if isinstance(owner, ast.Name) and owner.id == generator.target.id:  # type: ignore[union-attr]
            return _element_of(facts, generator.iter, whole=True)
        return owner
    if isinstance(value, ast.Name) and depth < 3:
        bound = facts.binding_value(value)
        if bound is not None:
            return _state_dict_owner(facts, bound, depth + 1)
    return None


def _element_of(facts: Facts, expr: ast.expr | None, whole: bool = False) -> ast.expr | None:
    """An object taken out of a list literal stands for what the list holds: `outer` after
    `outer = optimizers[0]`, or (`whole`) the list `optimizers = [adam, sgd]` itself, stand
    for its first element. Anything else is itself."""
    if expr is None:
        return None
    value = expr
    if isinstance(value, ast.Name) and not whole:
        bound = facts.binding_value(value)
        if isinstance(bound, ast.Subscript):
            value = bound.value
        else:
            return expr
    elif isinstance(value, ast.Subscript):
        value = value.value
    elif not whole:
        return expr
    listed = facts.binding_value(value) if isinstance(value, ast.Name) else value
    if isinstance(listed, (ast.List, ast.Tuple)) and listed.elts:
        return listed.elts[0]
    return expr


def _constructed(facts: Facts, kinds: tuple[str, ...]) -> dict[str, list[tuple[ast.Call, str]]]:
    """In-file constructor calls of objects of each of `kinds` ("optimizer", "scheduler",
    "scaler"), found in one pass over the file's calls."""
    found: dict[str, list[tuple[ast.Call, str]]] = {kind: [] for kind in kinds}
    for call in facts.calls:
        if facts.call_qualname(call) is None:
            continue  # optimizers, schedulers and scalers are built by imported constructors
        found_kind = facts.kind_of(call)
        if found_kind is not None and found_kind.kind in found and found_kind.node is call:
            found[found_kind.kind].append((call, found_kind.detail))
    return found


def _held_by_self(facts: Facts, save: ast.Call) -> set[str]:
    """For a save in a method of an in-file class (a trainer): the kinds of training objects
    the instance holds as `self.<attr>`, built in the class (`self.scaler = GradScaler()`) or
    handed to its constructor by every call site (`Trainer(model, opt, sched)` with `opt`,
    `sched` built there). Plain SGD without momentum holds no state and does not count."""
    klass = facts.enclosing_class(save)
    info = facts.classes.get(klass.name) if klass is not None else None
    if info is None:
        return set()
    init = info.methods.get("__init__")
    sites = facts.call_sites(init) if init is not None else []
    found: set[str] = set()
    for values in info.attributes.values():
        if len(values) != 1:
            continue
        value = values[0]
        candidates: list[ast.expr] = [value]
        if isinstance(value, ast.Name) and init is not None and sites:
            candidates = []
            for site in sites:
                told, argument = argument_at(site, init, value.id, True)
                if not told or argument is None:
                    candidates = []
                    break
                candidates.append(argument)
        kinds = set()
        for candidate in candidates:
            kind = facts.kind_of(candidate)
            node = kind.node if kind is not None else None
            if (
                kind is None
                or kind.by_name
                or not isinstance(node, ast.Call)
                or (kind.kind == "optimizer" and _stateless_sgd(facts, node, kind.detail))
            ):
                kinds.add("")
            else:
                kinds.add(kind.kind)
        if candidates and len(kinds) == 1:
            kind_found = kinds.pop()
            if kind_found in ("optimizer", "scheduler", "scaler"):
                found.add(kind_found)
    return found


def _handed_back_to(
    facts: Facts, construction: ast.Call, visible: tuple[ast.AST, ...], around: list[ast.AST]
) -> bool:
    """`construction` is returned by an in-file function or method (`configure_optimizers`)
    that a scope the save can see calls outside the loops around the save: the object it
    builds lives there (`optimizer = model.configure_optimizers(lr)`)."""
    function = facts.enclosing_function(construction)
    if function is None:
        return False
    parent = facts.parents.get(construction)
    returned = isinstance(parent, ast.Return)
    if not returned and isinstance(parent, ast.Assign) and len(parent.targets) == 1:
        target = parent.targets[0]
        returned = isinstance(target, ast.Name) and any(
            isinstance(node, ast.Return)
            and isinstance(node.value, ast.Name)
            and node.value.id == target.id
            for node in facts.walk_local(function)
        )
    if not returned:
        return False
    return any(
        facts.scope(site) in visible and not any(facts.is_inside(site, loop) for loop in around)
        for site in facts.call_sites(function)
    )


@exemption("TL304", "neg_scheduler_stepped_with_the_epoch.py")
def _stepped_at_epoch(facts: Facts, construction: ast.Call) -> bool:
    """Every `step()` of the scheduler built by `construction` names the epoch itself
    (`scheduler.step(epoch)`): its rate is a function of that number, which the checkpoint's
    epoch restores. Not a `ReduceLROnPlateau`, whose `step(metric)` feeds state it keeps."""
    if (facts.call_qualname(construction) or "").endswith("ReduceLROnPlateau"):
        return False
    statement = facts.parents.get(construction)
    if not isinstance(statement, ast.Assign) or len(statement.targets) != 1:
        return False
    key = facts.key(statement.targets[0])
    steps = [c for c in facts.method_calls("step") if facts.key(facts.receiver(c)) == key]
    return bool(steps) and all(c.args and not c.keywords for c in steps)


@exemption("TL304", "neg_scheduler_built_but_never_used.py")
def _never_read(facts: Facts, construction: ast.Call) -> bool:
    """The scheduler built by `construction` is bound to a plain name nothing ever reads (not
    stepped, not passed on): its state never changes, so there is nothing to resume."""
    statement = facts.parents.get(construction)
    if not isinstance(statement, ast.Assign) or len(statement.targets) != 1:
        return False
    target = statement.targets[0]
    if not isinstance(target, ast.Name):
        return False
    return target.id not in facts.get(_LoadedNames).under(facts.scope(construction))


class _LoadedNames:
    """Per file: the names read anywhere under a scope (nested functions and classes
    included), one walk per scope rather than one per scheduler built in it."""

    def __init__(self, facts: Facts) -> None:
        self.by_scope: dict[ast.AST, set[str]] = {}

    def under(self, scope: ast.AST) -> set[str]:
        found = self.by_scope.get(scope)
        if found is None:
            found = self.by_scope[scope] = {
                node.id
                for node in ast.walk(scope)
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
            }
        return found


@exemption("TL304", "neg_scheduler_repositioned_from_epoch.py")
def _positioned_by_epoch(call: ast.Call) -> bool:
    """A scheduler built with `last_epoch=<an expression>` (not the default -1): the code
    restores its position from a saved epoch itself (`ExponentialLR(opt, g,
    last_epoch=checkpoint["epoch"] - 1)` on resume), so the checkpoint need not hold its
    state: one such construction in the file is enough."""
    for keyword in call.keywords:
        if keyword.arg == "last_epoch":
            value = keyword.value
            constant = value.value if isinstance(value, ast.Constant) else None
            if isinstance(value, ast.UnaryOp) and isinstance(value.operand, ast.Constant):
                constant = -value.operand.value if isinstance(value.op, ast.USub) else None
            return constant != -1
    return False


def _stateless_sgd(facts: Facts, call: ast.Call, detail: str) -> bool:
    if detail != "SGD":
        return False
    for keyword in call.keywords:
        if keyword.arg == "momentum":
            return isinstance(keyword.value, ast.Constant) and keyword.value.value in (0, 0.0)
    return len(call.args) < 3


def _saved_owners(facts: Facts, saved: ast.expr) -> list[ast.expr | None]:
    """The objects whose `state_dict()` the saved dict holds, one per value."""
    return [_state_dict_owner(facts, v) for v in _dict_values(facts, saved)]


def _helper_checkpoints(
    facts: Facts,
) -> Iterator[tuple[ast.Call, list[ast.expr | None], tuple[Related, ...]]]:
    """(call, the arguments whose state it saves) for calls of another file's helper that builds
    the checkpoint dict itself (`save_checkpoint(path, model=model, epoch=epoch)` writing
    `{"state_dict": model.state_dict(), "epoch": epoch}`): its summary says which parameters'
    `state_dict()` the dict holds and that nothing else in it can carry a state. A call
    leaving one of those parameters out or passing a constant (`optimizer=None` for a
    weights-only copy) chose what to keep, and is skipped."""
    if not facts.imports_project_modules and not facts.functions:
        return
    for call in facts.project_calls:
        asked = facts.call_summary(call)
        if asked is None:
            continue
        summary, bound, owner = asked
        if owner is facts:
            continue  # an in-file helper's own `torch.save` is checked where it is
        if not summary.saves_closed or not summary.saves_states:
            continue
        owners = [bound.get(name) for name in sorted(summary.saves_states)]
        if any(owner is None or isinstance(owner, ast.Constant) for owner in owners):
            continue
        # Arguments stored as they are (`optimizer_state=optimizer.state_dict()`, `opt=opt`)
        # carry their own state into the dict.
        for name in sorted(summary.saves_values):
            argument = bound.get(name)
            if argument is not None:
                owners.append(_state_dict_owner(facts, argument) or argument)
        target = facts.callee(call)
        written = [
            save
            for save in owner.calls_to(*SAVE)
            if target is not None and owner.enclosing_function(save) is target[1]
        ]
        related = tuple(
            Related(owner.source.span(save), "the checkpoint is written here", owner.filename)
            for save in written[:1]
        )
        yield call, owners, related


def _checkpoint_saves(facts: Facts) -> Iterator[tuple[ast.Call, ast.expr]]:
    """(call, saved object) for every `torch.save(obj, ...)` here and every call of a save
    wrapper (`save_checkpoint({...}, is_best)`, here or in another project file) whose summary
    says it passes that parameter to `torch.save`."""
    for call in facts.calls_to(*SAVE):
        if call.args:
            yield call, call.args[0]
    if not facts.calls_to(*SAVE) and not facts.imports_project_modules:
        return
    for call in facts.project_calls:
        asked = facts.call_summary(call)
        if asked is None:
            continue
        summary, bound, _owner = asked
        for name in summary.saves:
            argument = bound.get(name)
            if argument is not None:
                yield call, argument


@rule(
    "TL304",
    "checkpoint-missing-training-state",
    "W",
    "Checkpoint saves the model but not the optimizer (scheduler, scaler) state",
)
def checkpoint_missing_training_state(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    In a training script (one that builds an optimizer), `torch.save` of a dict checkpoint
    (directly, through a save wrapper it is handed to, or built by a project helper from the
    objects it is given: `save_checkpoint(path, model=model, epoch=epoch)` whose dict holds
    `model.state_dict()` and plain values only) that holds the model's
    `state_dict()` but not the optimizer's — nor the scheduler's or the GradScaler's when the
    script has them. Plain SGD without momentum keeps no state and is not reported for the
    optimizer, and neither is one export written once after the training loop has ended,
    nor an object rebuilt on every pass of the loop the save sits in (a fresh optimizer per
    epoch), whose state never outlives the pass. Objects count where the save can see them:
    built in its function or at module level, handed back by an in-file function or method
    (`optimizer = model.configure_optimizers(lr)`), or, for a save in a trainer class's
    method, held by the instance (`self.scaler = GradScaler()`, or a scheduler every caller
    hands to the constructor).

    ## Why it is wrong
    Resuming from such a checkpoint restarts Adam's moment estimates (or SGD's momentum) from
    zero and the learning-rate schedule from its first step: the loss jumps after every
    restart and the resumed run does not reproduce an uninterrupted one.

    ## Example
    ```python
    torch.save({"model": model.state_dict(), "epoch": epoch}, "last.pt")   # TL304
    ```

    ## Fix
    Save every stateful object:
    `{"model": ..., "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
    "scaler": scaler.state_dict(), "epoch": epoch}`. No automatic fix.
    """
    constructed = _constructed(facts, ("optimizer", "scheduler", "scaler"))
    if not constructed["optimizer"]:
        return
    saves = [(call, _saved_owners(facts, saved), ()) for call, saved in _checkpoint_saves(facts)]
    for call, owners, related in [*saves, *_helper_checkpoints(facts)]:
        if facts.after_training(call):
            continue  # one export once training is over: nothing resumes from it
        # Only objects built where this save can see them: its own function or module level.
        visible = (facts.scope(call), facts.tree)
        # An object rebuilt on every pass of a loop around the save (an optimizer made anew
        # each epoch, after re-clustering) has no state that outlives the pass to resume.
        around = facts.enclosing_loops(call)
        local = {
            kind: [
                (c, d)
                for c, d in found
                if (
                    facts.scope(c) in visible
                    and not any(facts.is_inside(c, loop) for loop in around)
                )
                or _handed_back_to(facts, c, visible, around)
            ]
            for kind, found in constructed.items()
        }
        held = _held_by_self(facts, call)
        needed = {
            "optimizer": any(not _stateless_sgd(facts, c, d) for c, d in local["optimizer"])
            or "optimizer" in held,
            "scheduler": (
                any(not _never_read(facts, c) for c, _ in local["scheduler"])
                and not any(_positioned_by_epoch(c) for c, _ in constructed["scheduler"])
                and not all(_stepped_at_epoch(facts, c) for c, _ in local["scheduler"])
            )
            or "scheduler" in held,
            "scaler": bool(local["scaler"]) or "scaler" in held,
        }
        kinds = {
            (facts.kind_of(owner).kind if facts.kind_of(owner) else "")
            for owner in owners
            if owner is not None
        }
        if "model" not in kinds:
            continue
        missing = [name for name, wanted in needed.items() if wanted and name not in kinds]
        if not missing:
            continue
        yield Hit(
            call,
            f"checkpoint saves the model but not the {', '.join(missing)} state: a resumed run "
            "restarts from fresh optimizer statistics and schedule",
            related=related,
        )
