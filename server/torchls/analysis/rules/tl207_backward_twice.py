"""TL207 `backward-twice`: a second `backward()` through a graph an earlier `backward()` in the
same iteration already freed (no `retain_graph`).

In: the file's `Facts`. Out: one hit at the second `backward()`, naming the shared forward call
and the line of the first. Calls on exclusive paths and different items of one returned
container are not paired.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.registry import Hit, exemption, rule


@exemption("TL207", "neg_single_or_separate_graphs.py")
def _retains_graph(call: ast.Call) -> bool:
    """The first `backward()` keeps its graph (`retain_graph=True`, `create_graph=True`, or
    the positional form), so a second pass through it is allowed."""
    for keyword in call.keywords:
        if keyword.arg in ("retain_graph", "create_graph"):
            return not (isinstance(keyword.value, ast.Constant) and not keyword.value.value)
    return len(call.args) >= 2


@exemption("TL207", "neg_with_bound_scaled_losses.py")
def _exclusive_branches(facts: Facts, first: ast.AST, second: ast.AST) -> bool:
    """The two backward passes sit in different branches of one `if`/`try`: one run takes
    only one of them."""
    ancestors = []
    current = facts.parents.get(first)
    while current is not None:
        ancestors.append(current)
        current = facts.parents.get(current)
    for ancestor in ancestors:
        if isinstance(ancestor, ast.If) and facts.is_inside(second, ancestor):
            in_body_first = any(facts.is_inside(first, s) for s in ancestor.body)
            in_body_second = any(facts.is_inside(second, s) for s in ancestor.body)
            return in_body_first != in_body_second
    return False


@rule(
    "TL207",
    "backward-twice",
    "E",
    "Two backward() calls through the same graph without retain_graph",
)
def backward_twice(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    Two `backward()` calls in one iteration whose losses both depend on the same model call
    (the same forward pass), when the first call does not pass `retain_graph=True`. Calls on
    exclusive paths (an `if`/`else`, or a branch that ends with `continue`/`break`/`return`)
    are not paired, and building or moving a module is not a forward pass. What a project
    function under `@torch.no_grad()` returns carries no graph (a statistic of the first
    forward's output fed to the next step, say), nor does an input that a project module's
    `forward` only reads detached (a self-training loss taking pseudo-labels from it).
    Two different items of one returned container (`parts["loss"]`, then
    `parts["stop_loss"]`) are not paired: whether they share a graph is decided where they
    were built (a head fed detached features shares none); the same item twice is.

    ## Why it is wrong
    `backward()` frees the graph's saved tensors. The second call raises "Trying to backward
    through the graph a second time" — often only on the code path that runs rarely (an
    auxiliary loss enabled late, a logging branch). With `retain_graph=True` it runs but
    gradients of the shared part are added twice, which is rarely intended either.

    ## Example
    ```python
    out = model(x)
    ce_loss = criterion(out, y)
    ce_loss.backward()
    reg_loss = out.pow(2).mean()
    reg_loss.backward()          # TL207
    ```

    ## Fix
    Sum the losses and call `backward()` once: `(ce_loss + reg_loss).backward()`. No automatic
    fix: where the sum belongs depends on the code.
    """
    backwards = facts.method_calls("backward")
    by_place: dict[tuple[int, int], list[ast.Call]] = {}
    for call in backwards:
        loops = facts.enclosing_loops(call)
        place = loops[0] if loops else facts.scope(call)
        by_place.setdefault((id(place), id(facts.scope(call))), []).append(call)
    for calls in by_place.values():
        calls.sort(key=lambda c: (c.lineno, c.col_offset))
        # Forward call -> the earlier backward() that freed its graph: one pass, not all pairs
        # (a generated file can hold tens of thousands of backward() calls).
        freed_by: dict[ast.Call, ast.Call] = {}
        for call in calls:
            graph = facts.graph_forwards(facts.receiver(call))  # type: ignore[arg-type]
            for forward in sorted(graph, key=lambda c: (c.lineno, c.col_offset)):
                earlier = freed_by.get(forward)
                if (
                    earlier is not None
                    and not _exclusive_branches(facts, earlier, call)
                    and not facts.exits_before(earlier, call)
                    and not _other_items_of_one_value(facts, earlier, call)
                ):
                    yield Hit(
                        call,
                        f"second backward() through the graph of "
                        f"`{facts.source.segment(forward)}` (line {forward.lineno}); the first "
                        f"backward() on line {earlier.lineno} already freed it",
                    )
                    break
            if not _retains_graph(call):
                for forward in graph:
                    freed_by.setdefault(forward, call)


def _item_backpropagated(facts: Facts, call: ast.Call) -> tuple[int, object] | None:
    """(binding, key) when `call` backpropagates one item of a container bound once,
    `parts["stop"].backward()` or `scaler.scale(parts["stop"]).backward()`; else None."""
    target = facts.receiver(call)
    if isinstance(target, ast.Call) and facts.method_name(target) == "scale" and target.args:
        target = target.args[0]  # a GradScaler scales what it is given, graph and all
    if not (
        isinstance(target, ast.Subscript)
        and isinstance(target.value, ast.Name)
        and isinstance(target.slice, ast.Constant)
    ):
        return None
    assignment = facts.reaching_assignment(target.value)
    if assignment is None or assignment.value is None:
        return None
    return id(assignment.stmt), target.slice.value


@exemption("TL207", "neg_two_items_of_a_loss_dict.py")
def _other_items_of_one_value(facts: Facts, earlier: ast.Call, later: ast.Call) -> bool:
    """The two backward() calls take different items of one container a call returned (a
    loss dict: `parts["loss"]`, then `parts["stopnet_loss"]`). Whether those items share a
    graph is decided inside whoever built them (a stop head fed detached features shares
    none): a second backward there is not a definite error, so it is not reported."""
    first = _item_backpropagated(facts, earlier)
    second = _item_backpropagated(facts, later)
    return first is not None and second is not None and first[0] == second[0] and first != second
