"""TL501 `batch-not-moved-to-device`: a model moved to an accelerator called with a tensor taken
straight from a data loader that was never moved; host-only values and loaders or wrappers that
put batches on the device themselves are not reported.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.registry import Hit, exemption, rule
from torchls.analysis.rules._numerics_host import _host_only_input
from torchls.analysis.rules._numerics_quantized import unmoved_tokens

MOVE_METHODS = {"to", "cuda"}


def _moved_models(facts: Facts) -> dict[str, ast.Call]:
    """Model keys moved to an accelerator somewhere in the file → the moving call."""
    moved: dict[str, ast.Call] = {}
    for call in facts.method_calls(*MOVE_METHODS):
        if facts.method_name(call) == "to":
            target = call.args[0] if call.args else None
            if target is None or (isinstance(target, ast.Constant) and target.value == "cpu"):
                continue
            if isinstance(target, ast.Constant) and not isinstance(target.value, str):
                continue  # .to(torch.float16)-style dtype casts are not moves
            if facts.qualname(target) and "float" in (facts.qualname(target) or ""):
                continue
        receiver = facts.receiver(call)
        parent = facts.parents.get(call)
        key = None
        if isinstance(parent, ast.Assign) and len(parent.targets) == 1:
            key = facts.key(parent.targets[0])  # model = Net().to(device)
        elif isinstance(parent, ast.Expr):
            key = facts.key(receiver)  # model.to(device)
        if key is not None and facts.is_kind(
            receiver if isinstance(parent, ast.Expr) else call, "model"
        ):
            moved.setdefault(key, call)
    return moved


@rule(
    "TL501",
    "batch-not-moved-to-device",
    "W",
    "Model moved to a device but loader tensors reach it unmoved",
)
def batch_not_moved_to_device(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    The model is moved with `.to(device)` / `.cuda()`, but a tensor taken straight from a data
    loader is passed to it without being moved. A model that loading itself puts on the GPU
    (`from_pretrained` with a bitsandbytes 4- or 8-bit `quantization_config` and no
    `device_map`), even in `__init__` of a wrapper class, counts as moved: a tokenizer's
    `return_tensors="pt"` output given to it unmoved in another method is reported. Values
    meant to stay on the host, and batches that a loader or a wrapper puts on the device
    itself, are not.

    ## Why it is wrong
    On a GPU this fails at the first batch ("Expected all tensors to be on the same device"),
    usually after minutes of start-up; on a machine where `device` silently resolves to the
    CPU it works, so the bug ships. Moving the batch is part of the step.

    ## Example
    ```python
    model = Net().to(device)
    for x, y in loader:
        out = model(x)                 # TL501: x is still on the CPU
    ```

    ## Fix
    `x, y = x.to(device), y.to(device)` at the start of the loop body (or
    `non_blocking=True` with pinned memory). No automatic fix.
    """
    for tokens, model_key, load in unmoved_tokens(facts):
        yield Hit(
            tokens,
            f"`{tokens.id}` holds the tokenizer's CPU tensors and is passed to `{model_key}`, "
            f"which loading put on the GPU on line {load.lineno} (quantized, no `device_map`), "
            "without `.to(device)`",
        )
    moved = _moved_models(facts)
    if not moved:
        return
    for loop in facts.batch_loops:
        targets = {
            name.id
            for name in ast.walk(loop.target)  # type: ignore[attr-defined]
            if isinstance(name, ast.Name)
        }
        if not targets or _collated_onto_device(facts, loop) or _dict_list_batches(facts, loop):
            continue
        if _iterates_a_list_built_here(facts, loop):
            continue  # batches the code sliced itself, not a loader's
        reported: set[str] = set()
        for call in facts.calls_in(loop):
            key = facts.key(call.func)
            if key not in moved or not _same_object_in_sight(facts, moved, call, loop, key):
                continue
            if _moves_its_inputs(facts, call.func):
                continue  # DataParallel / DDP(device_ids=...) copies the batch to the device
            for argument in call.args:
                if not isinstance(argument, ast.Name) or argument.id not in targets:
                    continue
                assignment = facts.reaching_assignment(argument)
                if assignment is None or assignment.loop is not loop:
                    continue
                if argument.id in reported:
                    continue
                if _host_only_input(facts, call, argument):
                    continue  # packing lengths and the like: meant to stay on the CPU
                reported.add(argument.id)
                yield Hit(
                    argument,
                    f"`{argument.id}` comes from the data loader and is passed to `{key}`, which "
                    f"was moved to a device on line {moved[key].lineno}, without `.to(device)`",
                )


@exemption("TL501", "neg_batches_sliced_on_device.py")
def _iterates_a_list_built_here(facts: Facts, loop: ast.AST) -> bool:
    """The loop runs over a list the code built itself (a literal or a comprehension, also
    passed in for a parameter by every call site: `calib = [(x[i:i + 2], y[i:i + 2]) ...]`),
    not over a data loader whose batches come from the host."""
    iterable = getattr(loop, "iter", None)
    while (
        isinstance(iterable, ast.Call)
        and isinstance(iterable.func, ast.Name)
        and iterable.func.id in ("enumerate", "tqdm", "iter")
        and iterable.args
    ):
        iterable = iterable.args[0]
    built = (ast.List, ast.Tuple, ast.ListComp, ast.GeneratorExp)
    if isinstance(iterable, ast.Name):
        arguments = facts.parameter_arguments(iterable)
        if arguments:  # a parameter: what every call site passes
            values = [facts.binding_value(a) if isinstance(a, ast.Name) else a for a in arguments]
            return all(isinstance(value, built) for value in values)
    value = facts.binding_value(iterable) if isinstance(iterable, ast.Name) else iterable
    if isinstance(value, ast.Name):
        value = facts.binding_value(value)
    return isinstance(value, built)


def _same_object_in_sight(
    facts: Facts, moved: dict[str, ast.Call], call: ast.Call, loop: ast.AST, key: str
) -> bool:
    """The moved model is the one the loop calls: moved in the loop's own function or at
    module level, (for `self.model`) in a method of the same class, or passed in by every
    caller as a model moved where it is called. A `model` moved in another function is
    another local of the same name."""
    move = moved[key]
    move_scope, loop_scope = facts.scope(move), facts.scope(loop)
    if move_scope is loop_scope or move_scope is facts.tree:
        return True
    if key.startswith("self."):
        return facts.enclosing_class(move) is facts.enclosing_class(loop)
    if not isinstance(call.func, ast.Name):
        return False
    arguments = facts.parameter_arguments(call.func)
    if not arguments:
        return False
    for argument in arguments:
        passed = facts.key(argument)
        if passed not in moved or facts.scope(moved[passed]) not in (
            facts.scope(argument),
            facts.tree,
        ):
            return False
    return True


# Loader factories whose batches are lists of per-image dicts: no `.to()` applies to such a
# batch, the models that take them (detectron2's meta-architectures) move each tensor.
DICT_LIST_LOADERS = ("detectron2.data.build_detection_",)


@exemption("TL501", "neg_detectron2_dict_batches.py")
def _dict_list_batches(facts: Facts, loop: ast.AST) -> bool:
    """Every loader the loop iterates (one, or each of a `zip(...)`) is one of detectron2's
    `build_detection_*_loader`s, whose batches are lists of per-image dicts that the detection
    model moves itself; told from its binding or, for a parameter, every call site."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return False
    iterable: ast.expr | None = loop.iter
    while isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name):
        if iterable.func.id in ("enumerate", "iter", "tqdm") and iterable.args:
            iterable = iterable.args[0]
        else:
            break
    if isinstance(iterable, ast.Name):
        iterable = facts.loop_source(loop) or iterable  # `bar = tqdm(loader); for b in bar`
    sources: list[ast.expr] = [iterable] if iterable is not None else []
    if isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name):
        if iterable.func.id == "zip":
            sources = [
                a
                for a in iterable.args
                if not (
                    isinstance(a, ast.Call)
                    and isinstance(a.func, ast.Name)
                    and a.func.id == "range"
                )
            ]
    if not sources:
        return False
    for source in sources:
        loaders = _bound_values(facts, source)
        if not loaders or not all(
            isinstance(loader, ast.Call)
            and (facts.call_qualname(loader) or "").startswith(DICT_LIST_LOADERS)
            for loader in loaders
        ):
            return False
    return True


@exemption("TL501", "neg_collate_fn_moves_the_batch.py")
@exemption("TL501", "neg_collate_fn_moves_the_batch_through_progress_bar.py")
def _collated_onto_device(facts: Facts, loop: ast.AST) -> bool:
    """The loop iterates a `DataLoader(..., collate_fn=f)` whose in-file `f` moves what it
    builds (`return labels.to(device), text.to(device)`): the batches arrive on the device.
    The loader is told from its binding, or for a parameter from every call site."""
    iterable = facts.loop_source(loop) if isinstance(loop, (ast.For, ast.AsyncFor)) else None
    if iterable is None:
        return False
    loaders = _bound_values(facts, iterable)
    if not loaders:
        return False
    return all(_loader_collates_onto_device(facts, loader) for loader in loaders)


def _bound_values(facts: Facts, expr: ast.expr, depth: int = 0) -> list[ast.expr]:
    """What a name holds, followed through plain renamings and, for a parameter, through
    the argument of every call site; empty when something cannot be told."""
    if not isinstance(expr, ast.Name):
        return [expr]
    if depth > 3:
        return []
    value = facts.binding_value(expr)
    if value is not None:
        return _bound_values(facts, value, depth + 1)
    if facts.reaching_assignment(expr) is not None:
        return []
    found: list[ast.expr] = []
    for argument in facts.parameter_arguments(expr) or []:
        values = _bound_values(facts, argument, depth + 1)
        if not values:
            return []
        found.extend(values)
    return found


def _loader_collates_onto_device(facts: Facts, loader: ast.expr | None) -> bool:
    if not isinstance(loader, ast.Call):
        return False
    collate = next((k.value for k in loader.keywords if k.arg == "collate_fn"), None)
    if not isinstance(collate, ast.Name):
        return False
    function = facts.functions.get(collate.id)
    if function is None:
        return False
    returns = [n for n in ast.walk(function) if isinstance(n, ast.Return) and n.value is not None]
    if not returns:
        return False
    for returned in returns:
        value = returned.value
        items = value.elts if isinstance(value, ast.Tuple) else [value]
        if not all(
            isinstance(item, ast.Call)
            and facts.method_name(item) in MOVE_METHODS
            and (
                facts.method_name(item) == "cuda"
                or (item.args and not isinstance(item.args[0], ast.Constant))
            )
            for item in items
        ):
            return False
    return True


@exemption("TL501", "neg_data_parallel_scatters_the_batch.py")
@exemption("TL501", "neg_ddp_with_device_ids_moves_the_batch.py")
def _moves_its_inputs(facts: Facts, model: ast.expr, depth: int = 0) -> bool:
    """`model` is a wrapper whose forward copies its inputs to the device itself:
    `nn.DataParallel(net)` scatters them over its GPUs, `DistributedDataParallel(net,
    device_ids=[gpu])` moves them to that GPU. Told from the binding of the name (or of
    `self.<attr>`), and for a parameter from the argument at every call site."""
    if depth > 3:
        return False
    value = _wrapper_call(facts, model)
    if value is not None:
        return _input_moving_wrapper(facts, value)
    if isinstance(model, ast.Attribute):
        values = facts.self_attribute_values(model)
        return bool(values) and all(
            (wrapped := _wrapper_call(facts, v)) is not None
            and _input_moving_wrapper(facts, wrapped)
            for v in values
        )
    if isinstance(model, ast.Name):
        assignment = facts.reaching_assignment(model)
        if assignment is not None:
            return False  # bound here to something else
        arguments = facts.parameter_arguments(model)
        if not arguments:
            return False
        return all(_moves_its_inputs(facts, argument, depth + 1) for argument in arguments)
    return False


def _wrapper_call(facts: Facts, expr: ast.expr) -> ast.Call | None:
    """The call `expr` holds once receiver-returning calls are peeled (`DataParallel(net)` for
    `DataParallel(net).cuda()`), through the binding of a name."""
    if isinstance(expr, ast.Name):
        value = facts.binding_value(expr)
        if value is None:
            return None
        expr = value
    root = facts.same_object(expr)
    return root if isinstance(root, ast.Call) else None


def _input_moving_wrapper(facts: Facts, call: ast.Call) -> bool:
    qualname = facts.call_qualname(call) or ""
    if qualname in ("torch.nn.DataParallel", "torch.nn.parallel.DataParallel"):
        return True
    if qualname not in (
        "torch.nn.parallel.DistributedDataParallel",
        "torch.nn.parallel.distributed.DistributedDataParallel",
    ):
        return False
    devices = next((k.value for k in call.keywords if k.arg == "device_ids"), None)
    if devices is None and len(call.args) > 1:
        devices = call.args[1]
    return devices is not None and not (isinstance(devices, ast.Constant) and devices.value is None)
