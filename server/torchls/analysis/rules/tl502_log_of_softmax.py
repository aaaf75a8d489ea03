"""TL502 `log-of-softmax`: the log of a softmax or sigmoid output, which underflows to -inf; the
safe fix rewrites it as `log_softmax` / `logsigmoid`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts, Origin
from torchls.analysis.findings import Fix, Span
from torchls.analysis.queries.tensors import activation_input, activation_of
from torchls.analysis.registry import Hit, exemption, rule
from torchls.analysis.rules._edits import replace_node
from torchls.analysis.rules._numerics import _log_argument, _log_calls


@exemption("TL502", "neg_log_of_exp_log_probs.py")
def _exp_of_log_probabilities(facts: Facts, argument: ast.Call) -> bool:
    """The log is taken of an `exp()` (`torch.log(log_p.exp())`, `log_p` from `log_softmax`):
    the probabilities were computed in log space already, and `log_softmax` / `logsigmoid`
    is not what would replace the expression."""
    return facts.method_name(argument) == "exp"


def _functional_alias(facts: Facts) -> str:
    for alias, target in facts.imports.items():
        if target == "torch.nn.functional":
            return alias
    return f"{facts.torch_alias or 'torch'}.nn.functional"


def _log_of_activation_fix(
    facts: Facts, log_call: ast.Call, inner: ast.Call, kind: str
) -> Fix | None:
    if kind == "softmax":
        func_text = facts.source.segment(inner.func)
        if (
            not func_text.endswith("softmax")
            or facts.call_qualname(inner) == "torch.special.softmax"
        ):
            return None
        arguments = (
            facts.source.text_of(_arguments_span(facts, inner))
            if inner.args or inner.keywords
            else ""
        )
        replacement = f"{func_text[: -len('softmax')]}log_softmax({arguments})"
        return Fix("safe", "Use log_softmax", (replace_node(facts, log_call, replacement),))
    if kind == "sigmoid":
        tensor = activation_input(facts, inner)
        if tensor is None:
            return None
        replacement = f"{_functional_alias(facts)}.logsigmoid({facts.source.segment(tensor)})"
        return Fix("safe", "Use logsigmoid", (replace_node(facts, log_call, replacement),))
    return None


def _arguments_span(facts: Facts, call: ast.Call) -> Span:
    nodes = [*call.args, *call.keywords]
    first = min(nodes, key=lambda n: (n.lineno, n.col_offset))
    last = max(nodes, key=lambda n: (n.end_lineno or 0, n.end_col_offset or 0))
    start = facts.source.span(first).start
    end = facts.source.span(last).end
    return Span(start, end)


@rule(
    "TL502",
    "log-of-softmax",
    "W",
    "log(softmax(x)) or log(sigmoid(x)) instead of log_softmax / logsigmoid",
    fix="safe",
)
def log_of_softmax(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    The log taken directly of a softmax or sigmoid output: `torch.log(F.softmax(x))`,
    `F.softmax(x).log()`, `torch.log(torch.sigmoid(x))`.

    ## Why it is wrong
    Softmax and sigmoid underflow to exactly 0 for very negative inputs, and `log(0)` is
    `-inf`: the loss becomes infinite and the gradients NaN. `log_softmax` and `logsigmoid`
    compute the same values in one numerically stable step.

    ## Example
    ```python
    log_probs = torch.log(F.softmax(logits, dim=-1))     # TL502
    ```

    ## Fix
    `F.log_softmax(logits, dim=-1)` / `F.logsigmoid(x)`. The fix is safe.
    """
    for call in _log_calls(facts):
        argument = _log_argument(facts, call)
        if not isinstance(argument, ast.Call):
            continue
        kind = activation_of(facts, Origin(argument))
        if kind not in ("softmax", "sigmoid") or _exp_of_log_probabilities(facts, argument):
            continue
        better = "log_softmax" if kind == "softmax" else "logsigmoid"
        yield Hit(
            call,
            f"log of a {kind} (`{facts.source.segment(argument)[:40]}`) underflows to -inf; use "
            f"`{better}`",
            _log_of_activation_fix(facts, call, argument, kind),
        )
