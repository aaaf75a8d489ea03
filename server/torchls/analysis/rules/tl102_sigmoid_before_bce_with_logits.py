"""TL102 `sigmoid-before-bce-with-logits`: `BCEWithLogitsLoss` fed a sigmoid output, which
applies the sigmoid twice; the fix passes the logits when the sigmoid is local.
"""

from __future__ import annotations

from collections.abc import Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.losses import loss_related
from torchls.analysis.registry import Hit, rule
from torchls.analysis.rules._losses import (
    _input_rule,
    chosen_lead,
    chosen_loss_inputs,
    chosen_related,
    describe,
    library_loop_inputs,
    related_for,
)


@rule(
    "TL102",
    "sigmoid-before-bce-with-logits",
    "E",
    "BCEWithLogitsLoss gets sigmoid output instead of logits",
    fix="safe",
)
def sigmoid_before_bce_with_logits(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    The input of `nn.BCEWithLogitsLoss` / `F.binary_cross_entropy_with_logits` is a sigmoid
    output, also after shape-only steps and casts (`torch.squeeze(p)`, `p.type(dtype)`), and
    also for a project loss module whose `forward` hands its input (unchanged, reshaped or
    selected) to `binary_cross_entropy_with_logits` (a focal loss), or for the loss function
    itself kept on `self` (`self.loss_fn = F.binary_cross_entropy_with_logits`, or a lambda
    handing its arguments on to it). The sigmoid is found
    where TL101 finds a softmax: in a model's `forward` or an `nn.Sequential` (another project file
    included), a head kept on `self` (built in either arm of an `if`, or attached by another
    method), a module a wrapper is handed, a network handed in by another file's callers;
    and, as TL101, a module class a skorch net trains with `criterion=nn.BCEWithLogitsLoss`.
    As TL101, a loss a setting picks is BCE-with-logits on the paths that pick it.

    ## Why it is wrong
    The "with logits" losses apply the sigmoid themselves. A second sigmoid maps every
    prediction into roughly `[0.5, 0.73]`, so the model can never express confidence and the
    loss plateaus.

    ## Example
    ```python
    criterion = nn.BCEWithLogitsLoss()
    loss = criterion(torch.sigmoid(logits), y)   # TL102
    ```

    ## Fix
    Pass the logits: `criterion(logits, y)`.
    """
    for loss_call, origins, fix in _input_rule(
        facts, {"BCEWithLogitsLoss"}, {"sigmoid"}, "sigmoid", True
    ):
        yield Hit(
            loss_call.input,  # type: ignore[arg-type]
            f"BCEWithLogitsLoss input {describe(facts, loss_call.input, origins[0])} is already "
            "a sigmoid output; the loss applies the sigmoid itself",
            fix,
            related_for(facts, origins, "sigmoid") + loss_related(facts, loss_call),
        )
    for chosen, origins in chosen_loss_inputs(facts, "BCEWithLogitsLoss", {"sigmoid"}):
        yield Hit(
            chosen.input,
            f"{chosen_lead(facts, chosen)} {describe(facts, chosen.input, origins[0])} is "
            "already a sigmoid output; the loss applies the sigmoid itself",
            None,
            related_for(facts, origins, "sigmoid") + chosen_related(facts, chosen),
        )
    for loop, origins in library_loop_inputs(facts, "BCEWithLogitsLoss", {"sigmoid"}):
        yield Hit(
            loop.module,
            f"the net trains {describe(facts, loop.module, origins[0])} with "
            "BCEWithLogitsLoss, but its forward output is already a sigmoid output; the loss "
            "applies the sigmoid itself",
            None,
            related_for(facts, origins, "sigmoid"),
        )
