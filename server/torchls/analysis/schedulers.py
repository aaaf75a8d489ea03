"""Learning-rate schedulers: which constructor a name holds and how it is meant to be stepped.

In: `Facts` and an expression or a scheduler constructor call. Out: the constructors every
binding of a name builds, the scheduler type, and the schedule's design cadence — "epoch" or
"batch" — read from its arguments (a `T_max` spelled in epochs, `steps_per_epoch`, ...), or
None when the code does not say. Shared by the facts (`Facts.scheduler_cadence`) and the TL4xx
rules.
"""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING

from torchls.analysis.findings import Related
from torchls.analysis.objects import ObjectModel, Value

if TYPE_CHECKING:
    from torchls.analysis.facts import Facts


def scheduler_constructors(facts: Facts, expr: ast.AST | None, depth: int = 0) -> list[ast.Call]:
    """Every scheduler constructor call `expr` may hold (all its bindings; for a parameter,
    the arguments of its in-file call sites; for a name unpacked from a call, that position
    of the tuple the callee returns; for `self.x`, its assignments here or in a base class),
    or [] when any binding is unknown (a parameter no call here passes, a loop target). A
    constructor found in another file is answered in that file's terms by `schedule_design`
    (the object model remembers where it is)."""
    found = _constructors(facts, expr, depth)
    model = facts.get(ObjectModel)
    model.note([Value(owner, call) for owner, call in found])
    return [call for _, call in found]


def _constructors(facts: Facts, expr: ast.AST | None, depth: int) -> list[tuple[Facts, ast.Call]]:
    if expr is None or depth > 4:
        return []
    if isinstance(expr, (ast.Name, ast.Attribute)):
        values = facts.get(ObjectModel).values(expr)
        if not values:
            return []
    else:
        values = [Value(facts, expr)]  # type: ignore[arg-type]
    found: list[tuple[Facts, ast.Call]] = []
    for value in values:
        resolved = _constructors_in_value(value.facts, value.expr, depth)
        if resolved is None:
            return []
        found.extend(resolved)
    return found


def _constructors_in_value(
    facts: Facts, value: ast.expr, depth: int
) -> list[tuple[Facts, ast.Call]] | None:
    if isinstance(value, ast.Constant) and value.value is None:
        return []
    if isinstance(value, ast.IfExp):
        body = _constructors_in_value(facts, value.body, depth)
        orelse = _constructors_in_value(facts, value.orelse, depth)
        return None if body is None or orelse is None else body + orelse
    if isinstance(value, ast.Call):
        kind = facts.kind_of(value)
        if kind is not None and kind.kind == "scheduler" and kind.node is value and kind.detail:
            return [(facts, value)]
        return None
    if isinstance(value, (ast.Name, ast.Attribute)):
        found = _constructors(facts, value, depth + 1)
        return found or None
    return None


def hand_written_scheduler(facts: Facts, expr: ast.AST | None) -> bool:
    """`expr` holds, on every binding (for a parameter, at every in-file call site), either
    None or an instance of a project class with no base outside the project (`CycleScheduler`
    in the repository's own `scheduler.py`, writing `group["lr"]` in its `step()`): its
    `step()` follows the author's contract, not `torch.optim.lr_scheduler`'s."""
    values = _held_values(facts, expr)
    if not values:
        return False
    seen_class = False
    for owner, value in values:
        if isinstance(value, ast.Constant) and value.value is None:
            continue
        found = _project_class(owner, value.func) if isinstance(value, ast.Call) else None
        if found is None or not _project_only_bases(*found):
            return False
        seen_class = True
    return seen_class


def _held_values(
    facts: Facts, expr: ast.AST | None, depth: int = 0
) -> list[tuple[Facts, ast.expr]] | None:
    """The values `expr` may hold, as `scheduler_constructors` collects them; None when one
    is out of sight."""
    if expr is None or depth > 4:
        return None
    if isinstance(expr, ast.Name) and facts.parameter_of(expr) is not None:
        values = facts.parameter_arguments(expr)
    elif isinstance(expr, ast.Name):
        scope = facts.scope(expr)
        assignments = facts.assignments_of(expr.id, scope)
        if not assignments and scope is not facts.tree:
            assignments = facts.assignments_of(expr.id, facts.tree)
        if any(a.value is None or a.index is not None or a.loop for a in assignments):
            return None
        values = [a.value for a in assignments]  # type: ignore[misc]
    elif isinstance(expr, ast.Attribute):
        values = facts.self_attribute_values(expr)
    else:
        values = [expr]  # type: ignore[list-item]
    if not values:
        return None
    found: list[tuple[Facts, ast.expr]] = []
    for value in values:
        parts = [value.body, value.orelse] if isinstance(value, ast.IfExp) else [value]
        for part in parts:
            if isinstance(part, (ast.Name, ast.Attribute)):
                inner = _held_values(facts, part, depth + 1)
                if inner is None:
                    return None
                found.extend(inner)
            else:
                found.append((facts, part))
    return found


def _project_class(facts: Facts, name: ast.expr) -> tuple[Facts, ast.ClassDef] | None:
    """The class a plain name stands for, in this file or (through an import) another project
    file; None for anything else."""
    if not isinstance(name, ast.Name):
        return None
    if name.id in facts.classes:
        return facts, facts.classes[name.id].node
    definition = facts.definition(name.id)
    if definition is not None and isinstance(definition.node, ast.ClassDef):
        return definition.facts, definition.node
    return None


def _project_only_bases(facts: Facts, node: ast.ClassDef, depth: int = 0) -> bool:
    """Every base of the class, up the chain, is a project class (or `object`)."""
    if depth > 4:
        return False
    for base in node.bases:
        if isinstance(base, ast.Name) and base.id == "object":
            continue
        found = _project_class(facts, base)
        if found is None or found[1] is node or not _project_only_bases(*found, depth + 1):
            return False
    return True


def scheduler_type(facts: Facts, expr: ast.AST | None) -> tuple[str, list[ast.Call]] | None:
    """("StepLR", constructors) when every binding of `expr` builds the same scheduler type."""
    constructors = scheduler_constructors(facts, expr)
    model = facts.get(ObjectModel)
    names = {model.owner_of(c).short_name(c) for c in constructors}
    if len(names) != 1:
        return None
    return names.pop(), constructors


def constructor_related(facts: Facts, constructors: list[ast.Call]) -> tuple[Related, ...]:
    """Where each scheduler was built, for a finding reported where it is stepped: the
    construction is often in another function or file (`prepare_model()` returning it)."""
    model = facts.get(ObjectModel)
    related = []
    for constructor in constructors:
        owner = model.owner_of(constructor)
        filename = owner.filename if owner is not facts else None
        related.append(Related(owner.source.span(constructor), "scheduler built here", filename))
    return tuple(related)


def call_argument(call: ast.Call, name: str, index: int) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    if index < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args):
        return call.args[index]
    return None


# ---------------------------------------------------------------------- schedule units
STEP_WORD_RE = re.compile(r"step|iter|batch|update|sample|^len$|^n_?iters?$|loader", re.I)
EPOCH_WORD_RE = re.compile(r"epoch", re.I)


def _words(facts: Facts, expr: ast.AST, depth: int = 0) -> tuple[set[str], list[float]]:
    """Identifiers and numeric constants `expr` is computed from, through local names."""
    words: set[str] = set()
    numbers: list[float] = []
    for node in ast.walk(expr):
        if isinstance(node, ast.Name):
            words.add(node.id)
            value = facts.binding_value(node) if depth < 3 else None
            if value is not None:
                more, more_numbers = _words(facts, value, depth + 1)
                words |= more
                numbers += more_numbers
        elif isinstance(node, ast.Attribute):
            words.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            if not isinstance(node.value, bool):
                numbers.append(float(node.value))
    return words, numbers


def schedule_unit(facts: Facts, expr: ast.AST | None) -> str | None:
    """ "step" when a schedule length is counted in batches/steps, "epoch" when in epochs,
    "const" for plain numbers, None when it cannot be told."""
    if expr is None:
        return None
    words, numbers = _words(facts, expr)
    if any(STEP_WORD_RE.search(w) and not w.lower().endswith("epoch") for w in words):
        return "step"
    if any(EPOCH_WORD_RE.search(w) for w in words):
        return "epoch"
    if not words and numbers:
        return "const"
    return None


def _largest(facts: Facts, expr: ast.AST | None) -> float:
    if expr is None:
        return 0.0
    return max(_words(facts, expr)[1], default=0.0)


# Schedules only known to be per-epoch when their length is spelled in epochs.
LENGTH_PARAMETERS = {
    "CosineAnnealingLR": ("T_max", 1),
    "LinearLR": ("total_iters", 3),
    "ConstantLR": ("total_iters", 2),
    "PolynomialLR": ("total_iters", 1),
}


def schedule_design(facts: Facts, constructor: ast.Call) -> str | None:
    """How the schedule is meant to be stepped: "epoch", "batch", or None (cannot tell)."""
    facts = facts.get(ObjectModel).owner_of(constructor)
    name = facts.short_name(constructor)
    if name == "ReduceLROnPlateau":
        return "epoch"
    if name in ("StepLR", "MultiStepLR"):
        length = call_argument(constructor, "step_size" if name == "StepLR" else "milestones", 1)
        unit = schedule_unit(facts, length)
        if unit == "epoch" or (unit == "const" and _largest(facts, length) <= 500):
            return "epoch"
        return None
    if name == "ExponentialLR":
        gamma = call_argument(constructor, "gamma", 1)
        unit = schedule_unit(facts, gamma)
        if unit == "epoch" or (unit == "const" and _largest(facts, gamma) < 0.99):
            return "epoch"
        return None
    if name in ("CosineAnnealingLR", "LinearLR", "ConstantLR", "PolynomialLR"):
        parameter, index = LENGTH_PARAMETERS[name]
        length = call_argument(constructor, parameter, index)
        return "epoch" if schedule_unit(facts, length) == "epoch" else None
    if name == "OneCycleLR":
        per_epoch = call_argument(constructor, "steps_per_epoch", 4)
        if per_epoch is not None:
            # `steps_per_epoch=1` is a one-cycle schedule over epochs, stepped once per epoch.
            single = isinstance(per_epoch, ast.Constant) and per_epoch.value == 1
            return None if single else "batch"
        total = call_argument(constructor, "total_steps", 2)
        return "batch" if schedule_unit(facts, total) == "step" else None
    if name == "CyclicLR":
        size = call_argument(constructor, "step_size_up", 4)
        if size is None or schedule_unit(facts, size) == "step":
            return "batch"
        return None
    return None


def scheduler_cadence(facts: Facts, expr: ast.AST | None) -> str | None:
    """ "epoch" or "batch" when every binding of `expr` is a scheduler designed to be stepped
    at that rate, else None."""
    found = scheduler_type(facts, expr)
    if found is None:
        return None
    designs = {schedule_design(facts, constructor) for constructor in found[1]}
    return designs.pop() if len(designs) == 1 else None


def hook_plateaus(facts: Facts, function: ast.AST) -> list[tuple[Facts, ast.Call]]:
    """The `ReduceLROnPlateau` constructors Lightning may hand to `function`, when it is a
    LightningModule's `lr_scheduler_step(self, scheduler, metric)` hook: those that the class's
    `configure_optimizers` returns, itself or through the helper whose result it returns
    (`return build_optimizers(self.hparams, self.parameters())`), as a `"scheduler"` entry of
    a dict or in the returned value itself. One is enough: under the configuration that
    builds it, the hook receives a plateau scheduler."""
    if not isinstance(function, ast.FunctionDef) or function.name != "lr_scheduler_step":
        return []
    owner = facts.enclosing_class(function)
    if owner is None or facts.module_class(owner.name) is None:
        return []
    if not any(base.endswith("LightningModule") for base in _class_chain_bases(facts, owner)):
        return []
    configure = next(
        (
            node
            for node in owner.body
            if isinstance(node, ast.FunctionDef) and node.name == "configure_optimizers"
        ),
        None,
    )
    if configure is None:
        return []
    found: list[tuple[Facts, ast.Call]] = []
    for where, builder in _returning_functions(facts, configure):
        found.extend((where, call) for call in _returned_plateaus(where, builder))
    return found


def _class_chain_bases(facts: Facts, node: ast.ClassDef, depth: int = 0) -> list[str]:
    """The qualified bases of the in-file class `node` and of its in-file bases."""
    info = facts.classes.get(node.name)
    if info is None or depth > 4:
        return []
    bases = list(info.bases)
    for base in info.bases:
        if base in facts.classes and facts.classes[base].node is not node:
            bases.extend(_class_chain_bases(facts, facts.classes[base].node, depth + 1))
    return bases


def _returning_functions(facts: Facts, function: ast.FunctionDef) -> list[tuple[Facts, ast.AST]]:
    """`function`, and the project functions whose call one of its `return`s hands back."""
    found: list[tuple[Facts, ast.AST]] = [(facts, function)]
    for node in ast.walk(function):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Call):
            target = facts.callee(node.value)
            if target is not None and not target[2]:
                found.append((target[0], target[1]))
    return found


def _returned_plateaus(facts: Facts, function: ast.AST) -> list[ast.Call]:
    """Plateau constructors in `function` that reach what it returns: a `"scheduler"` dict
    entry, or the returned expression, holding the constructor or a local bound to it."""
    bound: dict[str, list[ast.Call]] = {}
    plateaus: list[ast.Call] = []
    for node in ast.walk(function):
        if isinstance(node, ast.Call) and _is_plateau(facts, node):
            plateaus.append(node)
            parent = facts.parents.get(node)
            if isinstance(parent, ast.Assign) and len(parent.targets) == 1:
                target = parent.targets[0]
                if isinstance(target, ast.Name):
                    bound.setdefault(target.id, []).append(node)

    def held(expr: ast.AST | None) -> list[ast.Call]:
        if isinstance(expr, ast.Call) and expr in plateaus:
            return [expr]
        if isinstance(expr, ast.Name):
            return bound.get(expr.id, [])
        return []

    found: list[ast.Call] = []
    for node in ast.walk(function):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "scheduler":
                    found.extend(held(value))
        elif isinstance(node, ast.Return) and node.value is not None:
            for part in ast.walk(node.value):
                found.extend(held(part))
    return list(dict.fromkeys(found))


def _is_plateau(facts: Facts, call: ast.Call) -> bool:
    kind = facts.kind_of(call)
    return (
        kind is not None
        and kind.kind == "scheduler"
        and kind.node is call
        and facts.short_name(call) == "ReduceLROnPlateau"
    )
