"""TL604 `keras-training-flag`: a custom Keras step calls a model with Dropout or
BatchNormalization in the wrong mode (no `training=True` on the tape, `training=True` when
evaluating).

In: the file's `Facts`; tapes, model calls and evaluation methods come from
`torchls.analysis.keras`. Out: one hit per call, with an unsafe fix that adds or flips `training=`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis import keras as k
from torchls.analysis.facts import Facts
from torchls.analysis.findings import Fix
from torchls.analysis.registry import Hit, exemption, rule
from torchls.analysis.rules._edits import replace_node
from torchls.analysis.rules._keras import _add_keyword


def _stochastic_names(facts: Facts, model: k.KerasModel) -> str:
    names = sorted({k.keras_short(facts, c.func) or "" for c in model.stochastic})
    return "/".join(names)


def _flag_fix(facts: Facts, call: ast.Call, value: bool) -> Fix:
    flag = k.keyword(call, "training")
    text = "True" if value else "False"
    if flag is None:
        edit = _add_keyword(facts, call, f"training={text}")
    else:
        edit = replace_node(facts, flag.value, text)
    return Fix("unsafe", f"Call the model with `training={text}`", (edit,))


@exemption("TL604", "neg_input_gradients.py")
def _gradients_for_inputs_only(facts: Facts, tape: k.Tape) -> bool:
    """No gradient the tape takes is for the model's weights: gradients for the inputs
    (a saliency map) want the model in inference mode."""
    return not any(k.takes_weight_gradients(facts, g) for g in k.gradient_calls(facts, tape))


@exemption("TL604", "neg_frozen_batchnorm_finetune.py")
@exemption("TL604", "neg_flags_explicit.py")
def _training_flag_given(call: ast.Call) -> bool:
    """The model call on the tape passes `training=` itself: `training=False` to keep a
    frozen BatchNormalization in inference mode when fine-tuning, or a flag passed along."""
    return k.training_flag(call) is not None


@rule(
    "TL604",
    "keras-training-flag",
    "W",
    "Custom Keras step calls a Dropout/BatchNorm model without training=True (or eval with it)",
    fix="unsafe",
)
def keras_training_flag(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    In a custom training step (a model call inside `with tf.GradientTape():` whose gradients are
    taken), a call of a model that contains `Dropout` or `BatchNormalization` with no
    `training=` argument; and in an evaluation step (`test_step` / `predict_step` of a `Model`
    subclass), a call with `training=True`.

    ## Why it is wrong
    `fit()` sets the training phase for you; a hand-written loop does not. Called without
    `training=True`, a model outside `fit` runs in inference mode: Dropout does nothing and
    BatchNormalization normalises with its moving statistics and never updates them, so the
    model trains without regularisation and its statistics stay at their initial values. The
    reverse, `training=True` when evaluating, drops units at random and normalises with the
    batch's statistics, so the metrics are noisy and wrong.

    ## Example
    ```python
    with tf.GradientTape() as tape:
        logits = model(images)                 # TL604: Dropout is off here
        loss = loss_fn(labels, logits)
    grads = tape.gradient(loss, model.trainable_variables)
    ```

    ## Fix
    Pass `training=True` in the training step and `training=False` (or nothing) when
    evaluating; the quick fix adds or flips the argument (unsafe: it changes what runs).
    """
    if not k.uses_keras(facts):
        return
    for tape in k.tapes(facts):
        if _gradients_for_inputs_only(facts, tape):
            continue
        for call, model in k.model_calls_in(facts, tape.with_node):
            if not model.stochastic or _training_flag_given(call):
                continue
            yield Hit(
                call,
                f"`{facts.source.segment(call)}` in a custom training step without "
                f"`training=True`: called directly, the {model.flavour} model runs in "
                f"inference mode, with its {_stochastic_names(facts, model)} layers inactive",
                _flag_fix(facts, call, True),
            )
    for method in k.evaluation_methods(facts):
        for call, model in k.model_calls_in(facts, method):
            if not model.stochastic or k.training_flag(call) is not True:
                continue
            yield Hit(
                call,
                f"`{facts.source.segment(call)}` in `{method.name}` with `training=True`: "
                f"the {_stochastic_names(facts, model)} layers of the {model.flavour} model run "
                "as in training, so evaluation is noisy and wrong; use `training=False`",
                _flag_fix(facts, call, False),
            )
