"""Loss contracts for the editor hover.

In: `Facts` (and a position). Out: Markdown saying what the loss under the cursor expects
(input and target shapes and dtypes) and, when the analysis can see it, where this call's
input and target come from; or the `ContractTable` of a whole file version, which answers any
position by a look-up (the editor builds it once per version).
"""

from __future__ import annotations

import ast
from pathlib import Path

from torchls.analysis.facts import Facts, LossCall
from torchls.analysis.losses import CONTRACTS, loss_kind_of_call
from torchls.analysis.queries.tensors import activation_of, float_cast
from torchls.records import record


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
    return contract_table(facts).markdown_at(row, column)


Position = tuple[int, int]  # (1-based row, 0-based code-point column)


@record(frozen=True)
class ContractTable:
    """Every place of one file version where a hover shows a loss contract, with its
    Markdown: built once per version, so a hover is a look-up instead of an analysis."""

    # (start, end, markdown) in file order: loss calls (the notes on their input and target
    # included), loss constructors, and other calls of a known loss (by the called name).
    loss_calls: tuple[tuple[Position, Position, str], ...] = ()
    constructors: tuple[tuple[Position, Position, str], ...] = ()
    loss_names: tuple[tuple[Position, Position, str], ...] = ()

    def markdown_at(self, row: int, column: int) -> str | None:
        at = (row, column)
        best: tuple[Position, Position, str] | None = None
        for entry in self.loss_calls:
            start, end, _ = entry
            # The innermost loss call under the cursor (a loss inside another loss's input).
            if start <= at <= end and (best is None or (best[0] <= start and end <= best[1])):
                best = entry
        if best is not None:
            return best[2]
        for group in (self.constructors, self.loss_names):
            for start, end, markdown in group:
                if start <= at <= end:
                    return markdown
        return None


def contract_table(facts: Facts) -> ContractTable:
    """The hover contracts of the file `facts` describes (see `ContractTable`)."""

    def where(node: ast.AST) -> tuple[Position, Position]:
        span = facts.source.span(node)
        return (span.start.row, span.start.column), (span.end.row, span.end.column)

    loss_calls = []
    for loss_call in facts.loss_calls:
        notes = [_describe_input(facts, loss_call), _describe_target(facts, loss_call)]
        loss_calls.append((*where(loss_call.call), _render(loss_call.loss, notes)))
    constructors = []
    loss_names = []
    for call in facts.calls:
        kind = facts.kind_of(call)
        if kind is not None and kind.kind == "loss" and kind.detail in CONTRACTS:
            constructors.append((*where(call.func), _render(kind.detail, [])))
        found = loss_kind_of_call(facts, call)
        if found is not None:
            loss_names.append((*where(call.func), _render(found[0], [])))
    return ContractTable(tuple(loss_calls), tuple(constructors), tuple(loss_names))


def _render(name: str, notes: list[str | None]) -> str:
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
