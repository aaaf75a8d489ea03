"""TL605 `run-eagerly-left-on`: `compile(run_eagerly=True)` or
`tf.config.run_functions_eagerly(True)` left on, outside an `if`, in a script that trains.

In: the file's `Facts` (test files are skipped); what trains and what is Keras comes from
`torchls.analysis.keras`. Out: one hit per flag or call.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import PurePath

from torchls.analysis import keras as k
from torchls.analysis.facts import Facts
from torchls.analysis.registry import Hit, exemption, rule


def _is_test_file(facts: Facts) -> bool:
    path = PurePath(facts.filename)
    return path.name.startswith("test_") or path.name.endswith("_test.py")


@exemption("TL605", "neg_debug_flag.py")
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
