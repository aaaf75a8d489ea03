"""Helpers shared by the TL1xx loss-input rules (TL101-TL104, TL106, TL107).

Why: several rules ask the same questions of a loss input: is every origin (or every origin of
one `if` choice) an activation, how to describe it in a message, which related locations to
show, and, for TL101-TL103, which loss calls get an activated input and the fix that passes the
logits instead. In: `Facts`, nodes and origins. Out: origins, message text, `Related` and `Fix`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from torchls.analysis.facts import Facts, LossCall, Origin
from torchls.analysis.findings import Fix, Related
from torchls.analysis.library_loops import LibraryLoop, library_loops
from torchls.analysis.losses import ChosenLoss, chosen_losses
from torchls.analysis.queries.tensors import activation_input, activation_of
from torchls.analysis.rules._edits import replace_node
from torchls.records import replace


def all_activated(facts: Facts, expr: ast.expr, accepted: set[str]) -> list[Origin] | None:
    """The origins of `expr` when every one of them is an activation in `accepted`; or, when
    an `if` chooses where the value comes from (`model = A()` / `model = B()`), the origins
    of a choice whose every origin is one: that path feeds the loss an activation."""
    origins = facts.origins(expr)
    if not origins:
        return None
    activated = [activation_of(facts, origin) in accepted for origin in origins]
    if all(activated):
        return [replace(origin, branch=None) for origin in origins]  # every path: no choice
    if not any(activated) or any(origin.branch is None for origin in origins):
        return None
    choices: dict[int, list[tuple[Origin, bool]]] = {}
    for origin, is_activated in zip(origins, activated, strict=True):
        choices.setdefault(id(origin.branch), []).append((origin, is_activated))
    for choice in choices.values():
        if all(is_activated for _, is_activated in choice):
            return [origin for origin, _ in choice]
    return None


def describe(facts: Facts, argument: ast.AST, origin: Origin) -> str:
    """`probs` (from `F.softmax(logits, dim=1)` on line 11), or just the argument when it is
    the activation itself."""
    if origin.node is argument:
        return f"`{_short(facts, argument)}`"
    owner = facts.owner(origin)
    where = f"on line {origin.node.lineno}"
    if owner is not facts:
        where = f"in {Path(owner.filename).name}, line {origin.node.lineno}"
    if origin.branch is not None:
        where += f", on the path through line {origin.branch.lineno}"  # type: ignore[attr-defined]
    return f"`{_short(facts, argument)}` (from `{_short(owner, origin.node)}` {where})"


def related_for(facts: Facts, origins: list[Origin], what: str) -> tuple[Related, ...]:
    related = []
    for origin in origins:
        owner = facts.owner(origin)
        filename = owner.filename if owner is not facts else None
        related.append(Related(owner.source.span(origin.node), f"{what} applied here", filename))
    return tuple(related)


def _unchanged_between(facts: Facts, name: str, scope: ast.AST, start: int, end: int) -> bool:
    return not any(
        start < a.stmt.lineno <= end
        for a in facts.assignments_of(name, scope)  # type: ignore[arg-type]
    )


def pass_logits_fix(
    facts: Facts, argument: ast.expr, origins: list[Origin], what: str
) -> Fix | None:
    """Replace the activated argument with the tensor the activation was applied to, when the
    activation is local: the argument itself, or a local variable assigned from it whose input
    is a name not rebound since."""
    if len(origins) != 1 or origins[0].module_output or origins[0].facts is not None:
        return None
    if origins[0].branch is not None:
        return None  # another path feeds the logits: the activation is that path's choice
    activation = origins[0].node
    if not isinstance(activation, ast.Call):
        return None
    logits = activation_input(facts, activation)
    if logits is None:
        return None
    if activation is argument:
        return Fix(
            "safe",
            f"Pass the logits instead of the {what} output",
            (replace_node(facts, argument, facts.source.segment(logits)),),
        )
    if not (isinstance(argument, ast.Name) and isinstance(logits, ast.Name)):
        return None
    assignment = facts.reaching_assignment(argument)
    if assignment is None or assignment.value is not activation:
        return None
    scope = facts.scope(argument)
    if facts.scope(activation) is not scope:
        return None
    if not _unchanged_between(facts, logits.id, scope, activation.lineno, argument.lineno):
        return None
    return Fix(
        "safe",
        f"Pass `{logits.id}` (the logits) instead of the {what} output",
        (replace_node(facts, argument, logits.id),),
    )


def _input_rule(
    facts: Facts, losses: set[str], accepted: set[str], what: str, fixable: bool
) -> Iterator[tuple[LossCall, list[Origin], Fix | None]]:
    for loss_call in facts.loss_calls:
        if loss_call.loss not in losses or loss_call.input is None:
            continue
        origins = all_activated(facts, loss_call.input, accepted)
        if origins is None:
            continue
        fix = pass_logits_fix(facts, loss_call.input, origins, what) if fixable else None
        yield loss_call, origins, fix


def chosen_loss_inputs(
    facts: Facts, loss: str, accepted: set[str]
) -> Iterator[tuple[ChosenLoss, list[Origin]]]:
    """Calls of a loss object picked among several losses (`chosen_losses`) whose input is,
    on every path, an activation in `accepted`: wrong wherever the setting picks `loss`."""
    for chosen in chosen_losses(facts, loss):
        origins = facts.origins(chosen.input)
        if origins and all(activation_of(facts, o) in accepted for o in origins):
            yield chosen, [replace(origin, branch=None) for origin in origins]


def chosen_lead(facts: Facts, chosen: ChosenLoss) -> str:
    """How a finding on a chosen loss starts: which loss, and on which paths."""
    if chosen.kinds == {chosen.loss}:
        return f"{chosen.loss} input"
    held = _short(facts, chosen.call.func)
    return f"where the setting picks {chosen.loss} for `{held}`, its input"


def chosen_related(facts: Facts, chosen: ChosenLoss) -> tuple[Related, ...]:
    """Where the picked loss is built (a base class in another file, maybe)."""
    filename = chosen.owner.filename if chosen.owner is not facts else None
    span = chosen.owner.source.span(chosen.constructor)
    return (Related(span, f"{chosen.loss} picked here", filename),)


def library_loop_inputs(
    facts: Facts, loss: str, accepted: set[str]
) -> Iterator[tuple[LibraryLoop, list[Origin]]]:
    """Library-owned loops (`NeuralNet(Net, criterion=nn.CrossEntropyLoss)`) whose criterion
    is of kind `loss` and whose module's every `forward` return is an activation in
    `accepted`."""
    for loop in library_loops(facts):
        if loop.loss != loss:
            continue
        origins = list(loop.origins)
        if all(activation_of(facts, origin) in accepted for origin in origins):
            yield loop, [replace(origin, branch=None) for origin in origins]


def _short(facts: Facts, node: ast.AST | None) -> str:
    if node is None:
        return "?"
    text = facts.source.segment(node).splitlines()[0]
    return text if len(text) <= 40 else text[:37] + "..."
