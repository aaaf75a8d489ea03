"""TL503 `log-without-guard`: the log of a name that holds a softmax or sigmoid output with no
clamp or epsilon on the way, so an exact 0 gives -inf.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.queries.tensors import activation_of
from torchls.analysis.registry import Hit, rule
from torchls.analysis.rules._numerics import _log_argument, _log_calls

GUARDS = {"clamp", "clamp_min", "clip", "add", "maximum", "nan_to_num"}


@rule(
    "TL503",
    "log-without-guard",
    "I",
    "log() of a probability with no clamp or epsilon",
)
def log_without_guard(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    `torch.log(p)` / `p.log()` where `p` holds probabilities (it was computed by a softmax or
    sigmoid earlier) and nothing keeps it away from zero.

    ## Why it is wrong
    A probability that underflows to exactly 0 gives `-inf`, and the next backward pass turns
    it into NaN in every parameter — typically hundreds of steps into training, when the model
    becomes confident.

    ## Example
    ```python
    probs = torch.sigmoid(logits)
    entropy = -(probs * torch.log(probs)).sum()     # TL503
    ```

    ## Fix
    Guard it: `torch.log(probs.clamp_min(1e-8))` or `torch.log(probs + 1e-8)`, or compute in
    log space from the logits (`log_softmax`, `logsigmoid`). No automatic fix.
    """
    for call in _log_calls(facts):
        argument = _log_argument(facts, call)
        if not isinstance(argument, ast.Name):
            continue
        origins = facts.origins(argument)
        if not origins:
            continue
        kinds = {activation_of(facts, origin) for origin in origins}
        if not kinds <= {"softmax", "sigmoid"} or None in kinds:
            continue
        if any(
            isinstance(step, ast.Call) and facts.method_name(step) in GUARDS
            for origin in origins
            for step in origin.via
        ):
            continue
        yield Hit(
            call,
            f"log of `{argument.id}`, a {kinds.pop()} output (line {origins[0].node.lineno}), "
            "with no clamp or epsilon: an exact 0 gives -inf",
        )
