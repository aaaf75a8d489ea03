"""TL3xx: checkpoints that cannot be loaded, resumed or trusted."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.findings import Fix
from torchls.analysis.queries.vocabulary import argument_at
from torchls.analysis.registry import Hit, rule
from torchls.analysis.rules._checkpoints import LOAD, SAVE, _dict_values, _keyword
from torchls.analysis.rules._checkpoints_numpy import _numpy_value
from torchls.analysis.rules._checkpoints_partial import (
    _next_statement,
    _prepared_or_acknowledged,
    _split_load,
)
from torchls.analysis.rules._edits import insert_at, replace_node


def _config_object(facts: Facts, value: ast.expr, depth: int = 0) -> tuple[str, str] | None:
    """(kind, class name) when `value` is an argparse Namespace, a dataclass instance or an
    instance of another in-file class that is not a module. A helper's parameter is what its
    annotation says (`cfg: TrainConfig`), else what every call site passes for it (sites that
    disagree: unknown)."""
    if isinstance(value, ast.Call):
        origins = [] if depth == 0 else facts.origins(value)
    else:
        origins = facts.origins(value) if isinstance(value, (ast.Name, ast.Attribute)) else []
    if len(origins) != 1 or origins[0].facts is not None:
        return None
    node = origins[0].node
    if isinstance(node, ast.Name) and depth < 3:
        return _parameter_config(facts, node, depth)
    if not isinstance(node, ast.Call):
        return None
    method = facts.method_name(node)
    if method == "parse_args":
        return "namespace", "Namespace"
    if facts.call_qualname(node) in ("argparse.Namespace",):
        return "namespace", "Namespace"
    function = facts.called_function(node)
    if function is not None and depth < 3:
        # `opt = parse_option()`: an in-file helper every one of whose returns hands back
        # the same kind of config object (the Namespace its parser built).
        returned = [
            r.value
            for r in facts.walk_local(function)
            if isinstance(r, ast.Return) and r.value is not None
        ]
        found = {_config_object(facts, r, depth + 1) for r in returned}
        if len(returned) and len(found) == 1 and None not in found:
            return found.pop()
        return None
    if isinstance(node.func, ast.Name) and node.func.id in facts.classes:
        info = facts.classes[node.func.id]
        if facts.module_class(node.func.id):
            return None
        if any(base.endswith(("Enum", "NamedTuple", "TypedDict", "dict")) for base in info.bases):
            return None
        return ("dataclass" if info.is_dataclass else "object"), node.func.id
    return None


def _named(expr: ast.expr) -> bool:
    """A name or attribute (`args`, `self.cfg`): what a config object is saved through."""
    return isinstance(expr, ast.Name) or (
        isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name)
    )


# Methods only a stateful torch object has (a module, an optimizer, a scheduler, a scaler):
# a value they are called on is no plain data, whatever its class.
_STATEFUL_METHODS = ("state_dict", "parameters", "named_parameters")


def _stateful_object(facts: Facts, value: ast.expr, depth: int = 0) -> str | None:
    """How to name `value` when it holds a module or another object with a `state_dict`
    rather than data: an instance of a project module class built in sight, a torch module
    or optimizer built in sight (`torch.optim.Adam(...)`), a name whose same binding has
    `.state_dict()` / `.parameters()` called on it in its scope (a model handed to a helper,
    then stored whole next to its own state dict), or a helper's parameter that every call
    site fills with one of those."""
    module = facts.module_object(value)
    if module is not None:
        return f"a whole {module[1].node.name} module object"
    if not isinstance(value, ast.Name):
        return None
    binding = facts.reaching_assignment(value)
    if binding is None and depth < 2:
        arguments = facts.parameter_arguments(value)
        if arguments:
            found = [_stateful_object(facts, argument, depth + 1) for argument in arguments]
            if all(found):
                return found[0]
    if binding is not None and not isinstance(binding.value, ast.Call):
        return None  # a literal, a loop target, an unpacked value: not known to be an object
    if binding is not None and binding.index is None:
        qualname = facts.call_qualname(binding.value) or ""  # type: ignore[arg-type]
        head, _, last = qualname.rpartition(".")
        if head.startswith(("torch.optim", "torch.nn")) and last[:1].isupper():
            return f"a whole {last} object"
    scope = facts.scope(value)
    for call in facts.method_calls(*_STATEFUL_METHODS):
        receiver = facts.receiver(call)
        if (
            isinstance(receiver, ast.Name)
            and receiver.id == value.id
            and facts.scope(receiver) is scope
            and facts.reaching_assignment(receiver) is binding
        ):
            return f"an object whose `.{facts.method_name(call)}()` this code calls, not plain data"
    return None


def _numpy_allow_listed(facts: Facts) -> bool:
    """The file allow-lists NumPy's classes for weights_only loading itself."""
    return any(
        "np." in text or "numpy" in text or "scalar" in text
        for text in map(facts.source.segment, _safe_globals_lists(facts))
    )


def _safe_globals_lists(facts: Facts) -> Iterator[ast.expr]:
    """What each `torch.serialization.add_safe_globals(...)` / `safe_globals(...)` call here
    allow-lists for weights_only loading (its first argument)."""
    for call in facts.calls:
        qualname = facts.call_qualname(call) or ""
        if qualname.endswith(("add_safe_globals", "safe_globals")) and call.args:
            yield call.args[0]


def _parameter_config(facts: Facts, name: ast.Name, depth: int) -> tuple[str, str] | None:
    annotation = facts.parameter_annotation(name)
    if annotation is not None:
        if facts.qualname(annotation) == "argparse.Namespace":
            return "namespace", "Namespace"
        if isinstance(annotation, ast.Name):
            info = facts.classes.get(annotation.id)
            if info is None:
                definition = facts.definition(annotation.id)
                node = definition.node if definition is not None else None
                if isinstance(node, ast.ClassDef):
                    info = definition.facts.classes.get(node.name)  # type: ignore[union-attr]
            if info is not None and info.is_dataclass:
                return "dataclass", annotation.id
        return None
    arguments = facts.parameter_arguments(name)
    if not arguments:
        return None
    found = {_config_object(facts, argument, depth + 1) for argument in arguments}
    return found.pop() if len(found) == 1 else None


def _saved_through_wrappers(facts: Facts) -> Iterator[ast.expr]:
    """Values a call of a save wrapper puts in the checkpoint: the dict passed as the saved
    object (`save_on_master({...}, path)`, `utils.save_checkpoint(state, ...)`), and, for a
    helper in another file that stores its parameter in the dict it saves, the argument."""
    if not facts.calls_to(*SAVE) and not facts.imports_project_modules:
        return  # no save here and no other project file to hold a save wrapper
    for call in facts.project_calls:
        asked = facts.call_summary(call)
        if asked is None:
            continue
        summary, bound, owner = asked
        for name in summary.saves:
            argument = bound.get(name)
            if argument is not None:
                yield from _dict_values(facts, argument)
        if owner is not facts:  # in this file the helper's own `torch.save` is reported
            for name in summary.saves_values:
                argument = bound.get(name)
                if argument is not None:
                    yield argument


def _allow_listed(facts: Facts, class_name: str) -> bool:
    for listed in _safe_globals_lists(facts):
        elements = listed.elts if isinstance(listed, (ast.List, ast.Tuple, ast.Set)) else []
        for element in elements:
            if facts.source.segment(element).split(".")[-1] == class_name:
                return True
    return False


def _loads_unsafely(facts: Facts) -> bool:
    for call in facts.calls_to(*LOAD):
        keyword = _keyword(call, "weights_only")
        if keyword is not None and isinstance(keyword.value, ast.Constant):
            if keyword.value.value is False:
                return True
    return False


def _asdict_spelling(facts: Facts) -> tuple[str, list]:
    """How to call `dataclasses.asdict` here, and the import edit needed, if any."""
    for alias, target in facts.imports.items():
        if target == "dataclasses.asdict":
            return alias, []
        if target == "dataclasses":
            return f"{alias}.asdict", []
    last_import = max(
        (n for n in facts.tree.body if isinstance(n, (ast.Import, ast.ImportFrom))),
        key=lambda n: n.end_lineno or n.lineno,
        default=None,
    )
    row = (last_import.end_lineno or last_import.lineno) + 1 if last_import else 1
    return "dataclasses.asdict", [insert_at(row, 0, "import dataclasses\n")]


@rule(
    "TL301",
    "checkpoint-config-not-plain-data",
    "E",
    "Checkpoint stores a config object that weights_only loading rejects",
    fix="safe",
    # A `weights_only=False` load anywhere in the file decides what a save there means.
    whole_file=("weights_only",),
)
def checkpoint_config_not_plain_data(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    `torch.save` of an `argparse.Namespace`, a dataclass instance or another custom object
    (typically the run's config), on its own (`torch.save(args, "training_args.bin")`) or in
    a dict next to the weights; or a dict holding a whole model (an
    instance of a project module class, or a value whose `.state_dict()` or `.parameters()`
    the code calls: `{"net": net, "acc": acc}`; not in a file that loads with an explicit
    `weights_only=False`, which shows the author chose to unpickle). Helpers count: a
    parameter is what every call site passes for it, or what its annotation says
    (`cfg: TrainConfig`), a value an in-file helper returns is what all its returns hand
    back (`opt = parse_option()` returning `parser.parse_args()`, or the same element of
    the tuples they return: `opts, ds_init = get_args()`), and a save wrapper
    (`save_on_master(obj, path)`,
    `utils.save_checkpoint(state, ...)`, also in another project file) saves the dict its
    call site passes. A NumPy value is reported too (a metric kept as `np.nanmean(...)`
    returned it, `np.array(losses).mean()`, a best score `max()` took from such values):
    `float(x)`, `x.item()` and `x.tolist()` make it a Python value and are not reported.

    ## Why it is wrong
    Since PyTorch 2.6, `torch.load` defaults to `weights_only=True`, which only unpickles
    tensors and plain containers. A checkpoint with a custom object fails to load with an
    `UnpicklingError` — often months later, on another machine, when you need to resume.
    Loaders that allow-list the class (`torch.serialization.add_safe_globals` /
    `safe_globals`) are fine and are not reported.

    ## Example
    ```python
    args = parser.parse_args()
    torch.save({"model": model.state_dict(), "args": args}, path)   # TL301
    ```

    ## Fix
    Store plain data: `vars(args)` for a Namespace, `dataclasses.asdict(cfg)` for a dataclass,
    `net.state_dict()` for a model (and `load_state_dict` it into a new instance on load),
    `float(x)` or `x.tolist()` for a NumPy value.
    """
    unsafe_loading = _loads_unsafely(facts)
    saved = [v for c in facts.calls_to(*SAVE) if c.args for v in _dict_values(facts, c.args[0])]
    # The saved object itself: `torch.save(args, "training_args.bin")` (a whole module saved
    # on its own is TL305's, not this rule's).
    whole = {c.args[0] for c in facts.calls_to(*SAVE) if c.args and _named(c.args[0])}
    seen: set[ast.expr] = set()
    for value in [*saved, *whole, *_saved_through_wrappers(facts)]:
        if value in seen:
            continue
        seen.add(value)
        found = _config_object(facts, value)
        produced = None if found is not None or unsafe_loading else _numpy_value(facts, value)
        if produced is not None and not _numpy_allow_listed(facts):
            text = facts.source.segment(value)
            yield Hit(
                value,
                f"checkpoint stores `{text}`, a NumPy value (from `"
                f"{facts.source.segment(produced.func)}(...)` on line {produced.lineno}), which "
                "`torch.load(weights_only=True)` (the default since PyTorch 2.6) refuses to "
                f"load; store `float({text})` or `{text}.tolist()`",
                None,
            )
            continue
        if found is None:
            if value in whole:
                continue
            stateful = None if unsafe_loading else _stateful_object(facts, value)
            if stateful is not None:
                text = facts.source.segment(value)
                yield Hit(
                    value,
                    f"checkpoint stores `{text}` itself ({stateful}), which "
                    "`torch.load(weights_only=True)` (the default since PyTorch 2.6) refuses "
                    f"to load; store `{text}.state_dict()`",
                    None,
                )
            continue
        kind, class_name = found
        if _allow_listed(facts, class_name):
            continue
        text = facts.source.segment(value)
        fix = None
        # Saved on its own, the loaded object itself changes type: the loader must change too.
        applicability = "unsafe" if unsafe_loading or value in whole else "safe"
        if kind == "namespace":
            fix = Fix(
                applicability,
                f"Store `vars({text})`",
                (  # type: ignore[arg-type]
                    replace_node(facts, value, f"vars({text})"),
                ),
            )
        elif kind == "dataclass":
            asdict, import_edits = _asdict_spelling(facts)
            fix = Fix(
                applicability,
                f"Store `{asdict}({text})`",
                (  # type: ignore[arg-type]
                    *import_edits,
                    replace_node(facts, value, f"{asdict}({text})"),
                ),
            )
        yield Hit(
            value,
            f"checkpoint stores `{text}` ({class_name} object), which "
            "`torch.load(weights_only=True)` (the default since PyTorch 2.6) refuses to load",
            fix,
        )


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
    (directly, or through a save wrapper it is handed to) that holds the model's
    `state_dict()` but not the optimizer's — nor the scheduler's or the GradScaler's when the
    script has them. Plain SGD without momentum keeps no state and is not reported for the
    optimizer, and neither is one export written once after the training loop has ended,
    nor a scheduler every `step()` of which names the epoch (`scheduler.step(epoch)`: the
    saved epoch restores its rate), nor an object rebuilt on every pass of the loop the save
    sits in (a fresh optimizer per
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
    for call, saved in _checkpoint_saves(facts):
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
                bool(local["scheduler"])
                and not any(_positioned_by_epoch(c) for c, _ in constructed["scheduler"])
                and not all(_stepped_at_epoch(facts, c) for c, _ in local["scheduler"])
            )
            or "scheduler" in held,
            "scaler": bool(local["scaler"]) or "scaler" in held,
        }
        values = _dict_values(facts, saved)
        owners = [_state_dict_owner(facts, v) for v in values]
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
