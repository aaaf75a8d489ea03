"""TL602 `keras-logits-without-from-logits`: a Keras cross-entropy left at `from_logits=False`
on a model whose output layer has no activation, so logits are read as probabilities.

In: the file's `Facts`; the models, heads and losses come from `torchls.analysis.keras`.
Out: one hit per loss object, with an unsafe fix that passes `from_logits=True` and the output
layer as related information.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis import keras as k
from torchls.analysis.facts import Facts
from torchls.analysis.findings import Fix, Related
from torchls.analysis.registry import Hit, rule
from torchls.analysis.rules._edits import replace_node
from torchls.analysis.rules._keras import _add_keyword, _describe_head, _line, _loss_uses


def _from_logits_fix(facts: Facts, loss: k.KerasLoss) -> Fix | None:
    node = loss.node
    if loss.style == "class" and isinstance(node, ast.Call) and loss.flag is None:
        edit = _add_keyword(facts, node, "from_logits=True")
    elif loss.style == "class" and loss.flag is not None:
        edit = replace_node(facts, loss.flag.value, "True")
    elif loss.style == "string":
        spelled = k.loss_class_spelling(facts, loss.name)
        if spelled is None:
            return None
        edit = replace_node(facts, node, f"{spelled}(from_logits=True)")
    elif loss.style == "call" and isinstance(node, ast.Call):
        if loss.flag is not None:
            edit = replace_node(facts, loss.flag.value, "True")
        else:
            edit = _add_keyword(facts, node, "from_logits=True")
    else:
        return None
    return Fix("unsafe", "Pass `from_logits=True` (the model outputs raw logits)", (edit,))


@rule(
    "TL602",
    "keras-logits-without-from-logits",
    "E",
    "A Keras cross-entropy with from_logits=False on a model with no output activation",
    fix="unsafe",
)
def keras_logits_without_from_logits(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    `SparseCategoricalCrossentropy`, `CategoricalCrossentropy` or `BinaryCrossentropy` (the
    class with the default `from_logits=False`, or the string/function names such as
    `"sparse_categorical_crossentropy"`) given to `compile` or applied to the model's output,
    where the model's output layer has no activation (`Dense(10)`, `activation=None` or
    `"linear"`). Models whose last layer cannot be told are left alone.

    ## Why it is wrong
    With `from_logits=False` the loss takes its input as probabilities: Keras clips it to
    `[eps, 1 - eps]` and, for the categorical losses, rescales it to sum to one. Raw scores
    from a linear layer are not probabilities, so the loss measures the wrong thing, negative
    scores are clipped away with no gradient, and the model trains badly or not at all.

    ## Example
    ```python
    model = keras.Sequential([layers.Dense(64, activation="relu"), layers.Dense(10)])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")  # TL602
    ```

    ## Fix
    Tell the loss it receives logits: `keras.losses.SparseCategoricalCrossentropy(
    from_logits=True)` (the quick fix, unsafe because it changes the loss); or give the output
    layer a softmax (sigmoid for binary) activation.
    """
    if not k.uses_keras(facts):
        return
    reported: set[int] = set()  # a loss object used twice gets one finding (one fix)
    for loss, model, how in _loss_uses(facts):
        head = model.head
        if head is None or head.activation != "linear" or loss.from_logits is not False:
            continue
        if loss.name not in k.CROSS_ENTROPY_LOSSES or id(loss.node) in reported:
            continue
        reported.add(id(loss.node))
        spelled = facts.source.segment(loss.node) if loss.style != "class" else loss.name
        if loss.style == "call" and isinstance(loss.node, ast.Call):
            spelled = facts.source.segment(loss.node.func)
        yield Hit(
            loss.node,
            f"`{spelled}` ({how}, from_logits=False) on {_describe_head(model)}, whose output "
            f"layer (line {_line(head.layer)}) has no activation: it outputs logits, which the "
            "loss takes as probabilities; pass `from_logits=True`",
            _from_logits_fix(facts, loss),
            (Related(facts.source.span(head.layer), "output layer without activation"),),
        )
