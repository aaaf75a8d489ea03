"""TL104 `nll-without-log-softmax`: `NLLLoss` fed a softmax output or a linear layer's raw
logits instead of log-probabilities; the unsafe fix turns a local softmax into log_softmax.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts, Origin
from torchls.analysis.findings import Fix
from torchls.analysis.registry import Hit, rule
from torchls.analysis.rules._edits import replace_node
from torchls.analysis.rules._losses import all_activated, describe, related_for


def _is_raw_linear_output(facts: Facts, origin: Origin) -> bool:
    facts = facts.owner(origin)
    node = origin.node
    return (
        origin.module_output
        and isinstance(node, ast.Call)
        and facts.short_name(node) in ("Linear", "LazyLinear", "Bilinear")
    )


@rule(
    "TL104",
    "nll-without-log-softmax",
    "E",
    "NLLLoss gets softmax output or raw logits instead of log-probabilities",
    fix="unsafe",
)
def nll_without_log_softmax(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    `nn.NLLLoss` / `F.nll_loss` whose input is a softmax output, or the raw output of a linear
    layer (logits), instead of log-probabilities. The input is followed as for TL101: into a
    model's `forward` (another project file included), a head kept on `self`, and a network
    a function is handed by callers in other project files.

    ## Why it is wrong
    NLLLoss only picks `-input[target]`; it does not normalise. On probabilities the "loss" is
    `-p`, bounded in `[-1, 0]`, with tiny gradients; on raw logits the model can lower it
    forever by inflating the target logit. Training looks like it runs but optimises the wrong
    objective.

    ## Example
    ```python
    loss = F.nll_loss(F.softmax(logits, dim=1), target)    # TL104
    ```

    ## Fix
    Feed `F.log_softmax(logits, dim=1)`, or use `F.cross_entropy(logits, target)`, which fuses
    both. Offered as an unsafe fix.
    """
    for loss_call in facts.loss_calls:
        if loss_call.loss != "NLLLoss" or loss_call.input is None:
            continue
        origins = facts.origins(loss_call.input)
        if not origins:
            continue
        softmaxed = all_activated(facts, loss_call.input, {"softmax"})
        if softmaxed is not None:
            # Every path, or every origin of one `if` arm (`MLP() if ... else CNN()`).
            origins = softmaxed
            what = "a softmax output"
            fix = _softmax_to_log_softmax_fix(facts, loss_call.input, origins)
        elif all(_is_raw_linear_output(facts, origin) for origin in origins):
            what = "raw logits from a linear layer"
            fix = None
        else:
            continue
        yield Hit(
            loss_call.input,
            f"NLLLoss input {describe(facts, loss_call.input, origins[0])} is {what}; NLLLoss "
            "expects log-probabilities (`log_softmax`)",
            fix,
            related_for(facts, origins, "softmax" if "softmax" in what else "linear layer"),
        )


def _softmax_to_log_softmax_fix(
    facts: Facts, argument: ast.expr, origins: list[Origin]
) -> Fix | None:
    if len(origins) != 1 or origins[0].node is not argument or not isinstance(argument, ast.Call):
        return None
    func = argument.func
    text = facts.source.segment(func)
    if not text.endswith("softmax") or text.endswith("log_softmax"):
        return None
    return Fix(
        "unsafe",
        "Use log_softmax",
        (replace_node(facts, func, text[: -len("softmax")] + "log_softmax"),),
    )
