"""Loss contracts for the editor hover.

In: `Facts` and a position. Out: Markdown saying what the loss under the cursor expects (input
and target shapes and dtypes) and, when the analysis can see it, where this call's input and
target come from.
"""

from __future__ import annotations

import ast
from pathlib import Path

from torchls.analysis.facts import Facts, LossCall
from torchls.analysis.losses import CONTRACTS, loss_kind_of_call
from torchls.analysis.queries.tensors import activation_of, float_cast


def _contains(node: ast.AST, row: int, column: int, facts: Facts) -> bool:
    span = facts.source.span(node)
    start, end = span.start, span.end
    return (start.row, start.column) <= (row, column) <= (end.row, end.column)


def _constructor_at(facts: Facts, row: int, column: int) -> tuple[str, ast.Call] | None:
    for call in facts.calls:
        if not _contains(call.func, row, column, facts):
            continue
        kind = facts.kind_of(call)
        if kind is not None and kind.kind == "loss" and kind.detail in CONTRACTS:
            return kind.detail, call
    return None


def _loss_call_at(facts: Facts, row: int, column: int) -> LossCall | None:
    best: LossCall | None = None
    for loss_call in facts.loss_calls:
        if _contains(loss_call.call, row, column, facts) and (
            best is None or facts.is_inside(loss_call.call, best.call)
        ):
            best = loss_call
    return best


def _describe_input(facts: Facts, loss_call: LossCall) -> str | None:
    if loss_call.input is None:
        return None
    origins = facts.origins(loss_call.input)
    if len(origins) != 1:
        return None
    origin = origins[0]
    owner = facts.owner(origin)
    text = owner.source.segment(origin.node).splitlines()[0][:60]
    activation = activation_of(facts, origin)
    where = f"line {origin.node.lineno}"
    if owner is not facts:
        where = f"{Path(owner.filename).name}:{origin.node.lineno}"
    if activation is not None:
        return f"input comes from **{activation}** (`{text}`, {where})"
    if origin.node is not loss_call.input:
        return f"input comes from `{text}` ({where})"
    return None


def _describe_target(facts: Facts, loss_call: LossCall) -> str | None:
    if loss_call.target is None:
        return None
    cast = float_cast(facts, loss_call.target)
    if cast is not None:
        return f"target is cast to float here (`{facts.source.segment(cast)[:60]}`)"
    return None


def contract_markdown_at(facts: Facts, row: int, column: int) -> str | None:
    """Markdown for the loss constructor or loss call at (row, column), else None."""
    loss_call = _loss_call_at(facts, row, column)
    if loss_call is not None:
        name = loss_call.loss
        notes = [_describe_input(facts, loss_call), _describe_target(facts, loss_call)]
    else:
        found = _constructor_at(facts, row, column)
        if found is None:
            call = next(
                (
                    c
                    for c in facts.calls
                    if _contains(c.func, row, column, facts) and loss_kind_of_call(facts, c)
                ),
                None,
            )
            if call is None:
                return None
            name = loss_kind_of_call(facts, call)[0]  # type: ignore[index]
        else:
            name = found[0]
        notes = []
    contract = CONTRACTS[name]
    lines = [
        f"**{name}** contract",
        "",
        f"- input: {contract.input}",
        f"- target: {contract.target}",
        f"- {contract.note}",
    ]
    seen = [note for note in notes if note]
    if seen:
        lines += ["", "This call:", *(f"- {note}" for note in seen)]
    return "\n".join(lines)
