"""TL206 graph-kept-alive: a loss still attached to its autograd graph (or a container or helper
result holding one) is accumulated across the iterations of a step or batch loop, keeping every
iteration's graph alive.

In: `Facts`; the dict displays of loss parts are read by `_modes_loss_dicts.py`. Out: `Hit`s at
the accumulating statement, with a fix appending `.item()` where that is enough.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.findings import Fix
from torchls.analysis.queries.tensors import detached_value
from torchls.analysis.registry import Hit, exemption, rule
from torchls.analysis.rules._edits import insert_at
from torchls.analysis.rules._graph_attributes import self_attribute_keeps
from torchls.analysis.rules._graph_collectors import collector_keeps
from torchls.analysis.rules._graph_containers import (
    accumulation,
    graph_containers,
    returns_graph_container,
)
from torchls.analysis.rules._graph_hooks import step_output_stores
from torchls.analysis.rules._graph_items import slot_stores
from torchls.analysis.rules._graph_loops import (
    feeds_backward,
    outlives_a_step,
    used_as_tensor_later,
)
from torchls.analysis.rules._graph_returns import iterated_container
from torchls.analysis.rules._graph_sources import graph_sources
from torchls.analysis.rules._modes_loss_dicts import _dict_parts, _fixed_key


def _returns_graph(facts: Facts, value: ast.AST, project_calls: set[ast.Call]) -> bool:
    """`value` calls a project function whose summary says it hands back a loss it
    backward()-ed, still attached to the graph (`train_step` returning `loss`)."""
    if not isinstance(value, ast.Call) or value not in project_calls:
        return False
    asked = facts.call_summary(value)
    return asked is not None and asked[0].returns_graph


def _loss_names(
    facts: Facts, scope: ast.AST, project_calls: set[ast.Call]
) -> tuple[set[str], dict[str, list[ast.Subscript]], set[str]]:
    """Names in `scope` that hold a loss tensor (assigned from a loss call or from a helper
    returning its graph-attached loss, or backward()-ed), and names of containers shown to
    hold one because an item of theirs is backward()-ed (`output["loss"].backward()`), with
    those backward()-ed items."""
    names: set[str] = set()
    containers: dict[str, list[ast.Subscript]] = {}
    loss_call_nodes = facts.loss_call_nodes
    for node in facts.calls_in(scope):
        if facts.method_name(node) == "backward" and not node.args:
            receiver = facts.backward_subject(node)
            if isinstance(receiver, ast.Name):
                names.add(receiver.id)
            elif isinstance(receiver, ast.Subscript) and isinstance(receiver.value, ast.Name):
                containers.setdefault(receiver.value.id, []).append(receiver)
    # What a backward()-ed loss was made from as a whole holds the graph too (`loss =
    # sum(parts)`, `parts` a helper's tuple of losses).
    sources = graph_sources(facts, scope, names)
    names |= sources
    # The scope's binding table already lists every `name = value` it holds.
    for name, bindings in facts.assignments.get(scope, {}).items():
        for binding in bindings:
            node = binding.stmt
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and (
                    node.value in loss_call_nodes
                    or _returns_graph(facts, node.value, project_calls)
                )
            ):
                names.add(name)
    containers = {k: v for k, v in containers.items() if k not in names}
    # A helper's `(loss, stats)` whose stats keep a graph tensor: a container, no `.item()` fix.
    held = graph_containers(facts, scope, names)
    # A training step returning the loss parts it backward()-ed their total of.
    for name, bindings in facts.assignments.get(scope, {}).items():
        for binding in bindings:
            call = binding.value
            if (
                binding.index is None
                and binding.loop is None
                and isinstance(call, ast.Call)
                and call in project_calls
                and returns_graph_container(facts, call)
            ):
                held.add(name)
    for name in held:
        names.add(name)
        containers.setdefault(name, [])
    return names, containers, sources


@exemption("TL206", "neg_rebound_detached.py")
def _rebound_detached(facts: Facts, use: ast.Name, assignment: object) -> bool:
    """The binding of `use` that reaches it is a plain rebinding to a detached value
    (`loss = loss.detach().cpu()`, `loss = loss.item()`) in a block that encloses the use,
    so every path to the use goes through it."""
    if assignment is None:
        return False
    stmt = assignment.stmt  # type: ignore[attr-defined]
    value = assignment.value  # type: ignore[attr-defined]
    if not isinstance(stmt, ast.Assign) or assignment.index is not None or value is None:  # type: ignore[attr-defined]
        return False
    block = facts.parents.get(stmt)
    if block is None or not facts.is_inside(use, block):
        return False
    return detached_value(value)


def _detached_use(facts: Facts, use: ast.Name) -> bool:
    """The binding of `use` that reaches it was made with gradients off or is detached."""
    made = facts.reaching_assignment(use)
    return made is not None and (facts.in_no_grad(made.stmt) or _rebound_detached(facts, use, made))


def _live_container(
    facts: Facts, value: ast.Name, containers: dict[str, list[ast.Subscript]]
) -> bool:
    """`value` still holds the binding whose item was backward()-ed, and that item was not
    replaced by a detached value in between (`output["loss"] = output["loss"].detach()`,
    the packnet-sfm fix)."""
    binding = facts.reaching_assignment(value)
    for item in containers.get(value.id, ()):
        if not isinstance(item.value, ast.Name):
            continue
        if facts.reaching_assignment(item.value) is not binding:
            continue  # the name was rebound (say, to a detached copy) since the backward()
        key = ast.dump(item.slice)
        replaced = any(
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Subscript)
            and isinstance(node.targets[0].value, ast.Name)
            and node.targets[0].value.id == value.id
            and ast.dump(node.targets[0].slice) == key
            and detached_value(node.value)
            and item.lineno <= node.lineno <= value.lineno
            for node in facts.walk_local(facts.scope(value))
        )
        if not replaced:
            return True
    return False


def _part_of_held(
    facts: Facts, name: ast.Name, loss_names: set[str], containers: dict[str, list[ast.Subscript]]
) -> bool:
    """`name` walks the values of a helper's container of graph parts (`for key, part in
    parts.items()`, `parts` a training step's returned loss dict)."""
    iterated = iterated_container(facts, name)
    return iterated is not None and iterated.id in loss_names and iterated.id in containers


def _holds_graph(
    facts: Facts,
    value: ast.expr,
    loss_names: set[str],
    containers: dict[str, list[ast.Subscript]],
    project_calls: set[ast.Call],
) -> ast.expr | None:
    """What in `value` keeps a graph alive: the loss name (possibly scaled), a container name
    holding one, a call of a helper returning one, or such an element of a dict, tuple or
    list display (`{"loss": loss}`, `(step, loss)`); None for Python numbers and detached
    values."""
    parts = _dict_parts(facts, value)
    if parts and any(
        not isinstance(part, (ast.Dict, ast.Tuple, ast.List, ast.Subscript))
        and _holds_graph(facts, part, loss_names, containers, project_calls) is not None
        for part in parts
    ):
        return value  # an item of a dict of loss parts: `parts["box"]`, `for k, v in parts.items()`
    if isinstance(value, ast.Name):
        if value.id in loss_names or _live_container(facts, value, containers):
            return value
        return value if _part_of_held(facts, value, loss_names, containers) else None
    if isinstance(value, ast.BinOp) and isinstance(value.op, (ast.Mult, ast.Div)):
        for side in (value.left, value.right):
            if isinstance(side, ast.Name) and (
                side.id in loss_names or _part_of_held(facts, side, loss_names, containers)
            ):
                return side
            if isinstance(side, (ast.Name, ast.Subscript)) and _dict_parts(facts, side):
                held = _holds_graph(facts, side, loss_names, containers, project_calls)
                if held is not None:
                    return held
    if _returns_graph(facts, value, project_calls):
        return value
    elements: list[ast.expr] = []
    if isinstance(value, ast.Dict):
        elements = [v for v in value.values if v is not None]
    elif isinstance(value, (ast.Tuple, ast.List)):
        elements = list(value.elts)
    for element in elements:
        # One level down only: a display's element is a name, a scaled name or a call here.
        if isinstance(element, (ast.Dict, ast.Tuple, ast.List)):
            continue
        held = _holds_graph(facts, element, loss_names, containers, project_calls)
        if held is not None:
            return held
    return None


@rule(
    "TL206",
    "graph-kept-alive",
    "W",
    "Loss tensor accumulated across iterations keeps every graph alive",
    fix="safe",
)
def graph_kept_alive(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    A loss (a tensor attached to the autograd graph) accumulated across loop iterations:
    `losses.append(loss)`, `total += loss`, `history[step] = loss`, `totals["ce"] += ce`,
    without `.item()`, `.detach()` or `float(...)`; also through containers: a dict or tuple
    holding the loss appended to a list (`history.append({"loss": loss})`), a step's output
    dict whose `output["loss"]` is backward()-ed kept in a list, the loss a project helper
    (`train_step`, in this file or another) returns after backward()-ing it, and the items
    of a dict of loss parts (`for name, part in parts.items(): totals[name] += part`). A
    loss differentiated through a gradient scaler (`scaler.scale(loss).backward()`) counts
    as backward()-ed. A running total rebound with the sum (`total = total * 0.99 + v`) is an
    accumulation like `total += v`; and the stats object of a helper returning
    `(loss, stats)` counts as holding a graph when the helper stores a forward's tensor in it
    undetached (`stats["aux"] = aux`) and the caller backward()s that loss. The parts a
    backward()-ed total was summed from hold the graph too: a loss object (its `__call__`,
    the object built by a project class or a factory) returning `(total, parts)`, and a
    training step returning those `parts` to an epoch loop that adds up their items. Also: a
    store under a moving key (`history[step], stats[step] = optimizer.step(closure)`) into a
    container made before a step loop whose items are backward()-ed in it
    (`history[step - 1].backward()`), and a LightningModule's `training_step` appending what
    it returns (the value Lightning backward()s) to a `self.` list that only an epoch-level
    hook empties. Also a loss (or an indexed piece of one, `loss[0]`) handed to a method of a
    project collector object made outside the step loop (`counter.add(loss)`, in this file or
    another) that appends that parameter to a list on the object (`self.losses.append(l)`).
    Also a method of a class that runs once per iteration (called as `self.step(...)` in a
    loop of another method, or by such a method) and adds a loss still on its graph to a
    list, dict or running total on `self` (`self.epoch_losses.append(loss)`), directly or
    through another attribute a sibling method parked it in (`self.last = loss`, then
    `self.history.append(self.last)`); not when a per-step method empties that container.

    ## Why it is wrong
    Each stored loss keeps its whole computation graph, activations included, alive. Memory
    grows every iteration until the run dies with an out-of-memory error hours in. Summing
    losses that are backward()-ed together afterwards is intended and is not reported, nor is
    a slot under a constant key (`latest["d"] = d_loss`, or `latest[name] = part` over a dict's
    keys) that every step overwrites, nor a loss name rebound to a detached copy before it
    is stored (`loss = loss.detach().cpu()`).

    ## Example
    ```python
    total = 0
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        total += loss             # TL206
    ```

    ## Fix
    Store a Python number: `total += loss.item()` (or `loss.detach()` to keep a tensor). The
    fix adds `.item()`; it is offered as unsafe when the accumulator is later used as a tensor.
    """
    scopes = [facts.tree, *facts.functions.values()]
    scopes += [m for c in facts.classes.values() for m in c.methods.values()]
    project_calls = set(facts.project_calls)
    # Only scopes that hold a backward(), a loss call or a project call can hold a loss: the
    # others are not walked at all (most functions of a file are neither).
    lossy = {
        facts.scope(call)
        for call in facts.calls
        if call in project_calls
        or call in facts.loss_call_nodes
        or (facts.method_name(call) == "backward" and not call.args)
    }
    loss_names_of = functools.cache(
        lambda s: _loss_names(facts, s, project_calls)[0] if s in lossy else set()
    )
    yield from self_attribute_keeps(facts, loss_names_of, lambda use: _detached_use(facts, use))
    for stmt, attr, held in step_output_stores(facts):
        yield Hit(
            stmt,
            f"`{held.id}` is what `training_step` returns for Lightning to backward(), so it "
            f"holds this step's autograd graph, and `self.{attr}` keeps it until the epoch "
            f"ends; append `.detach()`-ed values (or `.item()`) instead",
            None,
        )
    for scope in scopes:
        if scope not in lossy:
            continue
        loss_names, containers, sources = _loss_names(facts, scope, project_calls)
        if not loss_names and not containers:
            continue
        reported: set[ast.stmt] = set()
        for stmt, container in slot_stores(
            facts, scope, {k: v for k, v in containers.items() if v}
        ):
            reported.add(stmt)
            yield Hit(
                stmt,
                f"the items of `{container}` are backward()-ed, so they are attached to their "
                f"autograd graphs, and every step stores one more in `{container}`; store "
                f"`.item()` or `.detach()` values instead",
                None,
            )
        yield from collector_keeps(
            facts,
            scope,
            loss_names,
            loss_names - set(containers) - sources,
            lambda use: _detached_use(facts, use),
        )
        for node in facts.walk_local(scope):
            if not isinstance(node, ast.stmt) or node in reported:
                continue
            found = accumulation(node)
            if found is None:
                continue
            accumulator, value, how = found
            if how == "[]=" and _fixed_key(facts, node.targets[0].slice):  # type: ignore[attr-defined]
                continue
            loss = _holds_graph(facts, value, loss_names, containers, project_calls)
            loops = facts.enclosing_loops(node)
            if loss is None or not loops or facts.in_no_grad(node):
                continue
            assignments = facts.assignments_of(accumulator, scope)
            # The running sum's own rebinding (`total = total + v`) does not make it per-step.
            assignments = [a for a in assignments if a.stmt is not node]
            if not assignments or not outlives_a_step(facts, loops, assignments):
                continue
            if how == "+=" and accumulator in loss_names:
                continue
            if feeds_backward(facts, scope, accumulator):
                continue
            if isinstance(loss, ast.Name):
                loss_assignment = facts.reaching_assignment(loss)
                if loss_assignment is not None and facts.in_no_grad(loss_assignment.stmt):
                    continue
                if _rebound_detached(facts, loss, loss_assignment):
                    continue  # `loss = loss.detach().cpu()` before `total += loss`
            if isinstance(loss, ast.Call):
                label = f"{facts.source.segment(loss.func)}(...)"
            elif isinstance(loss, ast.Name):
                label = loss.id
            else:
                label = facts.source.segment(loss)
            if isinstance(loss, ast.Name) and loss.id in containers:
                # A container (a step's output dict): `.item()` on it is no fix.
                yield Hit(
                    node,
                    f"`{label}` holds a loss still attached to its autograd graph and is kept "
                    f"in `{accumulator}`; store `.item()` or `.detach()` values instead",
                    None,
                )
                continue
            fix = None
            from_parts = not isinstance(loss, ast.Call) and not (
                isinstance(loss, ast.Name) and loss.id in loss_names
            )
            # A name a loss was summed from may be a tuple: `.item()` on it is no fix.
            from_parts = from_parts or (isinstance(loss, ast.Name) and loss.id in sources)
            if how in ("append", "+=") and value is loss and not from_parts:
                applicability = (
                    "unsafe"
                    if used_as_tensor_later(facts, scope, accumulator, node.lineno)
                    else "safe"
                )
                fix = Fix(
                    applicability,  # type: ignore[arg-type]
                    f"Accumulate `{label}.item()`",
                    (
                        insert_at(
                            loss.end_lineno,
                            facts.source.column(loss.end_lineno, loss.end_col_offset),
                            ".item()",
                        ),
                    ),
                )
            if isinstance(loss, ast.Call):
                message = (
                    f"`{label}` returns a loss still attached to its autograd graph and it is "
                    f"accumulated into `{accumulator}`; use `.item()` or `.detach()` on it"
                )
            else:
                message = (
                    f"`{label}` is accumulated into `{accumulator}` with its autograd graph; "
                    f"use `{label}.item()` or `{label}.detach()`"
                )
            yield Hit(node, message, fix)
