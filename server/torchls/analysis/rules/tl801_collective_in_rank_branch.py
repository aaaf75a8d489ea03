"""TL801 `collective-in-rank-branch`: a torch.distributed collective (`barrier`, `all_reduce`,
...) that only some ranks reach: under a rank test, in a rank-zero function, or through a helper
called under one; the other ranks never join it and the job hangs.

In: the file's `Facts`; the rank tests are read strictly (`restricts_ranks`, `rank_dependent`
from `ranks.py`: the branch runs on a subset of ranks), so that this rule fires precisely.
Out: one hit per collective or per helper call that reaches one.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts, FunctionNode
from torchls.analysis.ranks import COLLECTIVE_QUALNAMES
from torchls.analysis.registry import Hit, exemption, rule
from torchls.analysis.rules._distributed import _decorated_rank_zero

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


def _rank_early_exit(facts: Facts, call: ast.Call) -> ast.If | None:
    """An earlier `if <rank test>: ... return` in the function of `call` (`if rank != 0:
    return` at the top of a save method): only the ranks for which the test is false reach
    `call`. Not when that branch makes the same collective before it returns (the other
    ranks' half of a wait-for-the-main-rank idiom)."""
    qualname = facts.call_qualname(call)
    child: ast.AST = call
    current = facts.parents.get(call)
    while current is not None and not isinstance(current, (ast.Lambda, ast.ClassDef)):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(current, field, None)
            if not isinstance(block, list) or child not in block:
                continue
            for earlier in block[: block.index(child)]:
                if (
                    isinstance(earlier, ast.If)
                    and not earlier.orelse
                    and isinstance(earlier.body[-1], ast.Return)
                    and _holds_on_some_ranks(facts, earlier.test)
                    and not _waits_before_returning(facts, earlier, qualname)
                ):
                    return earlier
        if isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return None
        child, current = current, facts.parents.get(current)
    return None


def _holds_on_some_ranks(facts: Facts, test: ast.expr) -> bool:
    """A rank test, or an `and` with one among its operands (`dist.is_initialized() and
    dist.get_rank() != 0 and not cfg.shard`): false on some ranks whatever the rest."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return any(_holds_on_some_ranks(facts, value) for value in test.values)
    return facts.rank_dependent(test)


@exemption("TL801", "neg_barrier_after_rank_early_return_waits.py")
def _waits_before_returning(facts: Facts, branch: ast.If, qualname: str | None) -> bool:
    """The early-return branch makes the same collective before it returns (`if rank != 0:
    dist.barrier(); return`): the ranks that leave there wait for the others first."""
    return any(facts.call_qualname(c) == qualname for c in facts.calls_in(branch))


def _only_on_some_ranks(facts: Facts, call: ast.Call) -> tuple[ast.AST, str] | None:
    """(where the restriction is, how) when `call` only runs on some ranks."""
    branch = _rank_branch(facts, call)
    if branch is not None:
        return branch[0], "branch"
    exit_ = _rank_early_exit(facts, call)
    if exit_ is not None:
        return exit_, "early"
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


@exemption("TL801", "neg_main_first_wait_on_both_sides.py")
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
    A collective after an early `if <rank test>: return` in the same function (`if rank !=
    0: return` at the top of a save method that ends in `dist.barrier()`) is reached only by
    the ranks that get past it; not when that branch makes the same collective itself before
    it returns (the waiting half of a main-rank-first idiom).

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
        if found[1] != "early" and any(
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
        elif how == "early":
            early: ast.If = where  # type: ignore[assignment]
            test = facts.source.segment(early.test)
            detail = f"on the ranks that get past `if {test}: return` (line {early.lineno})"
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


@exemption("TL801", "neg_barrier_switched_off.py")
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
