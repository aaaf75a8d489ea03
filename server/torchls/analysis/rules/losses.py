"""TL1xx: loss and target contracts (what goes into cross-entropy, BCE and friends)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from torchls.analysis.facts import Facts, LossCall, Origin
from torchls.analysis.findings import Fix, Related
from torchls.analysis.losses import loss_related
from torchls.analysis.queries.tensors import activation_input, activation_of, float_cast
from torchls.analysis.registry import Hit, rule
from torchls.analysis.rules._edits import insert_at, replace_node
from torchls.records import replace


def all_activated(facts: Facts, expr: ast.expr, accepted: set[str]) -> list[Origin] | None:
    """The origins of `expr` when every one of them is an activation in `accepted`; or, when
    an `if` chooses where the value comes from (`model = A()` / `model = B()`), the origins
    of a choice whose every origin is one: that path feeds the loss an activation."""
    origins = facts.origins(expr)
    if not origins:
        return None
    activated = [activation_of(facts, origin) in accepted for origin in origins]
    if all(activated):
        return [replace(origin, branch=None) for origin in origins]  # every path: no choice
    if not any(activated) or any(origin.branch is None for origin in origins):
        return None
    choices: dict[int, list[tuple[Origin, bool]]] = {}
    for origin, is_activated in zip(origins, activated, strict=True):
        choices.setdefault(id(origin.branch), []).append((origin, is_activated))
    for choice in choices.values():
        if all(is_activated for _, is_activated in choice):
            return [origin for origin, _ in choice]
    return None


def describe(facts: Facts, argument: ast.AST, origin: Origin) -> str:
    """`probs` (from `F.softmax(logits, dim=1)` on line 11), or just the argument when it is
    the activation itself."""
    if origin.node is argument:
        return f"`{_short(facts, argument)}`"
    owner = facts.owner(origin)
    where = f"on line {origin.node.lineno}"
    if owner is not facts:
        where = f"in {Path(owner.filename).name}, line {origin.node.lineno}"
    if origin.branch is not None:
        where += f", on the path through line {origin.branch.lineno}"  # type: ignore[attr-defined]
    return f"`{_short(facts, argument)}` (from `{_short(owner, origin.node)}` {where})"


def related_for(facts: Facts, origins: list[Origin], what: str) -> tuple[Related, ...]:
    related = []
    for origin in origins:
        owner = facts.owner(origin)
        filename = owner.filename if owner is not facts else None
        related.append(Related(owner.source.span(origin.node), f"{what} applied here", filename))
    return tuple(related)


def _unchanged_between(facts: Facts, name: str, scope: ast.AST, start: int, end: int) -> bool:
    return not any(
        start < a.stmt.lineno <= end
        for a in facts.assignments_of(name, scope)  # type: ignore[arg-type]
    )


def pass_logits_fix(
    facts: Facts, argument: ast.expr, origins: list[Origin], what: str
) -> Fix | None:
    """Replace the activated argument with the tensor the activation was applied to, when the
    activation is local: the argument itself, or a local variable assigned from it whose input
    is a name not rebound since."""
    if len(origins) != 1 or origins[0].module_output or origins[0].facts is not None:
        return None
    if origins[0].branch is not None:
        return None  # another path feeds the logits: the activation is that path's choice
    activation = origins[0].node
    if not isinstance(activation, ast.Call):
        return None
    logits = activation_input(facts, activation)
    if logits is None:
        return None
    if activation is argument:
        return Fix(
            "safe",
            f"Pass the logits instead of the {what} output",
            (replace_node(facts, argument, facts.source.segment(logits)),),
        )
    if not (isinstance(argument, ast.Name) and isinstance(logits, ast.Name)):
        return None
    assignment = facts.reaching_assignment(argument)
    if assignment is None or assignment.value is not activation:
        return None
    scope = facts.scope(argument)
    if facts.scope(activation) is not scope:
        return None
    if not _unchanged_between(facts, logits.id, scope, activation.lineno, argument.lineno):
        return None
    return Fix(
        "safe",
        f"Pass `{logits.id}` (the logits) instead of the {what} output",
        (replace_node(facts, argument, logits.id),),
    )


def _input_rule(
    facts: Facts, losses: set[str], accepted: set[str], what: str, fixable: bool
) -> Iterator[tuple[LossCall, list[Origin], Fix | None]]:
    for loss_call in facts.loss_calls:
        if loss_call.loss not in losses or loss_call.input is None:
            continue
        origins = all_activated(facts, loss_call.input, accepted)
        if origins is None:
            continue
        fix = pass_logits_fix(facts, loss_call.input, origins, what) if fixable else None
        yield loss_call, origins, fix


@rule(
    "TL101",
    "softmax-before-cross-entropy",
    "E",
    "Cross-entropy gets softmax output instead of logits",
    fix="safe",
)
def softmax_before_cross_entropy(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    The input of `nn.CrossEntropyLoss` / `F.cross_entropy` is already a softmax (or
    log-softmax, or `exp(log_softmax(...))`) output: directly, through local variables and
    shape-only methods (`.view()`, `.reshape()`, `.squeeze()`), through a helper's parameter
    (a cross-entropy wrapper, an `nn.Sequential` head passed to a custom module), or because
    the model's `forward` (or an `nn.Sequential`) ends in a softmax, also in another project
    file. A loss passed as a default argument counts; a loss name bound to different kinds on
    different paths (CTC in one branch, cross-entropy in the other) is not reported. When an
    `if` chooses the model or the tensor (`model = A()` / `model = B()`, a module-level choice
    read by the training function included), a choice that feeds a softmax is reported with
    the line of that choice; a softmax in `forward` under `if self.flag:`, with the flag a
    constructor parameter the model is built with set (or left by default) to a false
    constant, is a path that never runs and is not reported.

    ## Why it is wrong
    Cross-entropy applies `log_softmax` to its input itself. Feeding it probabilities squashes
    the logits twice: the loss stays high, gradients shrink, and training stalls or converges to
    a worse model without any error.

    ## Example
    ```python
    probs = F.softmax(model(x), dim=1)
    loss = F.cross_entropy(probs, y)      # TL101
    ```

    ## Fix
    Pass the raw logits: `loss = F.cross_entropy(model(x), y)`; keep the softmax only for
    metrics or inference. The fix is applied automatically when the softmax is local.
    """
    for loss_call, origins, fix in _input_rule(
        facts, {"CrossEntropyLoss"}, {"softmax", "log_softmax"}, "softmax", True
    ):
        yield Hit(
            loss_call.input,  # type: ignore[arg-type]
            f"{loss_call.loss} input {describe(facts, loss_call.input, origins[0])} is already "
            "a softmax output; cross-entropy expects raw logits",
            fix,
            related_for(facts, origins, "softmax") + loss_related(facts, loss_call),
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
    also for a project loss module whose `forward` hands its input unchanged to
    `binary_cross_entropy_with_logits` (a focal loss).

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


SOFT_LABEL_HINT = re.compile(r"one_?hot|soft|smooth|mix|cutmix|prob|dist|teacher|lam", re.I)
INDEX_NAME = re.compile(
    r"^(y|ys|yb|y_batch|labels?|targets?|tgt|gt|cls|classes|class_ids?|y_true|"
    r".+_labels?|.+_targets?|labels?_.+|targets?_.+)$",
    re.I,
)


def is_class_index_source(facts: Facts, expr: ast.expr) -> bool:
    """True when every origin of `expr` looks like class indices straight from the data: a
    loop target or an item of a batch, with no sign of soft labels on the way."""
    origins = facts.origins(expr)
    if not origins:
        return False
    for origin in origins:
        if origin.facts is not None or not all(facts.owns(n) for n in origin.via):
            return False
        text = " ".join(facts.source.segment(n) for n in (origin.node, *origin.via))
        if SOFT_LABEL_HINT.search(text):
            return False
        node = origin.node
        if isinstance(node, ast.Name):
            assignment = facts.reaching_assignment(node)
            if assignment is not None and assignment.loop is not None:
                if not INDEX_NAME.match(node.id):
                    return False
                continue
            if assignment is None and INDEX_NAME.match(node.id):
                continue
            return False
        if isinstance(node, ast.Subscript):
            key = node.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                if INDEX_NAME.match(key.value):
                    continue
            return False
        if isinstance(node, ast.Call) and facts.method_name(node) == "long":
            continue
        return False
    return True


@rule(
    "TL106",
    "class-targets-cast-to-float",
    "E",
    "Class-index targets cast to float before cross-entropy / NLL",
    fix="safe",
)
def class_targets_cast_to_float(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    Integer class-index targets converted with `.float()`, `.double()`, `.half()` or
    `.to(torch.float32)` right before `CrossEntropyLoss` / `NLLLoss`.

    ## Why it is wrong
    With a float target, `CrossEntropyLoss` switches to its soft-label mode and expects a
    `[N, C]` probability tensor: a `[N]` float target raises a shape error at best; with
    `NLLLoss` it fails outright. Class indices must stay `int64`. Soft labels built from
    `one_hot`, mixup or label smoothing are float on purpose and are not reported.

    ## Example
    ```python
    for x, y in loader:
        loss = criterion(model(x), y.float())   # TL106
    ```

    ## Fix
    Drop the cast, or use `.long()`. The fix replaces the cast with `.long()`.
    """
    for loss_call in facts.loss_calls:
        if loss_call.loss not in ("CrossEntropyLoss", "NLLLoss") or loss_call.target is None:
            continue
        target = loss_call.target
        cast = float_cast(facts, target)
        if cast is None and isinstance(target, ast.Name):
            assignment = facts.reaching_assignment(target)
            if assignment is not None and assignment.index is None and assignment.loop is None:
                cast = float_cast(facts, assignment.value) if assignment.value else None
        if cast is None or not is_class_index_source(facts, facts.receiver(cast)):  # type: ignore[arg-type]
            continue
        receiver = facts.receiver(cast)
        fix = Fix(
            "safe",
            "Keep class indices as int64 (`.long()`)",
            (replace_node(facts, cast, f"{facts.source.segment(receiver)}.long()"),),  # type: ignore[arg-type]
        )
        yield Hit(
            cast,
            f"class-index target `{_short(facts, receiver)}` is cast to float before "
            f"{loss_call.loss}; class indices must stay int64",
            fix,
        )


def _short(facts: Facts, node: ast.AST | None) -> str:
    if node is None:
        return "?"
    text = facts.source.segment(node).splitlines()[0]
    return text if len(text) <= 40 else text[:37] + "..."


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
    layer (logits), instead of log-probabilities.

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


SOFTMAX_NEEDING_DIM = {
    "torch.nn.functional.softmax",
    "torch.nn.functional.log_softmax",
    "torch.nn.functional.softmin",
    "torch.nn.Softmax",
    "torch.nn.LogSoftmax",
    "torch.nn.Softmin",
}


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
