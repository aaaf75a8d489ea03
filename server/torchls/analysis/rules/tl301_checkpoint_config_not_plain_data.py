"""TL301 checkpoint-config-not-plain-data: a checkpoint stores something that
`torch.load(weights_only=True)` refuses to unpickle.

It reports a config object (argparse Namespace, dataclass, other custom object), a whole
stateful object (a model, an optimizer) or a NumPy value saved with `torch.save`, directly or
through a save wrapper. In: the file's `Facts`. Out: `Hit`s, with a fix where one is safe.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.findings import Fix, Related
from torchls.analysis.registry import Hit, exemption, rule
from torchls.analysis.rules._checkpoints import LOAD, SAVE, _dict_values, _keyword
from torchls.analysis.rules._checkpoints_config import config_from_other_files
from torchls.analysis.rules._checkpoints_numpy import _numpy_value
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


@exemption("TL301", "neg_whole_model_loaded_unsafely_on_purpose.py")
def _loads_unsafely(facts: Facts) -> bool:
    """The file loads a checkpoint with an explicit `weights_only=False`: its author chose full
    unpickling, so objects saved beside the weights are read back as intended."""
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
    the code calls: `{"net": net, "acc": acc}`). Helpers count: a
    parameter is what every call site passes for it, or what its annotation says
    (`cfg: TrainConfig`), a value an in-file helper returns is what all its returns hand
    back (`opt = parse_option()` returning `parser.parse_args()`, or the same element of
    the tuples they return: `opts, ds_init = get_args()`), and a save wrapper
    (`save_on_master(obj, path)`,
    `utils.save_checkpoint(state, ...)`, also in another project file) saves the dict its
    call site passes. A parameter of a function or constructor that no call in the file runs,
    also kept on `self` (`self.config = cfg`), is what the project's other files pass for
    it, when every one of them passes a new instance of one plain project class
    (`Runner(cfg=Config(args))` in the script). A NumPy
    value is reported too (a metric kept as `np.nanmean(...)` returned it,
    `np.array(losses).mean()`, a best score `max()` took from such values): `float(x)`,
    `x.item()` and `x.tolist()` make it a Python value and are not reported.

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
        related: tuple[Related, ...] = ()
        if found is None and _named(value):
            # `self.config = cfg` in `__init__`, the class built in another file with a
            # project config object: `Runner(cfg=Config(args))` in the training script.
            elsewhere = config_from_other_files(facts, value)
            if elsewhere is not None:
                found = elsewhere[:2]
                other, built = elsewhere[2], elsewhere[3]
                related = (
                    Related(other.source.span(built), "the object built here", other.filename),
                )
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
                (replace_node(facts, value, f"vars({text})"),),
            )
        elif kind == "dataclass":
            asdict, import_edits = _asdict_spelling(facts)
            fix = Fix(
                applicability,
                f"Store `{asdict}({text})`",
                (
                    *import_edits,
                    replace_node(facts, value, f"{asdict}({text})"),
                ),
            )
        yield Hit(
            value,
            f"checkpoint stores `{text}` ({class_name} object), which "
            "`torch.load(weights_only=True)` (the default since PyTorch 2.6) refuses to load",
            fix,
            related=related,
        )
