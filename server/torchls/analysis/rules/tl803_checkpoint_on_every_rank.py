"""TL803 `checkpoint-on-every-rank`: `torch.save` in a distributed script that every rank runs,
so N processes write the same file at once.

In: the file's `Facts`; the rank tests are read loosely (`mentions_rank` from `ranks.py`:
anything that might single out a process), so that this rule stays quiet generously.
Out: one hit per unguarded `torch.save`; per-rank file names are left alone.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from torchls.analysis.facts import Facts, FunctionNode
from torchls.analysis.findings import Related
from torchls.analysis.objects import ObjectModel
from torchls.analysis.queries.vocabulary import argument_at, parameter_default
from torchls.analysis.ranks import COLLECTIVE_QUALNAMES, mentions_rank
from torchls.analysis.registry import Hit, exemption, rule
from torchls.analysis.rules._distributed import (
    MAX_DEPTH,
    RankExits,
    _decorated_rank_zero,
    multi_process_accelerator,
    wraps_ddp_through_helper,
)

# Calls that build a file object in memory: a save into one writes nothing to disk.
IN_MEMORY_FILES = {"BytesIO"}

# Calls that start a process running the function they are given.
PROCESS_STARTERS = {"spawn", "start_processes", "Process"}


def _distributed_script(facts: Facts) -> bool:
    """It sets up a process group, wraps a model in DDP, or calls a `torch.distributed`
    collective itself (`dist.barrier()`: code written to run on several processes)."""
    for call in facts.calls:
        qualname = facts.call_qualname(call) or ""
        if qualname in COLLECTIVE_QUALNAMES:
            return True
        if qualname.endswith("init_process_group") and qualname.startswith("torch.distributed"):
            return True
        if qualname.startswith("torch.nn.parallel") and qualname.endswith(
            "DistributedDataParallel"
        ):
            return True
    return wraps_ddp_through_helper(facts) or multi_process_accelerator(facts)


def _spawned(facts: Facts, function: FunctionNode) -> bool:
    """The function is a process entry point (`mp.spawn(main_worker, ...)`, `Process(target=)`)."""
    for call in facts.calls:
        if facts.short_name(call) not in PROCESS_STARTERS:
            continue
        values = [*call.args, *(k.value for k in call.keywords)]
        if any(isinstance(v, ast.Name) and v.id == function.name for v in values):
            return True
    return False


@exemption("TL803", "neg_save_on_rank_zero.py")
def _early_rank_exit(facts: Facts, function: FunctionNode, node: ast.AST) -> bool:
    """`if rank != 0: return` (or `continue`/`raise`) earlier in the function."""
    line = node.lineno  # type: ignore[attr-defined]
    return any(
        stmt.lineno < line and not facts.is_inside(node, stmt)
        for stmt in facts.get(RankExits).of(function)
    )


def _locally_guarded(facts: Facts, node: ast.AST) -> bool:
    """Inside its own function, `node` runs on one process only: under a rank test, after an
    early rank exit, or in a function decorated to run on rank 0."""
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
    return function is not None and (
        _decorated_rank_zero(function)
        or _rank_zero_wrapper(facts, function)
        or _early_rank_exit(facts, function, node)
    )


@exemption("TL803", "neg_save_method_behind_project_rank_decorator.py")
def _rank_zero_wrapper(facts: Facts, function: FunctionNode) -> bool:
    """`function` is decorated with a project decorator (this file's or imported) whose
    wrapper calls the function it wraps only under a rank test (`def main_process(func):`
    with `if rank == 0: return func(*args, **kwargs)` inside its wrapper)."""
    for decorator in function.decorator_list:
        if not isinstance(decorator, ast.Name):
            continue
        owner, node = facts, facts.functions.get(decorator.id)
        if node is None:
            definition = facts.definition(decorator.id)
            if definition is None or not isinstance(
                definition.node, (ast.FunctionDef, ast.AsyncFunctionDef)
            ):
                continue
            owner, node = definition.facts, definition.node
        if not node.args.args:
            continue
        wrapped = node.args.args[0].arg
        calls = [
            call
            for call in ast.walk(node)
            if isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name)
            and call.func.id == wrapped
        ]
        if calls and all(
            owner.enclosing_function(call) is not node and _locally_guarded(owner, call)
            for call in calls
        ):
            return True
    return False


def _runs_on_every_rank(facts: Facts, function: FunctionNode) -> bool:
    """`function` is run by every process: it wraps a model in `DistributedDataParallel` (a
    collective that all ranks must enter), reaches a `torch.distributed` collective outside
    any rank test (`dist.barrier()` at the end of each epoch: every rank must get there), or
    runs the training batch loop, which every rank of a data-parallel job runs, whoever
    calls it."""
    for call in facts.calls_in(function):
        qualname = facts.call_qualname(call) or ""
        if qualname.startswith("torch.nn.parallel") and qualname.endswith(
            "DistributedDataParallel"
        ):
            return True
    return (
        facts.summary(function).collective
        or facts.contains_training_batch_loop(function)
        or facts.calls_training_helper(function)
    )


def _rank_guarded(facts: Facts, node: ast.AST, depth: int = 0) -> bool:
    """True when `node` may run on one process only (or we cannot tell)."""
    if _locally_guarded(facts, node):
        return True
    function = facts.enclosing_function(node)
    if function is None:
        return False
    if depth >= MAX_DEPTH:
        return True
    sites = facts.call_sites(function)
    if not sites:
        # Unknown callers: stay quiet, unless the function is a process's entry point or
        # the training run itself.
        return not (_spawned(facts, function) or _runs_on_every_rank(facts, function))
    return all(_rank_guarded(facts, site, depth + 1) for site in sites)


@exemption("TL803", "neg_save_on_rank_zero.py")
def _per_rank_path(facts: Facts, call: ast.Call) -> bool:
    """The file name mentions the rank: each process writes its own file (a shard); or the
    destination is an in-memory buffer (`io.BytesIO()`), which writes no file at all."""
    path = next((k.value for k in call.keywords if k.arg == "f"), None)
    if path is None and len(call.args) > 1:
        path = call.args[1]
    if path is None:
        return False
    buffer = facts.binding_value(path) if isinstance(path, ast.Name) else path
    if isinstance(buffer, ast.Call) and facts.short_name(buffer) in IN_MEMORY_FILES:
        return True
    return _mentions_rank_through_names(facts, path)


def _skipped_for_call(
    owner: Facts, function: FunctionNode, save: ast.Call, call: ast.Call, bound: bool
) -> bool:
    """`save` sits under `if <param>:` / `if <param> is not None:` in `function`, and `call`
    leaves that parameter at a `None`/`False` default: the save does not run for this call
    (`lm_checkpoint(cfg, save_dir=d)` loading, where `lm_checkpoint(cfg, model=m)` saves)."""
    child: ast.AST = save
    current = owner.parents.get(save)
    while current is not None and current is not function:
        if isinstance(current, ast.If) and any(child is s for s in current.body):
            test = current.test
            name = None
            if isinstance(test, ast.Name):
                name = test.id
            elif (
                isinstance(test, ast.Compare)
                and isinstance(test.left, ast.Name)
                and len(test.ops) == 1
                and isinstance(test.ops[0], ast.IsNot)
                and isinstance(test.comparators[0], ast.Constant)
                and test.comparators[0].value is None
            ):
                name = test.left.id
            if name is not None:
                told, value = argument_at(call, function, name, bound)
                default = parameter_default(function, name)
                if (
                    told
                    and value is None
                    and isinstance(default, ast.Constant)
                    and default.value in (None, False)
                ):
                    return True
        child, current = current, owner.parents.get(current)
    return False


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
    In a distributed script (it calls `init_process_group`, wraps a model in
    `DistributedDataParallel` or calls a `torch.distributed` collective such as
    `dist.barrier()`, or calls a project helper that surely wraps the model in DDP: always, or
    under `if <flag>:` with the call passing `True` for it, as in
    `prepare(model, distributed=True)`, or builds an `accelerate.Accelerator` and asks that same
    object which process it is in or waits for the others, as in
    `if self.accelerator.is_main_process:`), a `torch.save(...)` that every rank executes: not under
    an `if rank == 0:`-style check, not after an early `if rank != 0: return`, not in a function
    decorated `@rank_zero_only` or only called under such a check. Saves whose file name
    contains the rank (per-rank shards) and saves into an in-memory buffer (`io.BytesIO()`) are
    not reported. A function with no caller in the file counts as run by every rank when it
    wraps the model in DDP, runs the training loop or reaches a collective outside any rank test
    (a `dist.barrier()` closing each epoch). A call, run by every rank, of a project function in
    another file (a `save_training_state(...)` helper) whose own `torch.save` has no rank check
    is reported at the call, unless that save only runs for an argument the call leaves at its
    `None` default (`if model is not None: ...`); so is a call of a method of another file's
    project class that reaches such a save through the methods it calls (`handler.save(...)` on
    a parameter annotated `handler: Checkpoints`, whose `save` calls `self.io.save(...)`, which
    writes the file), or of a method of an object a project classmethod built
    (`Trainer.create_or_resume(...)`, each of whose returns builds the class).

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
    yield from _saving_helpers(facts)


def _saving_helpers(facts: Facts) -> Iterator[Hit]:
    """Calls, on every rank, of another file's function that saves with no rank check: in
    its own body, or in a project method it calls in turn (`handler.save(...)` on a parameter
    annotated with a project class, whose `save` calls `self.io.save(...)`, which saves)."""
    for call in _candidate_calls(facts):
        target = _project_target(facts, call)
        if target is None or target[0] is facts:
            continue
        owner, function, bound = target
        saves = sorted(
            (
                save
                for save in owner.calls_to("torch.save")
                if owner.enclosing_function(save) is function
                and not _locally_guarded(owner, save)
                and not _per_rank_path(owner, save)
                and not _skipped_for_call(owner, function, save, call, bound)
            ),
            key=lambda save: (save.lineno, save.col_offset),
        )
        found = [(owner, save) for save in saves] or _saves_below(owner, function, 1)
        if not found or _rank_guarded(facts, call):
            continue
        where, save = found[0]
        if _distributed_script(where) and not _rank_guarded(where, save):
            continue  # reported in its own file
        yield Hit(
            call,
            f"`{facts.source.segment(call.func)}` runs `torch.save` ({Path(where.filename).name} "
            f"line {save.lineno}) on "
            "every rank of this distributed script: the processes write the same files at "
            "once; call it under `if rank == 0:` (e.g. `dist.get_rank() == 0`)",
            related=(Related(where.source.span(save), "saved here", where.filename),),
        )


def _candidate_calls(facts: Facts) -> list[ast.Call]:
    """The project calls, then the method calls on a name or a `self` attribute that the
    object model may resolve (`handler.save(...)`, `self.io.save(...)`)."""
    known = facts.project_calls
    seen = set(map(id, known))
    others = [
        call
        for call in facts.calls
        if id(call) not in seen
        and isinstance(call.func, ast.Attribute)
        and isinstance(call.func.value, (ast.Name, ast.Attribute))
    ]
    return [*known, *others]


def _project_target(facts: Facts, call: ast.Call) -> tuple[Facts, FunctionNode, bool] | None:
    """The project function `call` runs: a resolved callee, `self.m()` (a base class
    included), `self.helper.m()` on an object built from a project class, or `param.m()` on
    a parameter annotated with one."""
    target = facts.callee(call)
    if target is not None:
        return target
    model = facts.get(ObjectModel)
    found = model.method(call) or model.object_method(call) or model.annotated_method(call)
    return (found[0], found[1], True) if found is not None else None


def _saves_below(owner: Facts, function: FunctionNode, depth: int) -> list[tuple[Facts, ast.Call]]:
    """Unguarded `torch.save`s that `function` reaches through the project functions it calls
    outside any rank test, up to `MAX_DEPTH` calls deep."""
    if depth > MAX_DEPTH:
        return []
    memo = owner.get(RankExits).saves_below
    key = (function, depth)
    if key not in memo:
        memo[key] = _find_saves_below(owner, function, depth)
    return memo[key]


def _find_saves_below(
    owner: Facts, function: FunctionNode, depth: int
) -> list[tuple[Facts, ast.Call]]:
    """`_saves_below`, worked out (it keeps the answers)."""
    for call in owner.calls_in(function):
        if _locally_guarded(owner, call):
            continue
        target = _project_target(owner, call)
        if target is None or target[1] is function:
            continue
        where, inner, _ = target
        saves = [
            save
            for save in where.calls_to("torch.save")
            if where.enclosing_function(save) is inner
            and not _locally_guarded(where, save)
            and not _per_rank_path(where, save)
        ]
        if saves:
            return [(where, saves[0])]
        deeper = _saves_below(where, inner, depth + 1)
        if deeper:
            return deeper
    return []
