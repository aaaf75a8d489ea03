"""What the Keras rules (TL601-TL605) share: argument edits, the loss uses of a model and how a
model is described in a message.

In: the file's `Facts` and the Keras models and losses found by `torchls.analysis.keras`.
Out: an `Edit` appending a keyword argument (TL602, TL604), every (loss, model, how) pair of
the file (TL601, TL602), and a model's description and line for messages.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis import keras as k
from torchls.analysis.facts import Facts
from torchls.analysis.findings import Edit
from torchls.analysis.rules._edits import insert_at


def _add_keyword(facts: Facts, call: ast.Call, text: str) -> Edit:
    """Append `text` (`from_logits=True`) as the call's last argument."""
    arguments: list[ast.AST] = [*call.args, *call.keywords]
    if arguments:
        last = max(arguments, key=lambda a: (a.end_lineno, a.end_col_offset))  # type: ignore[attr-defined]
        end = facts.source.span(last).end
        return insert_at(end.row, end.column, f", {text}")
    end = facts.source.span(call).end
    return insert_at(end.row, end.column - 1, text)


def _line(node: ast.AST) -> int:
    return node.lineno  # type: ignore[attr-defined]


def _loss_uses(facts: Facts) -> Iterator[tuple[k.KerasLoss, k.KerasModel, str]]:
    """Every (loss, model, how): a `compile(loss=...)` and a loss applied by hand to a model's
    output in a custom step."""
    for call, model in k.compile_calls(facts):
        loss = k.compiled_loss(facts, call)
        if loss is not None:
            yield loss, model, "compiled"
    for _call, loss, model in k.loss_applications(facts):
        yield loss, model, "applied"


def _describe_head(model: k.KerasModel) -> str:
    kind = {
        "sequential": "Sequential model",
        "functional": "functional model",
        "subclass": "model subclass",
    }[model.style]
    return f"the {model.flavour} {kind} on line {_line(model.node)}"
