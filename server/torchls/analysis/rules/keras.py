"""TL6xx: TensorFlow / Keras, the loss-target and mode contracts of tf.keras and Keras 3.

In: the file's `Facts`; the Keras questions (flavour, models and their output heads, losses,
GradientTape regions) are answered by `torchls.analysis.keras`. Out: hits for a
`from_logits=True` loss on a softmax/sigmoid head (TL601), a cross-entropy with the default
`from_logits=False` on a linear head (TL602), a NumPy/`.numpy()`/`float()` step between the
model and the loss inside a GradientTape (TL603), a model with Dropout/BatchNormalization run
in the wrong mode by a custom step (TL604), and eager execution left on (TL605).

Nothing here imports tensorflow or keras: it is all read from the syntax tree.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import PurePath

from torchls.analysis import keras as k
from torchls.analysis.facts import Facts
from torchls.analysis.findings import Edit, Fix, Related, Span
from torchls.analysis.registry import Hit, rule
from torchls.analysis.rules._edits import insert_at, replace_node


# ---------------------------------------------------------------------- shared edits
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


def _add_keyword(facts: Facts, call: ast.Call, text: str) -> Edit:
    """Append `text` (`from_logits=True`) as the call's last argument."""
    arguments: list[ast.AST] = [*call.args, *call.keywords]
    if arguments:
        last = max(arguments, key=lambda a: (a.end_lineno, a.end_col_offset))  # type: ignore[attr-defined]
        end = facts.source.span(last).end
        return insert_at(end.row, end.column, f", {text}")
    end = facts.source.span(call).end
    return insert_at(end.row, end.column - 1, text)


def _line(node: ast.AST) -> int:
    return node.lineno  # type: ignore[attr-defined]


def _head_related(facts: Facts, model: k.KerasModel, what: str) -> tuple[Related, ...]:
    if model.head is None:
        return ()
    return (Related(facts.source.span(model.head.where), what),)


def _loss_uses(facts: Facts) -> Iterator[tuple[k.KerasLoss, k.KerasModel, str]]:
    """Every (loss, model, how): a `compile(loss=...)` and a loss applied by hand to a model's
    output in a custom step."""
    for call, model in k.compile_calls(facts):
        loss = k.compiled_loss(facts, call)
        if loss is not None:
            yield loss, model, "compiled"
    for _call, loss, model in k.loss_applications(facts):
        yield loss, model, "applied"


def _describe_head(model: k.KerasModel) -> str:
    kind = {
        "sequential": "Sequential model",
        "functional": "functional model",
        "subclass": "model subclass",
    }[model.style]
    return f"the {model.flavour} {kind} on line {_line(model.node)}"


# ---------------------------------------------------------------------- TL601
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


# ---------------------------------------------------------------------- TL602
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


# ---------------------------------------------------------------------- TL603
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


# ---------------------------------------------------------------------- TL604
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
    subclass), a call with `training=True`. An explicit `training=False` on the tape (frozen
    BatchNormalization when fine-tuning) and `training=flag` passed along are left alone.

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
        if not any(k.takes_weight_gradients(facts, g) for g in k.gradient_calls(facts, tape)):
            continue  # gradients for the inputs (saliency) want inference mode
        for call, model in k.model_calls_in(facts, tape.with_node):
            if not model.stochastic or k.training_flag(call) is not None:
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


# ---------------------------------------------------------------------- TL605
def _is_test_file(facts: Facts) -> bool:
    path = PurePath(facts.filename)
    return path.name.startswith("test_") or path.name.endswith("_test.py")


def _guarded(facts: Facts, node: ast.AST) -> bool:
    """Under an `if` (a `--debug` switch): deliberate, not left on by accident."""
    current = facts.parents.get(node)
    while current is not None:
        if isinstance(current, (ast.If, ast.IfExp)):
            return True
        current = facts.parents.get(current)
    return False


@rule(
    "TL605",
    "run-eagerly-left-on",
    "I",
    "compile(run_eagerly=True) / tf.config.run_functions_eagerly(True) left in training code",
    # "A script that trains" is a property of the whole file; without the call, nothing.
    whole_file=("run_eagerly", "run_functions_eagerly"),
)
def run_eagerly_left_on(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    `model.compile(..., run_eagerly=True)` on a Keras model built in the file, or
    `tf.config.run_functions_eagerly(True)`, in a script that trains (`fit`, a GradientTape,
    `apply_gradients`). Calls under an `if` (a debug switch) and test files are left alone.

    ## Why it is wrong
    Eager mode is a debugging aid: every step runs op by op in Python instead of as a compiled
    graph, typically several times slower, and `jit_compile` / XLA is off. Left on after the
    debugging session, it quietly makes every training run slow.

    ## Example
    ```python
    model.compile(optimizer="adam", loss="mse", run_eagerly=True)   # TL605
    model.fit(x_train, y_train, epochs=10)
    ```

    ## Fix
    Remove it (the default compiles the step), or put it behind a flag:
    `run_eagerly=args.debug`. No automatic fix.
    """
    if not k.uses_keras(facts) or _is_test_file(facts) or not k.trains(facts):
        return
    flavour = k.file_flavour(facts)
    for call in facts.method_calls("compile"):
        # `run_eagerly` is a Keras-only argument of compile: no need to know the model.
        flag = k.keyword(call, "run_eagerly")
        if flag is None or k.constant_of(flag.value) is not True or _guarded(facts, call):
            continue
        model = k.model_of(facts, facts.receiver(call))
        yield Hit(
            flag,
            f"`run_eagerly=True` in `compile` ({model.flavour if model else flavour}): every "
            "training step runs "
            "eagerly, op by op, which is much slower; remove it or put it behind a debug flag",
        )
    for call in facts.calls:
        if not k.is_tf_call(facts, call, "config.run_functions_eagerly"):
            continue
        if len(call.args) != 1 or k.constant_of(call.args[0]) is not True:
            continue
        if _guarded(facts, call):
            continue
        yield Hit(
            call,
            f"`{facts.source.segment(call)}` ({flavour}): every `tf.function`, the Keras train "
            "step included, runs eagerly, which is much slower; remove it or put it behind a "
            "debug flag",
        )
