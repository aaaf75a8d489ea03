"""TL107 `softmax-without-dim`: softmax / log_softmax / softmin calls and modules built
without an explicit `dim`; the unsafe fix adds `dim=-1`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.findings import Fix
from torchls.analysis.registry import Hit, exemption, rule
from torchls.analysis.rules._edits import insert_at
from torchls.analysis.rules._losses import _short

SOFTMAX_NEEDING_DIM = {
    "torch.nn.functional.softmax",
    "torch.nn.functional.log_softmax",
    "torch.nn.functional.softmin",
    "torch.nn.Softmax",
    "torch.nn.LogSoftmax",
    "torch.nn.Softmin",
}


@exemption("TL107", "neg_unused_softmax_attribute.py")
def _never_called(facts: Facts, constructor: ast.Call) -> bool:
    """The module built by `constructor` is stored in `self.<name>` (or a name) that nothing
    in its class or scope ever reads again."""
    statement = facts.parents.get(constructor)
    if not isinstance(statement, ast.Assign) or len(statement.targets) != 1:
        return False
    target = statement.targets[0]
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
        klass = facts.enclosing_class(constructor)
        if klass is None or target.value.id != "self":
            return False
        reads = [
            node
            for node in ast.walk(klass)
            if isinstance(node, ast.Attribute)
            and node.attr == target.attr
            and isinstance(node.ctx, ast.Load)
        ]
        # `getattr(self, name)` may read it under a computed name.
        return not reads and not any(
            isinstance(node, ast.Name) and node.id == "getattr" for node in ast.walk(klass)
        )
    return False


@rule(
    "TL107",
    "softmax-without-dim",
    "W",
    "softmax / log_softmax / nn.Softmax without an explicit dim",
    fix="unsafe",
)
def softmax_without_dim(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    `F.softmax(x)`, `F.log_softmax(x)`, `nn.Softmax()` or `nn.LogSoftmax()` called without
    `dim`. A module stored in `self.<name>` that its class never uses is not reported.

    ## Why it is wrong
    Without `dim`, PyTorch guesses: dim 0 for 0-, 1- and 3-dimensional inputs, dim 1 otherwise.
    For a `[C, H, W]` image or an unbatched sequence the normalisation runs over the wrong
    axis, silently. The implicit form is deprecated and warns at run time.

    ## Example
    ```python
    probs = F.softmax(logits)          # TL107
    ```

    ## Fix
    Name the axis: `F.softmax(logits, dim=-1)`. Offered as an unsafe fix: check that the last
    axis is the one you mean.
    """
    for call in facts.calls_to(*SOFTMAX_NEEDING_DIM):
        if any(k.arg in ("dim", None) for k in call.keywords):
            continue
        is_module = facts.short_name(call)[:1].isupper()
        if (not is_module and len(call.args) >= 2) or (is_module and call.args):
            continue
        if not is_module and not call.args:
            continue
        if is_module and _never_called(facts, call):
            continue  # `self.softmax = nn.Softmax()` that forward() never uses
        if is_module:
            position = facts.source.span(call).end
            edit_column = position.column - 1
            content = "dim=-1"
            if call.keywords:
                content = "dim=-1, "
                first = call.keywords[0]
                edit_row = first.lineno
                edit_column = facts.source.column(first.lineno, first.col_offset)
            else:
                edit_row = position.row
        else:
            last = call.args[-1]
            edit_row = last.end_lineno or call.lineno
            edit_column = facts.source.column(edit_row, last.end_col_offset or 0)
            content = ", dim=-1"
        yield Hit(
            call,
            f"`{_short(facts, call)}` has no `dim`: the implicit axis depends on the input's "
            "rank and is deprecated",
            Fix("unsafe", "Pass `dim=-1`", (insert_at(edit_row, edit_column, content),)),
        )
