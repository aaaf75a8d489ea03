"""TL603 `tape-numpy-break`: inside a `tf.GradientTape`, the loss given to `tape.gradient` is
computed through `.numpy()`, a NumPy call or a Python number, which cuts the gradient.

In: the file's `Facts`; tapes, gradient calls and the break itself come from
`torchls.analysis.keras`. Out: one hit per break, with the `gradient` call as related information.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis import keras as k
from torchls.analysis.facts import Facts
from torchls.analysis.findings import Related
from torchls.analysis.registry import Hit, rule


def _describe_break(facts: Facts, call: ast.Call) -> str:
    if facts.method_name(call) == "numpy":
        return "`.numpy()`"
    qualname = facts.call_qualname(call) or ""
    if qualname.startswith("numpy."):
        return "a NumPy call"
    return "a Python number"


@rule(
    "TL603",
    "tape-numpy-break",
    "E",
    "Inside a GradientTape the loss goes through NumPy/.numpy()/float(): no gradient",
)
def tape_numpy_break(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    Inside `with tf.GradientTape() as tape:`, a loss given to `tape.gradient(...)` that is
    computed from the model's output (or a `tape.watch`ed tensor) through `.numpy()`, a NumPy
    function (`np.mean`, `np.log`, ...) or a Python `float()` / `int()` of a tensor.

    ## Why it is wrong
    The tape records TensorFlow operations only. A NumPy array or a Python number has no
    history, so the path from the weights to the loss is cut: `tape.gradient` returns `None`
    for every weight, and `optimizer.apply_gradients` then skips them (with a warning at best),
    so the model never learns. In a `tf.function` `.numpy()` fails outright.

    ## Example
    ```python
    with tf.GradientTape() as tape:
        logits = model(images, training=True)
        probs = np.exp(logits.numpy())        # TL603
        loss = tf.reduce_mean(-np.log(probs[range(len(labels)), labels]))
    grads = tape.gradient(loss, model.trainable_variables)   # all None
    ```

    ## Fix
    Use TensorFlow operations on the tape (`tf.exp`, `tf.reduce_mean`, `keras.ops.*`, the Keras
    losses); convert to NumPy only for metrics and logging, after `tape.gradient`. No automatic
    fix.
    """
    if not k.uses_keras(facts):
        return
    flavour = k.file_flavour(facts)
    reported: set[int] = set()
    for tape in k.tapes(facts):
        for gradient in k.gradient_calls(facts, tape):
            broken = k.tape_break(facts, tape, gradient.args[0])
            if broken is None or id(broken) in reported:
                continue
            reported.add(id(broken))
            target = facts.source.segment(gradient.args[0])
            yield Hit(
                broken,
                f"`{facts.source.segment(broken)}` takes the value out of TensorFlow "
                f"({_describe_break(facts, broken)}) on the way to `{target}` inside the "
                f"GradientTape ({flavour}): `{tape.name}.gradient` returns None for the "
                "weights; use TensorFlow ops on the tape",
                related=(Related(facts.source.span(gradient), "gradient taken here"),),
            )
