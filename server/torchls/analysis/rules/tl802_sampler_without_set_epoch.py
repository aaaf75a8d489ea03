"""TL802 `sampler-without-set-epoch`: a shuffling `DistributedSampler` whose loader is iterated
once per epoch while nothing in the file calls `set_epoch`, so every epoch has the same order.

In: the file's `Facts`; the samplers and their loaders come from `_distributed_samplers`.
Out: one hit per sampler (with an unsafe fix inserting `set_epoch` where it can be placed), or
at the batch loop when the loader arrives from far away (a factory, a constructor parameter).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from torchls.analysis.facts import Facts
from torchls.analysis.findings import Fix, Related
from torchls.analysis.registry import Hit, exemption, rule
from torchls.analysis.rules._distributed import MAX_DEPTH
from torchls.analysis.rules._distributed_samplers import (
    SAMPLERS,
    _constructed_loader,
    _distributed_loader,
    _loops_over_values,
    _sampler_calls,
    _sampler_of,
    _shuffles,
)
from torchls.analysis.rules._edits import delete_statement_line, insert_line_before

# Library wrappers whose returned loader sets the sampler's epoch on every `iter()`
# (Accelerate's DataLoaderShard, Lightning Fabric's _FabricDataLoader).
EPOCH_SETTING_WRAPPERS = {"prepare", "prepare_data_loader", "setup_dataloaders"}


def _epoch_loop_using(facts: Facts, loader_key: str, scope: ast.AST) -> ast.AST | None:
    """A loop in `scope` that runs once per epoch over the loader: it contains a loop over
    the loader, or passes the loader to a call (`train_one_epoch(train_loader, ...)`)."""
    for node in facts.walk_local(scope):
        if not isinstance(node, (ast.Name, ast.Attribute)) or facts.key(node) != loader_key:
            continue
        if isinstance(facts.parents.get(node), ast.Attribute):
            continue  # `loader.dataset`, `loader.sampler`: not an iteration
        loops = facts.enclosing_loops(node)
        if not loops:
            continue
        iterated_by = next(
            (
                index
                for index, loop in enumerate(loops)
                if isinstance(loop, (ast.For, ast.AsyncFor)) and facts.is_inside(node, loop.iter)
            ),
            None,
        )
        if iterated_by is not None:
            if iterated_by + 1 < len(loops):
                return loops[iterated_by + 1]  # the loop around the batch loop
            continue
        if isinstance(facts.parents.get(node), (ast.Call, ast.keyword)):
            return loops[0]
    return None


def _epoch_loop_in_callee(
    facts: Facts, loader_key: str, scope: ast.AST, depth: int = 0
) -> tuple[ast.AST, str] | None:
    """(epoch loop, the parameter's name) when `scope` hands the loader, outside any loop, to
    a function of this file (`train(args, train_loader, ...)`) whose body iterates the
    parameter once per epoch (`for epoch ...: for batch in loader`, or `iter(loader)`
    restarted inside its step loop), that function's callees followed the same way."""
    if depth >= MAX_DEPTH:
        return None
    for node in facts.walk_local(scope):
        if not isinstance(node, (ast.Name, ast.Attribute)) or facts.key(node) != loader_key:
            continue
        call = facts.parents.get(node)
        if isinstance(call, ast.keyword):
            call = facts.parents.get(call)
        if not isinstance(call, ast.Call) or facts.enclosing_loops(node):
            continue
        target = facts.callee(call)
        if target is None or target[0] is not facts or target[1] is scope:
            continue
        _, function, bound = target
        param = next(
            (
                name
                for name, arg in facts.summary(function).bind(call, bound).items()
                if arg is node
            ),
            None,
        )
        if param is None or re.search(r"val|test|eval|dev", param.lower()):
            continue
        loop = _epoch_loop_using(facts, param, function)
        if loop is not None:
            return loop, param
        deeper = _epoch_loop_in_callee(facts, param, function, depth + 1)
        if deeper is not None:
            return deeper
    return None


def _reiterated_by_hand(facts: Facts, loop: ast.AST, loader_key: str) -> bool:
    """The loop restarts the loader with `iter(loader)` when it runs out (a step loop, not an
    epoch loop): where the epoch changes is the user's call, so no fix is offered."""
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "iter"
        and any(facts.key(a) == loader_key for a in node.args)
        for node in facts.walk_local(loop)
    )


@exemption("TL802", "neg_accelerate_prepares_loader.py")
def _prepared_by_library(facts: Facts, loader_key: str, scope: ast.AST) -> bool:
    """The loader is handed to Accelerate's `prepare` or Fabric's `setup_dataloaders`: the
    loader they return calls `set_epoch` on its sampler at every new iteration itself."""
    for node in facts.walk_local(scope):
        if isinstance(node, ast.Call) and facts.method_name(node) in EPOCH_SETTING_WRAPPERS:
            if any(facts.key(a) == loader_key for a in node.args):
                return True
    return False


def _loader_aliases(facts: Facts, loader_key: str, scope: ast.AST) -> list[str]:
    """`loader_key` and the names it is handed to through wrappers that return it
    (`train_loader = backend.distribute(loader)`), in its scope. Library wrappers that set the
    epoch themselves (`accelerator.prepare`, Fabric's `setup_dataloaders`) are not wrappers
    here: their loaders call `set_epoch` on every new iteration."""
    keys = [loader_key]
    for node in facts.walk_local(scope):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        if not isinstance(node.value, ast.Call):
            continue
        for argument in facts.returned_arguments(node.value):
            if facts.key(argument) in keys:
                alias = facts.key(node.targets[0])
                if alias is not None and alias not in keys:
                    keys.append(alias)
    return keys


def _set_epoch_calls(facts: Facts) -> list[ast.Call]:
    """The `set_epoch` calls that may run once per epoch; one that runs a single time, in
    straight-line code ahead of an epoch loop of its own function, sets the first epoch's
    seed and no other (`sampler.set_epoch(start_epoch)` before `for epoch in ...`)."""
    return [call for call in facts.method_calls("set_epoch") if not _runs_once(facts, call)]


def _how_often(facts: Facts, keys: set[str | None]) -> str:
    once = [
        call
        for call in facts.method_calls("set_epoch")
        if facts.key(facts.receiver(call)) in keys and _runs_once(facts, call)
    ]
    if once:
        return f"called on it only once, before the epoch loop (line {once[0].lineno})"
    return "never called on it"


def _runs_once(facts: Facts, call: ast.Call) -> bool:
    if facts.enclosing_loops(call):
        return False
    function = facts.enclosing_function(call)
    if function is not None and any(facts.enclosing_loops(s) for s in facts.call_sites(function)):
        return False
    body = facts.tree.body if function is None else function.body
    # The statement of the function's body that holds the call (an `if distributed:` or a
    # `with` around it runs at most once too), and an epoch loop among the later ones.
    current: ast.AST | None = call
    while current is not None and not any(item is current for item in body):
        if isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return False  # a handler or a callback: it may run every epoch
        current = facts.parents.get(current)
    if current is None:
        return False
    later = body[next(i for i, item in enumerate(body) if item is current) + 1 :]
    epoch_loops = facts.epoch_loops
    return any(any(loop is item for loop in epoch_loops) for item in later)


@rule(
    "TL802",
    "sampler-without-set-epoch",
    "W",
    "DistributedSampler reused across epochs without set_epoch(epoch)",
    fix="unsafe",
)
def sampler_without_set_epoch(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    A shuffling `DistributedSampler` whose `DataLoader` is iterated in an epoch loop, while
    nothing in the file calls `set_epoch` on the sampler (`sampler.set_epoch(epoch)` or
    `loader.sampler.set_epoch(epoch)`) where it can run every epoch: a call that runs only
    once, in straight-line code ahead of the epoch loop of its function
    (`sampler.set_epoch(start_epoch)` before `for epoch in ...`), does not count. The
    sampler may be built through a name bound to its class (`sampler_cls = RandomSampler
    if local_rank == -1 else DistributedSampler`: a distributed run builds the
    DistributedSampler). The loader may be torch's `DataLoader`, a project class that
    subclasses it (in any project file), or a graph library's loader built on it
    (`torch_geometric.loader.DataLoader`). It may reach the loop through a project wrapper that
    returns it (`backend.distribute(loader)`), a factory, a constructor parameter stored
    on `self` and iterated in a method the epoch loop calls, or a parameter that every
    caller in the project's other files fills with the same loader (iterated there through
    a project wrapper that hands it back, `for b in progress(loader, verbose)`, outside an
    evaluation function); or it is handed, outside any loop, to a function of the file that
    owns the epoch loop (`train(args, loader, ...)` iterating it once per epoch, or
    restarting `iter(loader)` inside its step loop). A
    loader unpacked from a factory's returned tuple
    (`train_loader, val_loader = build_loaders(cfg)`, in another module) is followed to its
    position in that tuple, also through a factory returning another one's call; a loader
    built in both arms of a branch is the arm's on a DistributedSampler.
    Samplers built
    with `shuffle=False` (evaluation), loaders named like validation/test ones, and loaders
    handed to Accelerate's `prepare` or Fabric's `setup_dataloaders` (they set the epoch on
    every iteration) are not reported.

    ## Why it is wrong
    `DistributedSampler` seeds its shuffle with `seed + epoch`, and the epoch only changes
    through `set_epoch`. Without it every epoch visits the data in exactly the same order on
    every rank, which costs accuracy and makes multi-GPU runs behave differently from the
    single-GPU run they should reproduce.

    ## Example
    ```python
    sampler = DistributedSampler(train_set)
    loader = DataLoader(train_set, batch_size=64, sampler=sampler)
    for epoch in range(epochs):                # TL802: no sampler.set_epoch(epoch)
        for x, y in loader: ...
    ```

    ## Fix
    Call `sampler.set_epoch(epoch)` at the start of each epoch, before iterating the loader.
    The quick fix inserts it; it is unsafe because it changes the data order.
    """
    found = [_distributed_loader(facts, sampler) for sampler in _sampler_calls(facts)]
    aliases = {
        id(item): _loader_aliases(facts, item[3], facts.scope(item[4])) for item in found if item
    }
    known = {key for item in found if item for key in (item[1], f"{item[3]}.sampler") if key}
    known |= {f"{alias}.sampler" for keys in aliases.values() for alias in keys}
    told = {facts.key(facts.receiver(c)) for c in _set_epoch_calls(facts)}
    # Samplers this pass settles (reported, or cleared for a reason); one it could not follow
    # to an epoch loop (its loader goes on through a constructor or a factory) is left to the
    # pass that follows loaders through values.
    settled: set[ast.Call] = set()
    for item in found:
        if item is None:
            continue
        sampler, sampler_key, assignment, loader_key, loader = item
        settled.add(sampler)
        if not _shuffles(facts, sampler):
            continue
        if re.search(r"val|test|eval|dev", f"{sampler_key or ''} {loader_key}".lower()):
            continue
        names = {sampler_key, *(f"{alias}.sampler" for alias in aliases[id(item)])}
        if told & names or any(k not in known for k in told):
            continue  # told, or a set_epoch we cannot rule out (through a helper's parameter)
        scope = facts.scope(loader)
        if _prepared_by_library(facts, loader_key, scope):
            continue
        epoch_loop = None
        for key in aliases[id(item)]:
            epoch_loop = _epoch_loop_using(facts, key, scope)
            if epoch_loop is not None:
                loader_key = key
                break
        # Handed to a function that runs the epochs (`train(args, loader, ...)`): reported,
        # with no fix (the sampler's name is not in scope there).
        handed = None
        if epoch_loop is None:
            handed = _epoch_loop_in_callee(facts, loader_key, scope)
            if handed is not None:
                epoch_loop, loader_key = handed
        if epoch_loop is None:
            settled.discard(sampler)
            continue
        if facts.is_inside(sampler, epoch_loop):
            continue
        named = facts.source.segment(sampler.func)
        aliased = facts.call_qualname(sampler) not in SAMPLERS
        # Aliased, the other class (a RandomSampler) has no set_epoch: no fix to offer.
        named += "` (a `DistributedSampler` in a distributed run)" if aliased else "`"
        yield Hit(
            sampler,
            f"`{named} shuffles, but `set_epoch` is {_how_often(facts, names)}: "
            f"`{loader_key}` yields the same order every epoch (loop on line "
            f"{epoch_loop.lineno}); call `.set_epoch(epoch)` at the start of each epoch",
            None
            if aliased or handed is not None or _reiterated_by_hand(facts, epoch_loop, loader_key)
            else _insert_set_epoch(facts, epoch_loop, sampler_key, assignment, loader_key, scope),
        )
    if not told:
        yield from _loaders_reached_through_values(facts, settled)


def _loaders_reached_through_values(facts: Facts, reported: set[ast.Call]) -> Iterator[Hit]:
    """Batch loops over a loader that comes from far away: a factory's return value, a
    constructor parameter stored on `self` (`Trainer(model, train_data, ...)`, iterated in
    `self._run_epoch`), a wrapper that returns it. Reported at the loop when the loader was
    built with a shuffling DistributedSampler, the loop runs once per epoch (inside a loop, or
    in a function called from one) and nothing in the file calls `set_epoch`."""
    seen: set[ast.AST] = set()
    for loop, iterable in _loops_over_values(facts):
        built = _constructed_loader(facts, iterable)
        if built is None:
            continue
        owner, loader = built
        sampler = _sampler_of(owner, loader)
        if sampler is None or sampler in reported or sampler in seen:
            continue
        if not _shuffles(owner, sampler):
            continue
        key = facts.key(iterable) or ""
        if re.search(r"val|test|eval|dev", key.lower()):
            continue
        epoch_loop = _epoch_context(facts, loop)
        if epoch_loop is None:
            continue
        seen.add(sampler)
        where = f"line {sampler.lineno}"
        related: tuple[Related, ...] = ()
        if owner is not facts:
            where = f"{Path(owner.filename).name}, line {sampler.lineno}"
            related = (Related(owner.source.span(sampler), "sampler built here", owner.filename),)
        yield Hit(
            iterable,
            f"`{facts.source.segment(iterable)}` is loaded through a shuffling "
            f"`{owner.source.segment(sampler.func)}` ({where}), but `set_epoch` is "
            f"{_how_often(facts, {f'{key}.sampler'})}: every epoch (loop on line "
            f"{epoch_loop.lineno}) yields the same order; call `.sampler.set_epoch(epoch)` "
            "at the start of each epoch",
            related=related,
        )


def _epoch_context(facts: Facts, loop: ast.AST) -> ast.AST | None:
    """The loop that runs `loop` once per epoch: one around it in its function, or one around
    every in-file call of its function."""
    outer = [other for other in facts.enclosing_loops(loop) if other is not loop]
    if outer:
        return outer[0]
    function = facts.enclosing_function(loop)
    if function is None:
        return None
    sites = facts.call_sites(function)
    loops = [facts.enclosing_loops(site) for site in sites]
    if sites and all(loops):
        return loops[0][0]
    return None


def _unconditional(facts: Facts, stmt: ast.stmt, scope: ast.AST) -> bool:
    current = facts.parents.get(stmt)
    while current is not None and current is not scope:
        if not isinstance(current, (ast.With, ast.AsyncWith)):
            return False
        current = facts.parents.get(current)
    return current is scope


def _insert_set_epoch(
    facts: Facts,
    loop: ast.AST,
    sampler_key: str | None,
    assignment: ast.Assign | None,
    loader_key: str,
    scope: ast.AST,
) -> Fix | None:
    if not isinstance(loop, (ast.For, ast.AsyncFor)) or not isinstance(loop.target, ast.Name):
        return None
    epoch = loop.target.id
    if epoch == "_":
        return None
    first = loop.body[0]
    if delete_statement_line(facts, first) is None or first.lineno == loop.lineno:
        return None
    if sampler_key is not None:
        if assignment is None:
            return None  # `sampler = DistributedSampler(...) if distributed else None`
        if facts.scope(assignment) is not scope or not _unconditional(facts, assignment, scope):
            return None
        bindings = facts.assignments_of(sampler_key, scope)
        if "." in sampler_key or len(bindings) != 1:
            return None
        target = sampler_key
    else:
        target = f"{loader_key}.sampler"
    return Fix(
        "unsafe",
        f"Insert `{target}.set_epoch({epoch})` at the start of the epoch loop",
        (insert_line_before(facts, first, f"{target}.set_epoch({epoch})"),),
    )
