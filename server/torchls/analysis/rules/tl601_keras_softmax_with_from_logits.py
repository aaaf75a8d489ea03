"""TL601 `keras-softmax-with-from-logits`: a `from_logits=True` Keras cross-entropy on a model
whose output layer already applies a softmax or a sigmoid, so it is applied twice.

In: the file's `Facts`; the models, heads and losses come from `torchls.analysis.keras`.
Out: one hit per loss object at its `from_logits` flag, with an unsafe fix that drops the flag
and the output activation as related information.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis import keras as k
from torchls.analysis.facts import Facts
from torchls.analysis.findings import Edit, Fix, Related, Span
from torchls.analysis.registry import Hit, rule
from torchls.analysis.rules._keras import _describe_head, _line, _loss_uses


def _remove_keyword(facts: Facts, call: ast.Call, kw: ast.keyword) -> Edit:
    """Delete `kw` and one comma next to it, leaving the call's other arguments as written."""
    arguments: list[ast.AST] = [*call.args, *call.keywords]
    arguments.sort(key=lambda a: (a.lineno, a.col_offset))  # type: ignore[attr-defined]
    index = arguments.index(kw)
    own = facts.source.span(kw)
    if index > 0:
        return Edit(Span(facts.source.span(arguments[index - 1]).end, own.end), "")
    if index + 1 < len(arguments):
        return Edit(Span(own.start, facts.source.span(arguments[index + 1]).start), "")
    return Edit(own, "")


def _head_related(facts: Facts, model: k.KerasModel, what: str) -> tuple[Related, ...]:
    if model.head is None:
        return ()
    return (Related(facts.source.span(model.head.where), what),)


@rule(
    "TL601",
    "keras-softmax-with-from-logits",
    "E",
    "A from_logits=True Keras loss on a model whose output is already softmax/sigmoid",
    fix="unsafe",
)
def keras_softmax_with_from_logits(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    A Keras cross-entropy loss (`SparseCategoricalCrossentropy`, `CategoricalCrossentropy`,
    `BinaryCrossentropy` and the focal variants) created with `from_logits=True`, given to
    `model.compile(loss=...)` or applied to the model's output in a custom step, where the
    model's output layer already applies a softmax or a sigmoid: `Dense(10,
    activation="softmax")`, a final `layers.Softmax()` / `layers.Activation("sigmoid")`, or a
    subclass whose `call` returns `tf.nn.softmax(...)`. Works for Sequential lists, `add()`
    chains, the functional API and subclasses, in tf.keras and Keras 3.

    ## Why it is wrong
    `from_logits=True` tells the loss that its input is unnormalised scores and makes it apply
    the softmax (or sigmoid) itself. Fed probabilities, it squashes them a second time: the loss
    still goes down, but its gradients are flattened, training is slow and the model ends up
    less confident and less accurate than it should be, with no error anywhere.

    ## Example
    ```python
    model = keras.Sequential([
        layers.Dense(64, activation="relu"),
        layers.Dense(10, activation="softmax"),
    ])
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),  # TL601
    )
    ```

    ## Fix
    Either drop `from_logits=True` (the loss then takes the probabilities the model outputs;
    this is the quick fix offered, unsafe because it changes the loss), or remove the output
    activation and keep `from_logits=True` (numerically better; apply the softmax when
    predicting). Pick one, never both.
    """
    if not k.uses_keras(facts):
        return
    reported: set[int] = set()  # a loss object used twice gets one finding (one fix)
    for loss, model, how in _loss_uses(facts):
        head = model.head
        if loss.from_logits is not True or loss.flag is None or head is None:
            continue
        if head.activation not in k.PROBABILITY_ACTIVATIONS or id(loss.node) in reported:
            continue
        reported.add(id(loss.node))
        fix = None
        if isinstance(loss.node, ast.Call):
            fix = Fix(
                "unsafe",
                "Drop `from_logits=True` (the model already outputs probabilities)",
                (_remove_keyword(facts, loss.node, loss.flag),),
            )
        yield Hit(
            loss.flag,
            f"`{loss.name}(from_logits=True)` is {how} on {_describe_head(model)}, whose output "
            f"already applies a {head.activation} (line {_line(head.where)}): the loss applies "
            f"it a second time; drop `from_logits=True`, or remove the output {head.activation}",
            fix,
            _head_related(facts, model, f"{head.activation} output activation"),
        )
