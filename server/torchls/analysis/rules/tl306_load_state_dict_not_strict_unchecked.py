"""TL306 load-state-dict-not-strict-unchecked: `load_state_dict(..., strict=False)`
whose missing and unexpected keys are thrown away.

Loads whose mismatch is filtered out, checked, reported or intended are not reported.
In: the file's `Facts`. Out: `Hit`s on the call, no fix.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.registry import Hit, exemption, rule
from torchls.analysis.rules._checkpoints import _keyword
from torchls.analysis.rules._checkpoints_partial import (
    _next_statement,
    _prepared_or_acknowledged,
    _split_load,
)


def _state_dict_value(facts: Facts, expr: ast.AST, depth: int = 0) -> bool:
    """`model.state_dict()`, its `.keys()`, or a name bound to one of those."""
    if depth > 3:
        return False
    if isinstance(expr, ast.Name):
        bound = facts.binding_value(expr)
        return bound is not None and _state_dict_value(facts, bound, depth + 1)
    if isinstance(expr, ast.Call) and facts.method_name(expr) == "keys":
        return _state_dict_value(facts, facts.receiver(expr), depth + 1)  # type: ignore[arg-type]
    return isinstance(expr, ast.Call) and facts.method_name(expr) == "state_dict"


@exemption("TL306", "neg_filtered_by_shape_lookup.py")
def _filtered_to_own_keys(facts: Facts, state: ast.AST) -> bool:
    """`{k: v for k, v in sd.items() if k in model_dict}` with `model_dict` a module's
    `state_dict()`, or `if model.state_dict()[k].numel() == v.numel()` (which raises on a key
    the model lacks): every key loaded exists in the model, so nothing is unexpected and what
    is missing was left out on purpose. Also through `ckpt["model"] = {...}` assigned just
    before in the same function."""
    if isinstance(state, ast.Name):
        value = facts.binding_value(state)
    elif isinstance(state, ast.Subscript):
        value = _item_assigned_before(facts, state)
    else:
        value = state
    if not isinstance(value, ast.DictComp) or len(value.generators) != 1:
        return False
    key = value.key
    if not isinstance(key, ast.Name):
        return False
    for condition in value.generators[0].ifs:
        for test in ast.walk(condition):
            if (
                isinstance(test, ast.Compare)
                and len(test.ops) == 1
                and isinstance(test.ops[0], ast.In)
                and isinstance(test.left, ast.Name)
                and test.left.id == key.id
                and _state_dict_value(facts, test.comparators[0])
            ):
                return True
            if (
                isinstance(test, ast.Subscript)
                and isinstance(test.slice, ast.Name)
                and test.slice.id == key.id
                and _state_dict_value(facts, test.value)
            ):
                return True  # `model.state_dict()[k]`: a KeyError for any key not in it
    return False


def _item_assigned_before(facts: Facts, item: ast.Subscript) -> ast.expr | None:
    """For `ckpt["model"]`: the value of the last `ckpt["model"] = ...` before it in its own
    function, when the container is a plain name and the key a constant."""
    if not (isinstance(item.value, ast.Name) and isinstance(item.slice, ast.Constant)):
        return None
    scope = facts.scope(item)
    found: ast.expr | None = None
    found_at = (0, 0)
    for node in facts.walk_local(scope):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target = node.targets[0]
        if (
            isinstance(target, ast.Subscript)
            and isinstance(target.value, ast.Name)
            and target.value.id == item.value.id
            and isinstance(target.slice, ast.Constant)
            and target.slice.value == item.slice.value
            and found_at < (node.lineno, node.col_offset) < (item.lineno, item.col_offset)
        ):
            found, found_at = node.value, (node.lineno, node.col_offset)
    return found


_REPORTERS = {"print", "info", "warning", "warn", "debug", "log", "write", "echo", "error"}


@exemption("TL306", "neg_keys_filtered_or_reported.py")
def _reported_after(facts: Facts, statement: ast.stmt, state: ast.AST) -> bool:
    """The statement right after the load reports on what was loaded (a print or log call
    naming the state dict, e.g. how many of its keys matched)."""
    following = _next_statement(facts, statement)
    if not isinstance(following, ast.Expr) or not isinstance(following.value, ast.Call):
        return False
    report = following.value
    func = report.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
    if name not in _REPORTERS:
        return False
    names = {n.id for n in ast.walk(state) if isinstance(n, ast.Name)}
    return any(
        isinstance(n, ast.Name) and n.id in names
        for argument in [*report.args, *(k.value for k in report.keywords)]
        for n in ast.walk(argument)
    )


def _reads_state_of(facts: Facts, expr: ast.AST, owner: str, depth: int = 0) -> bool:
    """`expr` is computed from `owner`'s whole `state_dict()` (its key set, or its items
    walked one by one), through local names and loop targets (`for key, v in
    model.state_dict().items()`). Looking up chosen keys (`state[k]` for a fixed list) checks
    only those, so it does not count."""
    if depth > 4:
        return False
    for node in ast.walk(expr):
        parent = facts.parents.get(node)
        if isinstance(parent, ast.Subscript) and parent.value is node:
            continue
        if isinstance(node, ast.Call) and facts.method_name(node) == "state_dict":
            root = facts.module_root(facts.receiver(node)) or ""
            if root == owner or root.startswith(owner + ".") or owner.startswith(root + "."):
                return True
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            assignment = facts.reaching_assignment(node)
            if assignment is None:
                continue
            source = assignment.loop.iter if assignment.loop is not None else assignment.value
            if source is not None and _reads_state_of(facts, source, owner, depth + 1):
                return True
    return False


@exemption("TL306", "neg_mismatches_logged_before_load.py")
def _checked_against_model_before(facts: Facts, load: ast.Call) -> bool:
    """Before `load`, in its function, an `if` compares something with the target module's
    own `state_dict()` and reports (or raises) when they differ: the YOLOX-style loop that
    logs every key missing from the checkpoint or with another shape, or a logged set
    difference of the keys. The mismatches are then already known when strict=False hides
    them."""
    owner = facts.module_root(facts.receiver(load))
    if owner is None:
        return False
    scope = facts.scope(load)
    for node in facts.walk_local(scope):
        if not isinstance(node, ast.If) or node.lineno >= load.lineno:
            continue
        reports = any(
            isinstance(inner, (ast.Raise, ast.Assert))
            or (
                isinstance(inner, ast.Call)
                and (
                    getattr(inner.func, "id", None) in _REPORTERS
                    or getattr(inner.func, "attr", None) in _REPORTERS
                )
            )
            for statement in node.body
            for inner in ast.walk(statement)
        )
        if (
            reports
            and _before_on_path(facts, node, load)
            and _reads_state_of(facts, node.test, owner)
        ):
            return True
    return False


def _before_on_path(facts: Facts, earlier: ast.stmt, later: ast.AST) -> bool:
    """`earlier` runs before `later` on the way to it: their branches meet in one statement
    list (not the two arms of an `if`, or a `try` body and its handler)."""
    chain: list[ast.AST] = []
    node: ast.AST | None = earlier
    while node is not None and not facts.is_inside(later, node):
        chain.append(node)
        node = facts.parents.get(node)
    if node is None or not chain:
        return False
    top = chain[-1]  # the statement holding `earlier` directly under the common ancestor
    for name in ("body", "orelse", "finalbody"):
        block = getattr(node, name, None)
        if isinstance(block, list) and any(item is top for item in block):
            return any(facts.is_inside(later, item) for item in block)
    return False


@exemption("TL306", "neg_fallback_after_reported_strict_failure.py")
def _after_reported_strict_failure(facts: Facts, call: ast.Call) -> bool:
    """`call` is the fallback in the `except` of a strict `load_state_dict` into the same
    module, and the handler hands the caught error on (prints or logs it): that error's
    message lists every missing, unexpected and mis-shaped key."""
    key = facts.key(facts.receiver(call))
    current = facts.parents.get(call)
    while current is not None and not isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if isinstance(current, ast.ExceptHandler) and current.name:
            attempt = facts.parents.get(current)
            used = any(
                isinstance(node, ast.Name) and node.id == current.name
                for statement in current.body
                for node in ast.walk(statement)
            )
            if used and isinstance(attempt, ast.Try):
                for statement in attempt.body:
                    for node in ast.walk(statement):
                        if (
                            isinstance(node, ast.Call)
                            and facts.method_name(node) == "load_state_dict"
                            and facts.key(facts.receiver(node)) == key
                            and not _loads_loosely(node)
                        ):
                            return True
        current = facts.parents.get(current)
    return False


def _loads_loosely(call: ast.Call) -> bool:
    keyword = _keyword(call, "strict")
    return keyword is not None and not (
        isinstance(keyword.value, ast.Constant) and keyword.value.value is True
    )


@exemption("TL306", "neg_trainer_loads_its_own_parts.py")
def _own_load_state_dict(facts: Facts, call: ast.Call) -> bool:
    """The receiver is an object of a project class that is no module and writes its own
    `load_state_dict` (a trainer restoring its parts): what `strict` means there, and what it
    does with the missing keys, is that method's business."""
    receiver = facts.receiver(call)
    value = facts.binding_value(receiver) if receiver is not None else None
    if not isinstance(value, ast.Call) or not isinstance(value.func, ast.Name):
        return False
    info = facts.classes.get(value.func.id)
    owner = facts
    if info is None:
        definition = facts.definition(value.func.id)
        if definition is None or not isinstance(definition.node, ast.ClassDef):
            return False
        owner, info = definition.facts, definition.facts.classes.get(definition.node.name)
    if info is None or owner.module_class(info.node.name) is not None:
        return False
    return "load_state_dict" in info.methods


@rule(
    "TL306",
    "load-state-dict-not-strict-unchecked",
    "W",
    "load_state_dict(strict=False) whose missing/unexpected keys are ignored",
)
def load_state_dict_not_strict_unchecked(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    `model.load_state_dict(state, strict=False)` used as a statement, so the returned
    missing and unexpected keys are thrown away (a call on an object of a project class that
    is no module and writes its own `load_state_dict`, a trainer, is that method's business
    and not reported). Not reported when the keys were filtered to
    the model's own first (`{k: v for k, v in sd.items() if k in model.state_dict()}`, or
    by a lookup that raises on any other key: `if model.state_dict()[k].numel() ==
    v.numel()`), the
    next statement reports on what was loaded (`print(f"loaded {len(state)} tensors")`), the
    code compared the checkpoint with all of the model's keys beforehand and logged what
    differs, two partial loads into the same module follow each other (base weights, then
    an adapter's), keys were dropped from the dict by their literal names first
    (`sd.pop("fc.weight")`),
    the weights come from a live module's `state_dict()` or from a dict written out with
    the names of the entries it sets (`{"log_alpha": values}`, never added to), each loop
    iteration loads one shard, an `assert` checks the result right after, a comment on
    the call explains the mismatch, or the call is the fallback in the `except` of a strict
    load into the same module whose error the handler prints or logs (that message lists
    every mismatched key).

    ## Why it is wrong
    `strict=False` turns every key mismatch into silence. A renamed layer, a `module.` prefix
    left by DataParallel or a different architecture loads *nothing* for those layers, which
    keep their random initialisation, and training or evaluation proceeds as if the
    checkpoint had loaded.

    ## Example
    ```python
    model.load_state_dict(checkpoint["model"], strict=False)    # TL306
    ```

    ## Fix
    Check the result:
    `result = model.load_state_dict(state, strict=False)` then assert or log
    `result.missing_keys` / `result.unexpected_keys`. No automatic fix.
    """
    for call in facts.method_calls("load_state_dict"):
        keyword = _keyword(call, "strict")
        if keyword is None or not isinstance(keyword.value, ast.Constant):
            continue
        if keyword.value.value is not False:
            continue
        statement = facts.parents.get(call)
        if not isinstance(statement, ast.Expr):
            continue
        if _own_load_state_dict(facts, call):
            continue  # a trainer's own `load_state_dict`, not a module's: it decides itself
        state = call.args[0] if call.args else None
        if state is not None and (
            _filtered_to_own_keys(facts, state) or _reported_after(facts, statement, state)
        ):
            continue
        if _checked_against_model_before(facts, call) or _split_load(facts, call, statement):
            continue
        if _after_reported_strict_failure(facts, call):
            continue  # the strict load's error, printed, already names every mismatched key
        if state is not None and _prepared_or_acknowledged(facts, call, statement, state):
            continue
        yield Hit(
            call,
            "`load_state_dict(..., strict=False)` result is ignored: missing or unexpected keys "
            "(layers left at random initialisation) go unnoticed",
        )
