"""TL103 `sigmoid-then-bce`: `BCELoss` on a sigmoid output, where `BCEWithLogitsLoss` on the
logits is the numerically stable form; the unsafe fix switches the loss and drops the sigmoid.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts, LossCall, Origin
from torchls.analysis.findings import Fix
from torchls.analysis.losses import loss_related
from torchls.analysis.queries.tensors import activation_input
from torchls.analysis.registry import Hit, rule
from torchls.analysis.rules._edits import replace_node
from torchls.analysis.rules._losses import _input_rule, describe, related_for


@rule(
    "TL103",
    "sigmoid-then-bce",
    "I",
    "BCELoss on a sigmoid output; BCEWithLogitsLoss is the stable form",
    fix="unsafe",
)
def sigmoid_then_bce(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    `nn.BCELoss` / `F.binary_cross_entropy` applied to a sigmoid output.

    ## Why it is wrong
    Computing `log(sigmoid(x))` in two steps loses precision: for large |x| the sigmoid rounds
    to exactly 0 or 1, BCELoss clamps the log at -100 and the gradient vanishes or the loss
    saturates. `BCEWithLogitsLoss` fuses both with the log-sum-exp trick. BCELoss is also not
    allowed inside `autocast`.

    ## Example
    ```python
    loss = F.binary_cross_entropy(torch.sigmoid(logits), y)   # TL103
    ```

    ## Fix
    `F.binary_cross_entropy_with_logits(logits, y)` (or `nn.BCEWithLogitsLoss()`). Offered as
    an unsafe fix: it changes the loss object and anything else that reads the probabilities.
    """
    for loss_call, origins, _ in _input_rule(facts, {"BCELoss"}, {"sigmoid"}, "sigmoid", False):
        yield Hit(
            loss_call.input,  # type: ignore[arg-type]
            f"BCELoss input {describe(facts, loss_call.input, origins[0])} is a sigmoid output; "
            "BCEWithLogitsLoss on the logits is numerically stable",
            _bce_with_logits_fix(facts, loss_call, origins),
            related_for(facts, origins, "sigmoid") + loss_related(facts, loss_call),
        )


def _bce_with_logits_fix(facts: Facts, loss_call: LossCall, origins: list[Origin]) -> Fix | None:
    argument = loss_call.input
    if argument is None or len(origins) != 1 or origins[0].node is not argument:
        return None
    logits = activation_input(facts, argument) if isinstance(argument, ast.Call) else None
    if logits is None:
        return None
    edits = [replace_node(facts, argument, facts.source.segment(logits))]
    func = loss_call.call.func
    if loss_call.constructor is None:
        if not isinstance(func, (ast.Attribute, ast.Name)):
            return None
        text = facts.source.segment(func)
        if not text.endswith("binary_cross_entropy"):
            return None
        edits.append(replace_node(facts, func, text + "_with_logits"))
    else:
        constructor_func = loss_call.constructor.func
        text = facts.source.segment(constructor_func)
        if not text.endswith("BCELoss"):
            return None
        edits.append(
            replace_node(facts, constructor_func, text[: -len("BCELoss")] + "BCEWithLogitsLoss")
        )
    return Fix("unsafe", "Use BCEWithLogitsLoss on the logits", tuple(edits))
