"""TL8xx: torch.distributed training, where every process runs the same script.

In: the file's `Facts`. Out: hits for collectives that only some ranks reach (`dist.barrier()`
under `if rank == 0:`), `DistributedSampler`s never told the epoch, and `torch.save` run by every
rank of a distributed script. What a condition means comes from `ranks.py`: `rank_dependent`
is strict (the branch runs on a subset of ranks), `mentions_rank` is loose (anything that might
single out a process), so one rule can fire precisely and the other stay quiet generously.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from torchls.analysis.facts import Facts, FunctionNode
from torchls.analysis.findings import Fix
from torchls.analysis.queries.vocabulary import _unwrap_iterable
from torchls.analysis.ranks import COLLECTIVE_QUALNAMES, identifier, mentions_rank
from torchls.analysis.registry import Hit, rule
from torchls.analysis.rules._edits import delete_statement_line, insert_line_before

# Position of the `group` parameter: a collective on a sub-group is meant for its members only.
GROUP_POSITION = {
    "barrier": 0,
    "monitored_barrier": 0,
    "all_reduce": 2,
    "all_gather": 2,
    "all_gather_object": 2,
    "all_gather_into_tensor": 2,
    "reduce": 3,
    "reduce_scatter": 3,
    "reduce_scatter_tensor": 3,
    "broadcast": 2,
    "broadcast_object_list": 2,
    "gather": 3,
    "gather_object": 3,
    "scatter": 3,
    "scatter_object_list": 3,
    "all_to_all": 2,
    "all_to_all_single": 4,
}
RANK_ZERO_DECORATORS = {
    "rank_zero_only",
    "master_only",
    "main_process_only",
    "on_main_process",
    "on_local_main_process",
    "on_rank_0",
    "rank_zero",
}
# Calls that start a process running the function they are given.
PROCESS_STARTERS = {"spawn", "start_processes", "Process"}
SAMPLERS = {
    "torch.utils.data.distributed.DistributedSampler",
    "torch.utils.data.DistributedSampler",
}
MAX_DEPTH = 3
# Library wrappers whose returned loader sets the sampler's epoch on every `iter()`
# (Accelerate's DataLoaderShard, Lightning Fabric's _FabricDataLoader).
EPOCH_SETTING_WRAPPERS = {"prepare", "prepare_data_loader", "setup_dataloaders"}


# ---------------------------------------------------------------------- rank vocabulary
def _decorated_rank_zero(function: FunctionNode) -> bool:
    for decorator in function.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if identifier(target) in RANK_ZERO_DECORATORS:
            return True
    return False


# ---------------------------------------------------------------------- TL801
def _on_sub_group(facts: Facts, call: ast.Call) -> bool:
    """`dist.all_reduce(t, group=half)`: only the group's members call it, by design."""
    for keyword in call.keywords:
        if keyword.arg is None:
            return True  # `**kwargs` may carry a group
        if keyword.arg == "group":
            return not (isinstance(keyword.value, ast.Constant) and keyword.value.value is None)
    if any(isinstance(a, ast.Starred) for a in call.args):
        return True
    index = GROUP_POSITION.get((facts.call_qualname(call) or "").rsplit(".", 1)[-1], 99)
    if len(call.args) <= index:
        return False
    group = call.args[index]
    return not (isinstance(group, ast.Constant) and group.value is None)


def _rank_branch(facts: Facts, node: ast.AST) -> tuple[ast.If, str] | None:
    """The innermost `if` around `node` (in its function) whose branch runs on some ranks
    only, with the branch name ("body" or "orelse")."""
    child: ast.AST = node
    current = facts.parents.get(node)
    while current is not None and not isinstance(
        current, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
    ):
        if isinstance(current, ast.If):
            if any(child is s for s in current.body) and facts.restricts_ranks(current.test):
                return current, "body"
            if any(child is s for s in current.orelse) and facts.rank_dependent(current.test):
                return current, "orelse"
        child, current = current, facts.parents.get(current)
    return None


def _inside_branch(facts: Facts, node: ast.AST, branch: tuple[ast.If, str]) -> bool:
    statement, name = branch
    return any(facts.is_inside(node, s) for s in getattr(statement, name))


def _only_on_some_ranks(facts: Facts, call: ast.Call) -> tuple[ast.AST, str] | None:
    """(where the restriction is, how) when `call` only runs on some ranks."""
    branch = _rank_branch(facts, call)
    if branch is not None:
        return branch[0], "branch"
    function = facts.enclosing_function(call)
    if function is None:
        return None
    if _decorated_rank_zero(function):
        return function, "decorator"
    sites = facts.call_sites(function)
    branches = [_rank_branch(facts, site) for site in sites]
    if sites and all(b is not None for b in branches) and not _complementary(branches):
        return sites[0], "caller"
    return None


def _complementary(branches: list[tuple[ast.If, str] | None]) -> bool:
    """Some calls sit where a rank test is true and others where the same test is false
    (`if not is_main: wait()` ... `if is_main: wait()`): every rank makes one of them."""
    seen: dict[str, set[bool]] = {}
    for branch in branches:
        if branch is None:
            continue
        statement, name = branch
        test, truth = statement.test, name == "body"
        while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            test, truth = test.operand, not truth
        seen.setdefault(ast.dump(test), set()).add(truth)
    return any(len(truths) == 2 for truths in seen.values())


@rule(
    "TL801",
    "collective-in-rank-branch",
    "E",
    "Collective (barrier, all_reduce, ...) only reached by some ranks",
)
def collective_in_rank_branch(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    A `torch.distributed` collective (`barrier`, `all_reduce`, `broadcast`, `all_gather`,
    `reduce`, `gather`, `scatter`, ...) that only runs inside an `if rank == 0:`-style branch
    (`dist.get_rank() == 0`, `local_rank != 0`, `is_main_process()`, ...), in a function
    decorated `@rank_zero_only`, or in a helper only called from such branches; and a call
    made under such a branch of a helper (in this file or another) that reaches a collective,
    even when the helper is also called on every rank elsewhere. The "first process
    downloads, the others wait" idiom (a barrier in each of two complementary branches, also
    as a helper called under `if not is_main:` and again under `if is_main:`),
    collectives under non-rank conditions and collectives a parameter switches on
    (`if use_barrier:`) that the call leaves off are not reported.

    ## Why it is wrong
    A collective completes only when every rank of the group calls it. If rank 0 alone
    reaches `dist.barrier()`, it waits forever for the others, which are already blocked in
    the next collective (or the gradient all-reduce of the next backward): the job hangs
    without an error until the NCCL timeout, often 30 minutes later.

    ## Example
    ```python
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), "last.pt")
        dist.barrier()                  # TL801: only rank 0 gets here
    ```

    ## Fix
    Call the collective on every rank: move it out of the branch (`if rank == 0: save()`
    followed by `dist.barrier()`), or call it in both branches. No automatic fix.
    """
    collectives = facts.calls_to(*COLLECTIVE_QUALNAMES)
    for call in collectives:
        found = _only_on_some_ranks(facts, call)
        if found is None or _on_sub_group(facts, call):
            continue
        qualname = facts.call_qualname(call)
        branch = _rank_branch(facts, call)
        region = facts.enclosing_function(call) if branch is None else None
        if any(
            c is not call
            and facts.call_qualname(c) == qualname
            and not (
                _inside_branch(facts, c, branch)
                if branch is not None
                else region is not None and facts.is_inside(c, region)
            )
            for c in collectives
        ):
            continue  # the other ranks call it elsewhere (the download-then-wait idiom)
        where, how = found
        if how == "caller" and _switched_off_at_every_site(facts, call):
            continue
        name = facts.source.segment(call.func)
        if how == "branch":
            test = facts.source.segment(where.test)  # type: ignore[attr-defined]
            detail = f"inside `if {test}:` (line {where.lineno})"
        elif how == "decorator":
            detail = "in a function that only runs on rank 0"
        else:
            detail = f"in a function only called under a rank check (line {where.lineno})"
        yield Hit(
            call,
            f"`{name}` is a collective that every rank must call, but it runs only {detail}: "
            "the ranks that skip it leave this one waiting forever",
        )
    yield from _helper_collectives_in_rank_branch(facts, collectives)


def _helper_collectives_in_rank_branch(facts: Facts, collectives: list[ast.Call]) -> Iterator[Hit]:
    """A call of a helper whose summary reaches a collective, made under a rank check: on
    that path only some ranks get there, even when the helper is also called on every rank
    elsewhere. Quiet when the other ranks call it (or a collective) in another rank branch
    (the download-then-wait idiom), and when every call of an in-file helper is under a rank
    check (the collective itself is reported in the helper then)."""
    for call in facts.project_calls:
        asked = facts.call_summary(call)
        if asked is None or not asked[0].collective:
            continue
        if not asked[0].reaches_collective(call, facts.callee(call)[2]):  # type: ignore[index]
            continue
        branch = _rank_branch(facts, call)
        if branch is None:
            continue
        owner, function, _ = facts.callee(call)  # type: ignore[misc]
        if _decorated_rank_zero(function):
            continue
        same = [c for c in facts.calls if c is not call and _same_callee(facts, c, function)]
        direct = any(
            facts.call_qualname(c) in COLLECTIVE_QUALNAMES for c in facts.calls_in(function)
        )
        if owner is facts and direct and all(_rank_branch(facts, c) is not None for c in same):
            continue  # reported at the collective itself ("only called under a rank check")
        others = [*same, *collectives]
        if any(
            _rank_branch(facts, c) is not None and not _inside_branch(facts, c, branch)
            for c in others
        ):
            continue
        test = facts.source.segment(branch[0].test)
        name = facts.source.segment(call.func)
        yield Hit(
            call,
            f"`{name}(...)` reaches a collective that every rank must call, but this call runs "
            f"only inside `if {test}:` (line {branch[0].lineno}): the ranks that skip it leave "
            "this one waiting forever",
        )


def _switched_off_at_every_site(facts: Facts, collective: ast.Call) -> bool:
    """The helper holding `collective` only reaches it when a parameter switches it on, and
    every call of the helper leaves that switch off (`merge(sd, sync=False)` by default)."""
    function = facts.enclosing_function(collective)
    if function is None:
        return False
    summary = facts.summary(function)
    sites = facts.call_sites(function)
    if not summary.collective or not summary.collective_switches:
        return False
    return bool(sites) and not any(
        summary.reaches_collective(site, isinstance(site.func, ast.Attribute)) for site in sites
    )


def _same_callee(facts: Facts, call: ast.Call, function: FunctionNode) -> bool:
    target = facts.callee(call)
    return target is not None and target[1] is function


# ---------------------------------------------------------------------- TL802
def _sampler_binding(facts: Facts, sampler: ast.Call) -> tuple[str | None, ast.Assign | None]:
    """(text key the sampler is stored under, the assignment) — `train_sampler`,
    `self.sampler` — or (None, None) when it is passed inline. The assignment is None when
    the sampler is one arm of a conditional expression."""
    parent = facts.parents.get(sampler)
    direct = True
    if isinstance(parent, ast.IfExp):
        parent, direct = facts.parents.get(parent), False
    if isinstance(parent, ast.Assign) and len(parent.targets) == 1:
        return facts.key(parent.targets[0]), parent if direct else None
    return None, None


def _loader_of(facts: Facts, sampler: ast.Call, sampler_key: str | None) -> ast.Call | None:
    for call in facts.calls:
        kind = facts.kind_of(call)
        if kind is None or kind.kind != "loader" or kind.node is not call:
            continue
        for keyword in call.keywords:
            if keyword.arg != "sampler":
                continue
            value = keyword.value
            if value is sampler:
                return call
            # By name only in the sampler's own scope: `sampler` in another function is
            # another sampler.
            if sampler_key is not None and facts.key(value) == sampler_key:
                if sampler_key.startswith("self.") or facts.scope(call) is facts.scope(sampler):
                    return call
    return None


def _shuffles(facts: Facts, sampler: ast.Call) -> bool:
    """True unless the sampler is built with `shuffle=False` (or a shuffle we cannot read)."""
    shuffle = next((k.value for k in sampler.keywords if k.arg == "shuffle"), None)
    if shuffle is None and len(sampler.args) > 3:
        shuffle = sampler.args[3]
    if shuffle is None:
        return True
    return isinstance(shuffle, ast.Constant) and shuffle.value is True


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
    return facts.method_calls("set_epoch")


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
    `loader.sampler.set_epoch(epoch)`). The sampler may be built through a name bound to its
    class (`sampler_cls = RandomSampler if local_rank == -1 else DistributedSampler`: a
    distributed run builds the DistributedSampler). The loader may reach the loop through a project
    wrapper that returns it (`backend.distribute(loader)`), a factory, or a constructor
    parameter stored on `self` and iterated in a method the epoch loop calls. Samplers built
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
            f"`{named} shuffles, but `set_epoch` is never called "
            f"on it: `{loader_key}` yields the same order every epoch (loop on line "
            f"{epoch_loop.lineno}); call `.set_epoch(epoch)` at the start of each epoch",
            None
            if aliased or _reiterated_by_hand(facts, epoch_loop, loader_key)
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
    for loop, role in facts.batch_loops.items():
        if role == "eval" or not isinstance(loop, (ast.For, ast.AsyncFor)):
            continue
        # `enumerate(loader)`, `tqdm(loader)`: the loader is what they wrap.
        iterable = _unwrap_iterable(loop.iter) or loop.iter
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
        if owner is not facts:
            where = f"{Path(owner.filename).name}, line {sampler.lineno}"
        yield Hit(
            iterable,
            f"`{facts.source.segment(iterable)}` is loaded through a shuffling "
            f"`{owner.source.segment(sampler.func)}` ({where}), but `set_epoch` is never "
            f"called on it: every epoch (loop on line {epoch_loop.lineno}) yields the same "
            "order; call `.sampler.set_epoch(epoch)` at the start of each epoch",
        )


def _constructed_loader(
    facts: Facts, expr: ast.AST | None, depth: int = 0
) -> tuple[Facts, ast.Call] | None:
    """The `DataLoader(...)` call `expr` holds, through names, parameters bound at every call
    site, single-valued `self` attributes, factory returns and argument-returning wrappers."""
    if expr is None or depth > MAX_DEPTH * 2:
        return None
    if isinstance(expr, ast.Call):
        kind = facts.kind_of(expr)
        if kind is not None and kind.kind == "loader" and kind.node is expr:
            return facts, expr
        returns = facts.function_returns(expr)
        if returns is not None and len(returns) == 1:
            owner, returned = returns[0]
            return _constructed_loader(owner, returned, depth + 1)
        handed_back = facts.returned_arguments(expr)
        if len(handed_back) == 1:
            return _constructed_loader(facts, handed_back[0], depth + 1)
        return None
    if isinstance(expr, ast.Name):
        return _constructed_loader(facts, facts.binding_value(expr), depth + 1)
    if isinstance(expr, ast.Attribute):
        values = facts.self_attribute_values(expr)
        if len(values) == 1:
            return _constructed_loader(facts, values[0], depth + 1)
    return None


def _sampler_of(facts: Facts, loader: ast.Call) -> ast.Call | None:
    value = next((k.value for k in loader.keywords if k.arg == "sampler"), None)
    if isinstance(value, ast.Name):
        value = facts.binding_value(value)
    if isinstance(value, ast.Call) and _is_sampler_call(facts, value):
        return value
    return None


def _sampler_calls(facts: Facts) -> list[ast.Call]:
    """Constructions of a DistributedSampler: direct, or through a name bound to the class
    (`sampler_cls = RandomSampler if local_rank == -1 else DistributedSampler`, then
    `sampler_cls(dataset)`: a distributed run builds a DistributedSampler)."""
    direct = facts.calls_to(*SAMPLERS)
    aliased = [
        call
        for call in facts.calls
        if isinstance(call.func, ast.Name) and call not in direct and _is_sampler_call(facts, call)
    ]
    return sorted([*direct, *aliased], key=lambda c: (c.lineno, c.col_offset))


def _is_sampler_call(facts: Facts, call: ast.Call) -> bool:
    if facts.call_qualname(call) in SAMPLERS:
        return True
    if not isinstance(call.func, ast.Name) or call.func.id in facts.imports:
        return False
    bound = facts.binding_value(call.func)
    choices = [bound.body, bound.orelse] if isinstance(bound, ast.IfExp) else [bound]
    return any(
        isinstance(choice, (ast.Name, ast.Attribute)) and facts.qualname(choice) in SAMPLERS
        for choice in choices
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


def _distributed_loader(
    facts: Facts, sampler: ast.Call
) -> tuple[ast.Call, str | None, ast.Assign | None, str, ast.Call] | None:
    """(sampler, its key, its assignment, loader key, loader call) when the sampler feeds a
    DataLoader stored under a name or `self` attribute."""
    sampler_key, assignment = _sampler_binding(facts, sampler)
    loader = _loader_of(facts, sampler, sampler_key)
    statement = facts.parents.get(loader) if loader is not None else None
    if isinstance(statement, ast.Call) and loader in facts.returned_arguments(statement):
        statement = facts.parents.get(statement)  # `backend.distribute(DataLoader(...))`
    if loader is None or not isinstance(statement, ast.Assign) or len(statement.targets) != 1:
        return None
    loader_key = facts.key(statement.targets[0])
    if loader_key is None:
        return None
    return sampler, sampler_key, assignment, loader_key, loader


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
        bindings = facts.assignments_of(sampler_key, scope)  # type: ignore[arg-type]
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


# ---------------------------------------------------------------------- TL803
def _distributed_script(facts: Facts) -> bool:
    for call in facts.calls:
        qualname = facts.call_qualname(call) or ""
        if qualname.endswith("init_process_group") and qualname.startswith("torch.distributed"):
            return True
        if qualname.startswith("torch.nn.parallel") and qualname.endswith(
            "DistributedDataParallel"
        ):
            return True
    return False


def _spawned(facts: Facts, function: FunctionNode) -> bool:
    """The function is a process entry point (`mp.spawn(main_worker, ...)`, `Process(target=)`)."""
    for call in facts.calls:
        if facts.short_name(call) not in PROCESS_STARTERS:
            continue
        values = [*call.args, *(k.value for k in call.keywords)]
        if any(isinstance(v, ast.Name) and v.id == function.name for v in values):
            return True
    return False


def _early_rank_exit(facts: Facts, function: FunctionNode, node: ast.AST) -> bool:
    """`if rank != 0: return` (or `continue`/`raise`) earlier in the function."""
    for stmt in facts.walk_local(function):
        if not isinstance(stmt, ast.If) or stmt.lineno >= node.lineno:  # type: ignore[attr-defined]
            continue
        if facts.is_inside(node, stmt) or not mentions_rank(facts, stmt.test):
            continue
        exits = (ast.Return, ast.Raise, ast.Continue, ast.Break)
        if any(isinstance(s, exits) for body in stmt.body for s in ast.walk(body)):
            return True
    return False


def _rank_guarded(facts: Facts, node: ast.AST, depth: int = 0) -> bool:
    """True when `node` may run on one process only (or we cannot tell)."""
    current = facts.parents.get(node)
    while current is not None and not isinstance(
        current, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
    ):
        if isinstance(current, (ast.If, ast.IfExp, ast.While)) and mentions_rank(
            facts, current.test
        ):
            return True
        current = facts.parents.get(current)
    function = facts.enclosing_function(node)
    if function is None:
        return False
    if _decorated_rank_zero(function) or _early_rank_exit(facts, function, node):
        return True
    if depth >= MAX_DEPTH:
        return True
    sites = facts.call_sites(function)
    if not sites:
        return not _spawned(facts, function)  # unknown callers: stay quiet
    return all(_rank_guarded(facts, site, depth + 1) for site in sites)


def _per_rank_path(facts: Facts, call: ast.Call) -> bool:
    """The file name mentions the rank: each process writes its own file (a shard)."""
    path = next((k.value for k in call.keywords if k.arg == "f"), None)
    if path is None and len(call.args) > 1:
        path = call.args[1]
    return path is not None and _mentions_rank_through_names(facts, path)


def _mentions_rank_through_names(facts: Facts, expr: ast.AST, depth: int = 0) -> bool:
    """`mentions_rank`, following the local names the expression is built from."""
    if mentions_rank(facts, expr):
        return True
    if depth >= MAX_DEPTH:
        return False
    for node in ast.walk(expr):
        if isinstance(node, ast.Name):
            value = facts.binding_value(node)
            if value is not None and _mentions_rank_through_names(facts, value, depth + 1):
                return True
    return False


@rule(
    "TL803",
    "checkpoint-on-every-rank",
    "W",
    "torch.save in a distributed script is not guarded by a rank-0 check",
)
def checkpoint_on_every_rank(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    In a distributed script (it calls `init_process_group` or wraps a model in
    `DistributedDataParallel`), a `torch.save(...)` that every rank executes: not under an
    `if rank == 0:`-style check, not after an early `if rank != 0: return`, not in a function
    decorated `@rank_zero_only` or only called under such a check. Saves whose file name
    contains the rank (per-rank shards) are not reported.

    ## Why it is wrong
    Every process writes the same file at the same moment: N concurrent writers truncate and
    interleave each other's bytes, so the checkpoint can come out corrupt (and the job does N
    times the I/O). The failure shows up only when a resumed run cannot load it.

    ## Example
    ```python
    dist.init_process_group("nccl")
    model = DDP(model, device_ids=[local_rank])
    for epoch in range(epochs):
        train_one_epoch(...)
        torch.save(model.module.state_dict(), "last.pt")    # TL803: every rank writes
    ```

    ## Fix
    Save on one rank: `if dist.get_rank() == 0: torch.save(...)`, followed by
    `dist.barrier()` if the other ranks read the file afterwards. No automatic fix.
    """
    if not _distributed_script(facts):
        return
    for call in facts.calls_to("torch.save"):
        if _per_rank_path(facts, call) or _rank_guarded(facts, call):
            continue
        yield Hit(
            call,
            "`torch.save` runs on every rank of this distributed script: the processes write "
            "the same file at once; save under `if rank == 0:` (e.g. `dist.get_rank() == 0`)",
        )
