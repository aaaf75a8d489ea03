"""TL503 `log-without-guard`: the log of a name that holds a softmax or sigmoid output with no
clamp or epsilon on the way, so an exact 0 gives -inf.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.queries.tensors import activation_of
from torchls.analysis.registry import Hit, exemption, rule
from torchls.analysis.rules._numerics import _log_argument, _log_calls


@exemption("TL503", "neg_guarded_log.py")
def _not_a_bare_probability(kinds: set[str | None]) -> bool:
    """Some value the name can hold is not a softmax or sigmoid output reached only through
    casts, moves and reshapes: a guard sits in between (`probs + eps`, `.clamp(lo, hi)`,
    `.clamp_min(eps)`, `torch.maximum(...)`) or the value comes from elsewhere."""
    return not kinds <= {"softmax", "sigmoid"}


@rule(
    "TL503",
    "log-without-guard",
    "I",
    "log() of a probability with no clamp or epsilon",
)
def log_without_guard(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    `torch.log(p)` / `p.log()` where the name `p` holds the output of a softmax or sigmoid
    computed earlier, reached only through assignments, casts, device moves and reshapes.

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
        if _not_a_bare_probability(kinds):
            continue
        yield Hit(
            call,
            f"log of `{argument.id}`, a {kinds.pop()} output (line {origins[0].node.lineno}), "
            "with no clamp or epsilon: an exact 0 gives -inf",
        )
