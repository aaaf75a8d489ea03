"""TL5xx: numerics and devices — batches left on the CPU, log of softmax, unguarded logs."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts, Origin
from torchls.analysis.findings import Fix, Span
from torchls.analysis.queries.tensors import activation_input, activation_of
from torchls.analysis.registry import Hit, rule
from torchls.analysis.rules._edits import replace_node

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


PACKING = ("pack_padded_sequence", "pack_sequence")
# Builtins that take plain Python values (a list of lengths, a count), not device tensors.
HOST_BUILTINS = {"len", "range", "max", "min", "sum", "list", "sorted", "zip", "enumerate"}


def _packing_lengths(facts: Facts, name: ast.Name) -> bool:
    """This read of `name` is the `lengths` of `pack_padded_sequence` (wanted on the CPU)."""
    parent = facts.parents.get(name)
    if isinstance(parent, ast.Call) and name in parent.args:
        qualname = facts.call_qualname(parent) or ""
        packing = qualname.endswith(PACKING) or facts.short_name(parent) in PACKING
        return packing and parent.args.index(name) == 1
    return isinstance(parent, ast.keyword) and _host_use(facts, name)


def _host_use(facts: Facts, name: ast.Name) -> bool:
    """This read of `name` wants a host value: the `lengths` of `pack_padded_sequence` (which
    needs them on the CPU), an argument of `len`/`range`/`max`..., or a `for` loop's iterable."""
    parent = facts.parents.get(name)
    if isinstance(parent, ast.keyword):
        call = facts.parents.get(parent)
        return (
            isinstance(call, ast.Call)
            and parent.arg == "lengths"
            and (facts.call_qualname(call) or facts.short_name(call)).endswith(PACKING)
        )
    if isinstance(parent, ast.Call) and name in parent.args:
        qualname = facts.call_qualname(parent) or ""
        if qualname.endswith(PACKING) or facts.short_name(parent) in PACKING:
            return parent.args.index(name) == 1
        return isinstance(parent.func, ast.Name) and parent.func.id in HOST_BUILTINS
    return isinstance(parent, (ast.For, ast.comprehension)) and parent.iter is name


def _forward_of(facts: Facts, func: ast.expr) -> tuple[Facts, ast.FunctionDef] | None:
    """The `forward` method (and the facts of its file) of the module object `func` names."""
    value = facts.binding_value(func) if isinstance(func, (ast.Name, ast.Attribute)) else None
    for _ in range(4):
        if not isinstance(value, ast.Call) or not facts.returns_receiver(value):
            break
        receiver = facts.receiver(value)
        value = facts.binding_value(receiver) if receiver is not None else None
        value = value if value is not None else receiver
    if not isinstance(value, ast.Call):
        return None
    found = facts.module_class_of_call(value)
    if found is None:
        return None
    owner, info = found
    forward = info.methods.get("forward")
    return (owner, forward) if isinstance(forward, ast.FunctionDef) else None


def _host_only_input(facts: Facts, call: ast.Call, argument: ast.Name) -> bool:
    """The loader value is used as a host value, not as a tensor input: in the loop it is
    passed as `pack_padded_sequence`'s lengths, or the model's `forward` only ever uses the
    parameter it binds to as one (packing lengths, `len(...)`, a loop over it)."""
    scope = facts.scope(argument)
    for node in facts.scope_nodes.get(scope, ()):
        if (
            isinstance(node, ast.Name)
            and node.id == argument.id
            and node is not argument
            and facts.reaching_assignment(node) is facts.reaching_assignment(argument)
            and _packing_lengths(facts, node)  # `len(x)` alone says nothing: tensors have it
        ):
            return True
    found = _forward_of(facts, call.func)
    if found is None or argument not in call.args:
        return False
    owner, forward = found
    params = [a.arg for a in [*forward.args.posonlyargs, *forward.args.args]][1:]
    position = call.args.index(argument)
    if position >= len(params):
        return False
    uses = [
        node
        for node in owner.scope_nodes.get(forward, ())
        if isinstance(node, ast.Name) and node.id == params[position]
    ]
    return bool(uses) and all(_host_use(owner, use) for use in uses)


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
    loader is passed to it without being moved. Values meant to stay on the host are not
    reported: the lengths given to `pack_padded_sequence`, or an input the model's `forward`
    only uses as such. Nor is a batch given to `nn.DataParallel` or to
    `DistributedDataParallel(..., device_ids=[gpu])`: their forward copies it to the device,
    nor one from a loader whose in-file `collate_fn` returns every tensor already moved, nor
    one from detectron2's `build_detection_*_loader` (a list of per-image dicts, which the
    detection model moves itself), nor batches from a list the code built itself (a literal
    or a comprehension of slices: not a loader's host tensors).

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


def _dict_list_batches(facts: Facts, loop: ast.AST) -> bool:
    """Every loader the loop iterates (one, or each of a `zip(...)`) is built by a factory of
    `DICT_LIST_LOADERS`, told from its binding or, for a parameter, every call site."""
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
        return bool(arguments) and all(
            _moves_its_inputs(facts, argument, depth + 1) for argument in arguments
        )
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


LOG_FUNCTIONS = {"torch.log"}


def _log_calls(facts: Facts) -> list[ast.Call]:
    methods = [c for c in facts.method_calls("log") if facts.call_qualname(c) is None]
    return [*facts.calls_to(*LOG_FUNCTIONS), *methods]


def _log_argument(facts: Facts, call: ast.Call) -> ast.expr | None:
    if facts.call_qualname(call) in LOG_FUNCTIONS and call.args:
        return call.args[0]
    if facts.call_qualname(call) is None and facts.method_name(call) == "log" and not call.args:
        return facts.receiver(call)
    return None


def _functional_alias(facts: Facts) -> str:
    for alias, target in facts.imports.items():
        if target == "torch.nn.functional":
            return alias
    return f"{facts.torch_alias or 'torch'}.nn.functional"


def _log_of_activation_fix(
    facts: Facts, log_call: ast.Call, inner: ast.Call, kind: str
) -> Fix | None:
    if kind == "softmax":
        func_text = facts.source.segment(inner.func)
        if (
            not func_text.endswith("softmax")
            or facts.call_qualname(inner) == "torch.special.softmax"
        ):
            return None
        arguments = (
            facts.source.text_of(_arguments_span(facts, inner))
            if inner.args or inner.keywords
            else ""
        )
        replacement = f"{func_text[: -len('softmax')]}log_softmax({arguments})"
        return Fix("safe", "Use log_softmax", (replace_node(facts, log_call, replacement),))
    if kind == "sigmoid":
        tensor = activation_input(facts, inner)
        if tensor is None:
            return None
        replacement = f"{_functional_alias(facts)}.logsigmoid({facts.source.segment(tensor)})"
        return Fix("safe", "Use logsigmoid", (replace_node(facts, log_call, replacement),))
    return None


def _arguments_span(facts: Facts, call: ast.Call) -> Span:
    nodes = [*call.args, *call.keywords]
    first = min(nodes, key=lambda n: (n.lineno, n.col_offset))
    last = max(nodes, key=lambda n: (n.end_lineno or 0, n.end_col_offset or 0))
    start = facts.source.span(first).start
    end = facts.source.span(last).end
    return Span(start, end)


@rule(
    "TL502",
    "log-of-softmax",
    "W",
    "log(softmax(x)) or log(sigmoid(x)) instead of log_softmax / logsigmoid",
    fix="safe",
)
def log_of_softmax(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    `torch.log(F.softmax(x))`, `F.softmax(x).log()`, `torch.log(torch.sigmoid(x))`.

    ## Why it is wrong
    Softmax and sigmoid underflow to exactly 0 for very negative inputs, and `log(0)` is
    `-inf`: the loss becomes infinite and the gradients NaN. `log_softmax` and `logsigmoid`
    compute the same values in one numerically stable step.

    ## Example
    ```python
    log_probs = torch.log(F.softmax(logits, dim=-1))     # TL502
    ```

    ## Fix
    `F.log_softmax(logits, dim=-1)` / `F.logsigmoid(x)`. The fix is safe.
    """
    for call in _log_calls(facts):
        argument = _log_argument(facts, call)
        if not isinstance(argument, ast.Call):
            continue
        kind = activation_of(facts, Origin(argument))
        if kind not in ("softmax", "sigmoid") or facts.method_name(argument) == "exp":
            continue
        better = "log_softmax" if kind == "softmax" else "logsigmoid"
        yield Hit(
            call,
            f"log of a {kind} (`{facts.source.segment(argument)[:40]}`) underflows to -inf; use "
            f"`{better}`",
            _log_of_activation_fix(facts, call, argument, kind),
        )


GUARDS = {"clamp", "clamp_min", "clip", "add", "maximum", "nan_to_num"}


@rule(
    "TL503",
    "log-without-guard",
    "I",
    "log() of a probability with no clamp or epsilon",
)
def log_without_guard(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    `torch.log(p)` / `p.log()` where `p` holds probabilities (it was computed by a softmax or
    sigmoid earlier) and nothing keeps it away from zero.

    ## Why it is wrong
    A probability that underflows to exactly 0 gives `-inf`, and the next backward pass turns
    it into NaN in every parameter — typically hundreds of steps into training, when the model
    becomes confident.

    ## Example
    ```python
    probs = torch.sigmoid(logits)
    entropy = -(probs * torch.log(probs)).sum()     # TL503
    ```

    ## Fix
    Guard it: `torch.log(probs.clamp_min(1e-8))` or `torch.log(probs + 1e-8)`, or compute in
    log space from the logits (`log_softmax`, `logsigmoid`). No automatic fix.
    """
    for call in _log_calls(facts):
        argument = _log_argument(facts, call)
        if not isinstance(argument, ast.Name):
            continue
        origins = facts.origins(argument)
        if not origins:
            continue
        kinds = {activation_of(facts, origin) for origin in origins}
        if not kinds <= {"softmax", "sigmoid"} or None in kinds:
            continue
        if any(
            isinstance(step, ast.Call) and facts.method_name(step) in GUARDS
            for origin in origins
            for step in origin.via
        ):
            continue
        yield Hit(
            call,
            f"log of `{argument.id}`, a {kinds.pop()} output (line {origins[0].node.lineno}), "
            "with no clamp or epsilon: an exact 0 gives -inf",
        )
