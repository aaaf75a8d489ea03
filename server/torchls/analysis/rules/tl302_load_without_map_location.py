"""TL302 load-without-map-location: `torch.load` without `map_location` where the
checkpoint's device can matter.

It skips loads that only run with CUDA, files this script wrote from CPU tensors and loaded
objects only read as data. In: the file's `Facts`. Out: `Hit`s with an unsafe fix adding
`map_location="cpu"`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.findings import Fix
from torchls.analysis.registry import Hit, exemption, rule
from torchls.analysis.rules._checkpoints import LOAD, SAVE, _keyword
from torchls.analysis.rules._checkpoints_paths import same_path_value
from torchls.analysis.rules._edits import insert_at


@exemption("TL302", "neg_map_location_given.py")
def _has_star_kwargs(call: ast.Call) -> bool:
    """The load passes `**kwargs` or `*args`, which may carry `map_location`: it cannot be
    told missing."""
    return any(k.arg is None for k in call.keywords) or any(
        isinstance(a, ast.Starred) for a in call.args
    )


# Reading a loaded value through these keeps looking at the same object.
_LOOKUPS = {"get", "pop", "items", "values", "keys", "__getitem__"}
# Using the loaded value as a module or as state to restore: it is a checkpoint.
_STATE_USES = {
    "load_state_dict",
    "eval",
    "train",
    "parameters",
    "named_parameters",
    "state_dict",
    "modules",
    "children",
}
# Built-ins that only read a value.
_READERS = {"len", "print", "isinstance", "list", "tuple", "sorted", "iter", "zip", "enumerate"}


def _loaded_use(facts: Facts, load: ast.Call, depth: int = 0) -> str:
    """What the code does with what `torch.load` returned: "state" (restored into a module or
    optimizer, or used as a module), "data" (only read as tensors or plain values), or
    "unknown" (returned, stored, passed on to code we cannot see)."""
    return _value_use(facts, load, depth)


def _value_use(facts: Facts, node: ast.AST, depth: int) -> str:
    parent = facts.parents.get(node)
    while True:
        if isinstance(parent, ast.Subscript) and parent.value is node:
            node, parent = parent, facts.parents.get(parent)
            continue
        if (
            isinstance(parent, ast.Attribute)
            and parent.value is node
            and parent.attr in _LOOKUPS
            and isinstance(facts.parents.get(parent), ast.Call)
        ):
            node = facts.parents[parent]
            parent = facts.parents.get(node)
            continue
        break
    if isinstance(parent, ast.Attribute) and parent.value is node:
        return "state" if parent.attr in _STATE_USES else "data"
    if isinstance(parent, ast.keyword):
        node, parent = parent, facts.parents.get(parent)
    if isinstance(parent, ast.Call) and node is not parent.func:
        if facts.method_name(parent) in _STATE_USES:
            return "state"
        if isinstance(parent.func, ast.Name) and parent.func.id in _READERS:
            return "data"
        qualname = facts.call_qualname(parent) or ""
        return "data" if qualname.startswith("torch.") else "unknown"
    if isinstance(parent, ast.Call):  # the loaded object is called: a pickled module
        return "state"
    if isinstance(parent, ast.comprehension) and node is parent.iter:
        # `{k: v for k, v in ckpt["model"].items()}` builds a new container of the loaded
        # values: what happens to that container is what happens to them.
        built = facts.parents.get(parent)
        targets = {n.id for n in ast.walk(parent.target) if isinstance(n, ast.Name)}
        if (
            depth < 3
            and isinstance(built, (ast.DictComp, ast.ListComp))
            and _reads_any(built, targets)
            and _value_use(facts, built, depth + 1) == "state"
        ):
            return "state"
        return "data"
    if isinstance(parent, ast.For) and node is parent.iter:
        # Iterating the loaded dict is reading it, unless the items go on to be restored
        # (`for k, v in ckpt["ema"].items(): new[k] = v` then `load_state_dict(new)`).
        if depth < 3:
            loop_names = [n.id for n in ast.walk(parent.target) if isinstance(n, ast.Name)]
            uses = [use for name in loop_names for use in facts.uses_of(parent, name)]
            if any(_value_use(facts, use, depth + 1) == "state" for use in uses):
                return "state"
        return "data"
    if isinstance(parent, (ast.BinOp, ast.Compare, ast.FormattedValue, ast.UnaryOp)):
        return "data"
    if isinstance(parent, ast.Assign) and len(parent.targets) == 1 and depth < 3:
        target = parent.targets[0]
        if _restored_container(facts, target, depth):
            return "state"
        names = [target] if isinstance(target, ast.Name) else []
        if isinstance(target, (ast.Tuple, ast.List)):
            names = [e for e in target.elts if isinstance(e, ast.Name)]
            if len(names) != len(target.elts):
                return "unknown"
        if not names:
            return "unknown"  # stored on an object or into a container
        uses = [use for name in names for use in facts.uses_of(parent, name.id)]
        if not uses:
            return "unknown"
        found = {_value_use(facts, use, depth + 1) for use in uses}
        for answer in ("state", "unknown"):
            if answer in found:
                return answer
        return "data"
    return "unknown"


def _reads_any(built: ast.DictComp | ast.ListComp, names: set[str]) -> bool:
    """The element (or key/value) a comprehension builds reads one of `names`."""
    parts = [built.key, built.value] if isinstance(built, ast.DictComp) else [built.elt]
    return any(isinstance(n, ast.Name) and n.id in names for part in parts for n in ast.walk(part))


def _restored_container(facts: Facts, target: ast.expr, depth: int) -> bool:
    """`target` is `container[key]` of a local dict that is later restored into a module
    (`new_state_dict[name] = v` ... `model.load_state_dict(new_state_dict)`)."""
    if not isinstance(target, ast.Subscript) or not isinstance(target.value, ast.Name):
        return False
    binding = facts.reaching_assignment(target.value)
    if binding is None:
        return False
    uses = facts.uses_of(binding.stmt, target.value.id)
    return any(
        use is not target.value and _value_use(facts, use, depth + 1) == "state" for use in uses
    )


def _path_key(facts: Facts, expr: ast.AST | None) -> str | None:
    if expr is None:
        return None
    if isinstance(expr, ast.Constant):
        return repr(expr.value)
    return facts.source.segment(expr) or None


@exemption("TL302", "neg_save_restore_paths_known.py")
def _written_here_on_cpu(facts: Facts, load: ast.Call) -> bool:
    """The file `load` reads is written by `torch.save` in this file (the same path
    expression), from values that are on the CPU: moved there with `.cpu()`, or the file
    never touches CUDA at all."""
    source = load.args[0] if load.args else _keyword(load, "f")
    path = _path_key(facts, source if not isinstance(source, ast.keyword) else source.value)
    if path is None:
        return False
    saves = [
        save
        for save in facts.calls_to(*SAVE)
        if len(save.args) >= 2
        and _path_key(facts, save.args[1]) == path
        and same_path_value(facts, save.args[1], load)
    ]
    if not saves:
        return False
    if not facts.mentions_cuda:
        return True
    return all(_on_cpu(facts, save.args[0]) for save in saves)


def _on_cpu(facts: Facts, value: ast.AST, depth: int = 0) -> bool:
    """`t.cpu()`, `{k: v.cpu() for ...}`, or a name bound to one of those."""
    if isinstance(value, ast.Name) and depth < 3:
        bound = facts.binding_value(value)
        return bound is not None and _on_cpu(facts, bound, depth + 1)
    if isinstance(value, ast.DictComp):
        return _on_cpu(facts, value.value, depth + 1)
    if isinstance(value, (ast.ListComp, ast.GeneratorExp)):
        return _on_cpu(facts, value.elt, depth + 1)
    if isinstance(value, ast.Dict):
        return all(v is not None and _on_cpu(facts, v, depth + 1) for v in value.values)
    current: ast.AST | None = value
    while isinstance(current, ast.Call) and isinstance(current.func, ast.Attribute):
        if current.func.attr == "cpu":
            return True
        if current.func.attr == "to" and any(
            isinstance(a, ast.Constant) and a.value == "cpu" for a in current.args
        ):
            return True
        current = current.func.value
    return False


@rule(
    "TL302",
    "load-without-map-location",
    "I",
    "torch.load without map_location",
    fix="unsafe",
)
def load_without_map_location(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    `torch.load(...)` without `map_location`, where it can matter: not when the script moves
    its model to CUDA unconditionally anyway (it cannot run on a CPU-only machine), not in a
    branch that only runs with CUDA (`if torch.cuda.is_available():`, a branch whose other
    side loads the same file with `map_location` to the CPU, or one that moves the model to
    CUDA), not
    when the file was written by this script from CPU tensors (the same path value: a
    `save(path)` and a `restore(path)` method each take their path from a caller, so they
    are not known to name one file), and not when the loaded object is only used as data
    (never restored into a model or optimizer, returned or passed on; a dict rebuilt from
    its items in a comprehension, say to rename keys, and then restored counts as restored).

    ## Why it is wrong
    Tensors are restored onto the device they were saved from. A checkpoint written on
    `cuda:0` fails to load on a CPU-only machine ("Attempting to deserialize object on a CUDA
    device") and, on a multi-GPU machine, every rank loads onto GPU 0 and may run out of memory.

    ## Example
    ```python
    state = torch.load("last.pt")            # TL302
    ```

    ## Fix
    `torch.load("last.pt", map_location="cpu")` (then move with `.to(device)`), or pass the
    target device. Offered as an unsafe fix.
    """
    for call in facts.calls_to(*LOAD):
        if _has_star_kwargs(call):
            continue
        if _keyword(call, "map_location") is not None or len(call.args) >= 2:
            continue
        if not call.args and not call.keywords:
            continue
        if facts.requires_cuda(call) or _written_here_on_cpu(facts, call):
            continue
        if _loaded_use(facts, call) == "data":
            continue
        arguments = [*call.args, *call.keywords]
        last = max(arguments, key=lambda n: (n.end_lineno or 0, n.end_col_offset or 0))
        row = last.end_lineno or call.lineno
        column = facts.source.column(row, last.end_col_offset or 0)
        yield Hit(
            call,
            "`torch.load` without `map_location`: a checkpoint saved on GPU fails to load on a "
            "CPU-only machine",
            Fix(
                "unsafe",
                'Add `map_location="cpu"`',
                (insert_at(row, column, ', map_location="cpu"'),),
            ),
        )
