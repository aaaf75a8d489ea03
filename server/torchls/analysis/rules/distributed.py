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

from torchls.analysis.facts import Facts, FunctionNode
from torchls.analysis.findings import Fix
from torchls.analysis.ranks import identifier, mentions_rank
from torchls.analysis.registry import Hit, rule
from torchls.analysis.rules._edits import insert_line_before
from torchls.analysis.rules.optimization import method_calls, owns_lines

COLLECTIVES = {
    "barrier",
    "monitored_barrier",
    "all_reduce",
    "all_gather",
    "all_gather_object",
    "all_gather_into_tensor",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "all_to_all",
    "all_to_all_single",
}
COLLECTIVE_QUALNAMES = {f"torch.distributed.{name}" for name in COLLECTIVES}
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
    if sites and all(_rank_branch(facts, site) is not None for site in sites):
        return sites[0], "caller"
    return None


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
    decorated `@rank_zero_only`, or in a helper only called from such branches. The
    "first process downloads, the others wait" idiom (a barrier in each of two complementary
    branches) and collectives under non-rank conditions are not reported.

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
            if value is sampler or (sampler_key is not None and facts.key(value) == sampler_key):
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


def _set_epoch_calls(facts: Facts) -> list[ast.Call]:
    return method_calls(facts, "set_epoch")


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
    `loader.sampler.set_epoch(epoch)`). Samplers built with `shuffle=False` (evaluation) and
    loaders named like validation/test ones are not reported.

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
    found = [_distributed_loader(facts, sampler) for sampler in facts.calls_to(*SAMPLERS)]
    known = {key for item in found if item for key in (item[1], f"{item[3]}.sampler") if key}
    told = {facts.key(facts.receiver(c)) for c in _set_epoch_calls(facts)}
    for item in found:
        if item is None:
            continue
        sampler, sampler_key, assignment, loader_key, loader = item
        if not _shuffles(facts, sampler):
            continue
        if re.search(r"val|test|eval|dev", f"{sampler_key or ''} {loader_key}".lower()):
            continue
        if told & {sampler_key, f"{loader_key}.sampler"} or any(k not in known for k in told):
            continue  # told, or a set_epoch we cannot rule out (through a helper's parameter)
        scope = facts.scope(loader)
        epoch_loop = _epoch_loop_using(facts, loader_key, scope)
        if epoch_loop is None or facts.is_inside(sampler, epoch_loop):
            continue
        yield Hit(
            sampler,
            f"`{facts.source.segment(sampler.func)}` shuffles, but `set_epoch` is never called "
            f"on it: `{loader_key}` yields the same order every epoch (loop on line "
            f"{epoch_loop.lineno}); call `.set_epoch(epoch)` at the start of each epoch",
            _insert_set_epoch(facts, epoch_loop, sampler_key, assignment, loader_key, scope),
        )


def _distributed_loader(
    facts: Facts, sampler: ast.Call
) -> tuple[ast.Call, str | None, ast.Assign | None, str, ast.Call] | None:
    """(sampler, its key, its assignment, loader key, loader call) when the sampler feeds a
    DataLoader stored under a name or `self` attribute."""
    sampler_key, assignment = _sampler_binding(facts, sampler)
    loader = _loader_of(facts, sampler, sampler_key)
    statement = facts.parents.get(loader) if loader is not None else None
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
    if not owns_lines(facts, first) or first.lineno == loop.lineno:
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
