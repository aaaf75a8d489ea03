"""TensorFlow / Keras facts: the questions the TL6xx rules ask about tf.keras and Keras 3 code.

In: a file's `Facts` (imports, bindings, classes) and its syntax tree. Out: which names are
Keras or TensorFlow APIs and in which flavour (tf.keras or Keras 3), the Keras model an
expression holds and what its output layer applies (softmax, sigmoid, nothing, or unknown),
whether it contains Dropout/BatchNormalization, the loss a `compile` or a custom step uses and
its `from_logits` setting, and the `tf.GradientTape` regions of the file.

Everything is read from the syntax tree: tensorflow and keras are never imported, so the tests
run without them. Every question answers None when the code does not say for certain (a layer
built in a loop, a model loaded from disk, several outputs): the rules stay quiet then. Kept
apart from `facts.py` so the Keras questions live in one place and the torch facts stay
framework-neutral.
"""

from __future__ import annotations

import ast
import weakref
from collections.abc import Callable

from torchls.analysis.facts import Facts, FunctionNode
from torchls.analysis.registry import exemption
from torchls.records import field, record

MAX_STEPS = 60  # how far a value is followed back (layer chains, rebindings)

TF_KERAS = "tf.keras"
KERAS_3 = "Keras 3"

# Layers whose `activation=` argument (second positional for Dense) decides what they output.
ACTIVATED_LAYERS = {
    "Dense",
    "EinsumDense",
    "Conv1D",
    "Conv2D",
    "Conv3D",
    "Conv1DTranspose",
    "Conv2DTranspose",
    "Conv3DTranspose",
    "SeparableConv1D",
    "SeparableConv2D",
    "DepthwiseConv2D",
}
# Activation functions by qualified name, once the `tensorflow.keras.` / `keras.` / `tensorflow.`
# prefix is gone (see `keras_path`).
ACTIVATION_FUNCTIONS = {
    "activations.softmax": "softmax",
    "activations.sigmoid": "sigmoid",
    "activations.linear": "linear",
    "ops.softmax": "softmax",
    "ops.sigmoid": "sigmoid",
    "nn.softmax": "softmax",
    "nn.sigmoid": "sigmoid",
    "math.sigmoid": "sigmoid",
    "sigmoid": "sigmoid",
}
PROBABILITY_ACTIVATIONS = {"softmax", "sigmoid"}
# Losses that take `from_logits` (TL601) and those whose default False TL602 checks.
FROM_LOGITS_LOSSES = {
    "SparseCategoricalCrossentropy",
    "CategoricalCrossentropy",
    "BinaryCrossentropy",
    "BinaryFocalCrossentropy",
    "CategoricalFocalCrossentropy",
}
CROSS_ENTROPY_LOSSES = {
    "SparseCategoricalCrossentropy",
    "CategoricalCrossentropy",
    "BinaryCrossentropy",
}
# String and function names Keras resolves to those losses (always from_logits=False).
LOSS_NAMES = {
    "sparse_categorical_crossentropy": "SparseCategoricalCrossentropy",
    "categorical_crossentropy": "CategoricalCrossentropy",
    "binary_crossentropy": "BinaryCrossentropy",
    **{name: name for name in CROSS_ENTROPY_LOSSES},
}
SEQUENTIAL = {"Sequential", "models.Sequential"}
FUNCTIONAL = {"Model", "models.Model"}
STOCHASTIC_LAYERS = {
    "Dropout",
    "SpatialDropout1D",
    "SpatialDropout2D",
    "SpatialDropout3D",
    "GaussianDropout",
    "GaussianNoise",
    "AlphaDropout",
    "BatchNormalization",
}


# ---------------------------------------------------------------------- names and flavours
def keras_path(facts: Facts, expr: ast.AST | None) -> tuple[str, str] | None:
    """(`flavour`, path inside Keras) for a Keras name: `layers.Dense` in tf.keras for
    `tf.keras.layers.Dense`, in Keras 3 for `keras.layers.Dense`. TensorFlow's own names
    (`tf.nn.softmax`) come back as (`tf.keras`, `nn.softmax`) when the file uses tf.keras."""
    qualname = facts.qualname(expr)
    if qualname is None and isinstance(expr, ast.Name):
        qualname = _star_qualname(facts, expr.id)
    if qualname is None:
        return None
    if qualname.startswith("tensorflow.keras."):
        return TF_KERAS, _strip_src(qualname.removeprefix("tensorflow.keras."))
    if qualname.startswith("keras."):
        return file_flavour(facts) or KERAS_3, _strip_src(qualname.removeprefix("keras."))
    if qualname.startswith("tensorflow."):
        return file_flavour(facts) or TF_KERAS, qualname.removeprefix("tensorflow.")
    return None


# Layer classes a `from tensorflow.keras.layers import *` binds that the rules ask about (by
# their last name); and the model classes a `... .models import *` binds.
STAR_LAYERS = {
    *ACTIVATED_LAYERS,
    *STOCHASTIC_LAYERS,
    "Input",
    "InputLayer",
    "Softmax",
    "Activation",
    "Flatten",
    "Reshape",
    "Permute",
    "LSTM",
    "GRU",
    "SimpleRNN",
    "Bidirectional",
    "TimeDistributed",
    "Embedding",
    "Concatenate",
    "Add",
    "Multiply",
    "LayerNormalization",
    "MaxPooling1D",
    "MaxPooling2D",
    "MaxPooling3D",
    "AveragePooling1D",
    "AveragePooling2D",
    "AveragePooling3D",
    "GlobalAveragePooling1D",
    "GlobalAveragePooling2D",
    "GlobalMaxPooling1D",
    "GlobalMaxPooling2D",
    "ZeroPadding2D",
    "UpSampling2D",
}
STAR_MODULES = {
    "tensorflow.keras.layers": STAR_LAYERS,
    "keras.layers": STAR_LAYERS,
    "tensorflow.keras.models": {"Model", "Sequential"},
    "keras.models": {"Model", "Sequential"},
}
_BOUND: weakref.WeakKeyDictionary[Facts, set[str]] = weakref.WeakKeyDictionary()


def _star_qualname(facts: Facts, name: str) -> str | None:
    """`tensorflow.keras.layers.Dense` for a bare `Dense` that only a star import of a Keras
    module can bind: the file binds no `Dense` itself, and every star import it makes is of a
    Keras or TensorFlow module (an unread module's star import could bind any name), with
    exactly one of them binding the name."""
    if not facts.star_modules or any(
        not (m == "keras" or m.startswith(("keras.", "tensorflow"))) for m in facts.star_modules
    ):
        return None
    owners = {m for m in facts.star_modules if name in STAR_MODULES.get(m, ())}
    if len(owners) != 1 or name in _bound_names(facts):
        return None
    return f"{owners.pop()}.{name}"


def _bound_names(facts: Facts) -> set[str]:
    # Every name the file binds anywhere (assignment, loop target, def, class, parameter,
    # import, `global`): a bare name among them may not be the star-imported one.
    if facts not in _BOUND:
        bound: set[str] = set(facts.imports)
        for node in ast.walk(facts.tree):
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                bound.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(node.name)
            elif isinstance(node, ast.arg):
                bound.add(node.arg)
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                bound.update(node.names)
            elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
                bound.add(node.name)
        _BOUND[facts] = bound
    return _BOUND[facts]


def _strip_src(path: str) -> str:
    # `keras.src.layers.core.dense.Dense` and `layers.core.Dense` are the same `layers.Dense`.
    path = path.removeprefix("src.")
    parts = path.split(".")
    if parts[0] in ("layers", "losses", "activations", "models", "ops") and len(parts) > 2:
        return f"{parts[0]}.{parts[-1]}"
    return path


def keras_short(facts: Facts, expr: ast.AST | None) -> str | None:
    """The last component of a Keras name (`Dense` for `keras.layers.Dense`), else None."""
    found = keras_path(facts, expr)
    return found[1].rsplit(".", 1)[-1] if found else None


def file_flavour(facts: Facts) -> str | None:
    """`Keras 3` when the file imports `keras` itself, `tf.keras` when it imports Keras through
    TensorFlow (`tf.keras`, `from tensorflow import keras`), None when neither."""
    targets = set(facts.imports.values())
    if any(t == "keras" or t.startswith("keras.") for t in targets):
        return KERAS_3
    if any(t == "tensorflow" or t.startswith("tensorflow.") for t in targets):
        return TF_KERAS
    return None


def uses_keras(facts: Facts) -> bool:
    """The file imports TensorFlow or Keras at all (every TL6xx rule starts by asking)."""
    return file_flavour(facts) is not None


def loss_class_spelling(facts: Facts, name: str) -> str | None:
    """How this file can write the loss class `name`: the class itself when it is imported
    (`from keras.losses import BinaryCrossentropy`), else through the losses module."""
    for local, target in sorted(facts.imports.items()):
        if target in (f"keras.losses.{name}", f"tensorflow.keras.losses.{name}"):
            return local
    prefix = losses_prefix(facts)
    return f"{prefix}.{name}" if prefix is not None else None


def losses_prefix(facts: Facts) -> str | None:
    """How this file spells the Keras losses module, for fixes that add a loss class:
    `keras.losses`, `tf.keras.losses` or `losses`; None when it has no such name."""
    for local, target in sorted(facts.imports.items()):
        if target in ("tensorflow.keras.losses", "keras.losses"):
            return local
    for local, target in sorted(facts.imports.items()):
        if target in ("tensorflow.keras", "keras"):
            return f"{local}.losses"
    for local, target in sorted(facts.imports.items()):
        if target == "tensorflow":
            return f"{local}.keras.losses"
    return None


def is_tf_call(facts: Facts, call: ast.Call, path: str) -> bool:
    """`call` calls TensorFlow's `path` (`GradientTape`, `config.run_functions_eagerly`)."""
    return facts.call_qualname(call) == f"tensorflow.{path}"


def _is_builtin(facts: Facts, name: ast.expr, builtin: str) -> bool:
    return (
        isinstance(name, ast.Name)
        and name.id == builtin
        and name.id not in facts.imports
        and facts.reaching_assignment(name) is None
    )


def keyword(call: ast.Call, name: str) -> ast.keyword | None:
    return next((k for k in call.keywords if k.arg == name), None)


def constant_of(expr: ast.expr | None) -> object:
    """The literal value of `expr`, or the sentinel `UNKNOWN`."""
    if isinstance(expr, ast.Constant):
        return expr.value
    return UNKNOWN


UNKNOWN = object()


def resolve(facts: Facts, expr: ast.expr | None) -> ast.expr | None:
    """Follow a name or `self.attr` back to the one expression bound to it (a few hops)."""
    steps = 0
    seen: set[int] = set()
    while isinstance(expr, (ast.Name, ast.Attribute)) and steps < MAX_STEPS:
        if isinstance(expr, ast.Attribute) and not (
            isinstance(expr.value, ast.Name) and expr.value.id == "self"
        ):
            return expr
        value = facts.binding_value(expr)
        if value is None and isinstance(expr, ast.Name):
            # A parameter: the one argument every call site in the file passes for it.
            value = facts.argument_value(expr)
        if value is None or id(value) in seen:
            return expr
        seen.add(id(value))
        expr = value
        steps += 1
    return expr


# ---------------------------------------------------------------------- layers and models
@record(frozen=True)
class Head:
    """What a model's output layer applies: `activation` is "softmax", "sigmoid", "linear" (no
    activation), another name ("relu"), and `where` is the node that sets it (the
    `activation=` keyword, the `Softmax()` layer, the returned `tf.nn.softmax(...)`)."""

    activation: str
    where: ast.AST
    layer: ast.AST  # the layer constructor (or the returned call) the head is


@record
class KerasModel:
    """A Keras model built in this file: how (`sequential`, `functional`, `subclass`), where,
    its output head when it can be told, and whether it has Dropout/BatchNormalization."""

    style: str
    node: ast.AST
    flavour: str
    head: Head | None
    stochastic: list[ast.Call] = field(default_factory=list)
    # True when every layer is known (so "no Dropout" can be trusted); False for a model with
    # layers out of sight (a base model from `keras.applications`, a layer built elsewhere).
    layers_known: bool = True


def layer_activation(facts: Facts, call: ast.Call) -> Head | None:
    """The head a single layer constructor makes: `Dense(10, activation="softmax")`,
    `Softmax()`, `Activation("sigmoid")`; None for any other layer or an activation that
    is not a literal."""
    short = keras_short(facts, call.func)
    if short in ("Softmax",):
        return Head("softmax", call, call)
    if short == "Activation":
        value = call.args[0] if call.args else None
        kw = keyword(call, "activation")
        value = kw.value if kw is not None else value
        name = activation_name(facts, value)
        return Head(name, value or call, call) if name is not None else None
    if short in ACTIVATED_LAYERS:
        kw = keyword(call, "activation")
        value = kw.value if kw is not None else None
        if kw is None and short == "Dense" and len(call.args) > 1:
            value = call.args[1]
        if value is None:
            return Head("linear", call, call)
        name = activation_name(facts, value)
        if name is None:
            return None
        return Head(name, kw if kw is not None else value, call)
    return None


def activation_name(facts: Facts, value: ast.expr | None) -> str | None:
    """The activation's name: "softmax" for `"softmax"`, `keras.activations.softmax` or
    `tf.nn.softmax`; "linear" for None/"linear"; None when it cannot be told."""
    if value is None:
        return None
    literal = constant_of(value)
    if literal is None:
        return "linear"
    if isinstance(literal, str):
        return literal.lower()
    found = keras_path(facts, value)
    if found is not None:
        return ACTIVATION_FUNCTIONS.get(found[1])
    return None


def applied_activation(facts: Facts, call: ast.Call) -> Head | None:
    """The head of a function call that applies an activation to a tensor: `tf.nn.softmax(z)`,
    `keras.activations.sigmoid(z)`, `keras.ops.softmax(z)`."""
    found = keras_path(facts, call.func)
    if found is None:
        return None
    name = ACTIVATION_FUNCTIONS.get(found[1])
    return Head(name, call, call) if name in PROBABILITY_ACTIVATIONS else None


def _layer_constructor(facts: Facts, expr: ast.expr | None) -> ast.Call | None:
    """The Keras layer constructor call `expr` is (or is bound to)."""
    expr = resolve(facts, expr)
    if isinstance(expr, ast.Call):
        found = keras_path(facts, expr.func)
        if found is not None and found[1].startswith("layers."):
            return expr
    return None


def model_of(facts: Facts, expr: ast.expr | None) -> KerasModel | None:
    """The Keras model that `expr` holds, when it is built in this file (a `Sequential`, a
    functional `Model(inputs, outputs)` or an instance of an in-file `Model` subclass)."""
    return _model_of(facts, expr, 0)


def _model_of(facts: Facts, expr: ast.expr | None, depth: int) -> KerasModel | None:
    expr = resolve(facts, expr)
    if isinstance(expr, ast.Name) and expr.id == "self":
        klass = facts.enclosing_class(expr)
        return subclass_model(facts, klass) if klass is not None else None
    if not isinstance(expr, ast.Call):
        return None
    if facts.returns_receiver(expr):
        return None
    found = keras_path(facts, expr.func)
    if found is not None:
        flavour, path = found
        if path in SEQUENTIAL:
            return _sequential(facts, expr, flavour)
        if path in FUNCTIONAL:
            return _functional(facts, expr, flavour)
        return None
    if isinstance(expr.func, ast.Name) and expr.func.id in facts.classes:
        return subclass_model(facts, facts.classes[expr.func.id].node)
    if isinstance(expr.func, ast.Name) and expr.func.id in facts.functions and depth < 4:
        # A factory (`build_model()`): its one return statement says which model it builds.
        returns = facts.function_returns(expr)
        if returns is not None and len(returns) == 1 and returns[0][0] is facts:
            return _model_of(facts, returns[0][1], depth + 1)
    return None


def _sequential(facts: Facts, call: ast.Call, flavour: str) -> KerasModel | None:
    layers_arg = call.args[0] if call.args else None
    kw = keyword(call, "layers")
    layers_arg = kw.value if kw is not None else layers_arg
    layers_arg = resolve(facts, layers_arg) if layers_arg is not None else None
    if layers_arg is None:
        elements: list[ast.expr] = []
    elif isinstance(layers_arg, (ast.List, ast.Tuple)):
        elements = list(layers_arg.elts)
    else:
        return None
    elements.extend(_added_layers(facts, call))
    if any(isinstance(e, ast.Starred) for e in elements) or not elements:
        return None
    if _model_mutated(facts, call):
        return None
    constructors = [_layer_constructor(facts, e) for e in elements]
    last = constructors[-1]
    head = layer_activation(facts, last) if last is not None else None
    stochastic = [c for c in constructors if c is not None and _stochastic(facts, c)]
    known = all(c is not None for c in constructors)
    return KerasModel("sequential", call, flavour, head, stochastic, known)


def _model_statement(facts: Facts, call: ast.Call) -> tuple[ast.stmt, str] | None:
    """The `name = Sequential(...)` statement binding the model, and the name."""
    stmt = facts.parents.get(call)
    if (
        isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Name)
    ):
        return stmt, stmt.targets[0].id
    return None


def _uses(facts: Facts, call: ast.Call) -> list[ast.Name]:
    bound = _model_statement(facts, call)
    return facts.uses_of(*bound) if bound is not None else []


def _added_layers(facts: Facts, call: ast.Call) -> list[ast.expr]:
    """Layers appended with `model.add(layer)` on the name bound to the Sequential call."""
    added = []
    for use in _uses(facts, call):
        parent = facts.parents.get(use)
        if not isinstance(parent, ast.Attribute) or parent.attr != "add":
            continue
        outer = facts.parents.get(parent)
        if isinstance(outer, ast.Call) and outer.func is parent and len(outer.args) == 1:
            if facts.enclosing_loops(outer) or _conditional(facts, outer, call):
                added.append(ast.Starred())  # a layer added a number of times: unknown
            else:
                added.append(outer.args[0])
    added.sort(key=lambda e: (getattr(e, "lineno", 0), getattr(e, "col_offset", 0)))
    return added


def _conditional(facts: Facts, node: ast.AST, anchor: ast.AST) -> bool:
    """`node` sits under an `if`/`try` that does not also hold `anchor`."""
    current = facts.parents.get(node)
    while current is not None and not isinstance(current, (ast.FunctionDef, ast.Module)):
        if isinstance(current, (ast.If, ast.Try, ast.With)) and not facts.is_inside(
            anchor, current
        ):
            return True
        current = facts.parents.get(current)
    return False


@exemption("TL601", "neg_head_replaced_by_helper.py")
@exemption("TL602", "neg_head_replaced_by_helper.py")
def _model_mutated(facts: Facts, call: ast.Call) -> bool:
    """The Sequential's layers change after it is built (`model.pop()`, `model.layers`
    touched, or the model handed to an in-file function that adds or pops layers): the last
    layer listed is not known to be the output layer."""
    for use in _uses(facts, call):
        parent = facts.parents.get(use)
        if isinstance(parent, ast.Attribute) and parent.attr in ("pop", "layers"):
            return True
        if isinstance(parent, ast.keyword):
            parent = facts.parents.get(parent)
        if isinstance(parent, ast.Call) and parent.func is not use:
            called = facts.called_function(parent)
            if called is not None and _edits_parameter_layers(facts, called):
                return True
    return False


def _edits_parameter_layers(facts: Facts, function: FunctionNode) -> bool:
    args = function.args
    parameters = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
    for call in facts.calls_in(function):
        receiver = facts.receiver(call)
        if (
            facts.method_name(call) in ("add", "pop")
            and isinstance(receiver, ast.Name)
            and receiver.id in parameters
        ):
            return True
    return False


def _stochastic(facts: Facts, call: ast.Call) -> bool:
    return keras_short(facts, call.func) in STOCHASTIC_LAYERS


def _functional(facts: Facts, call: ast.Call, flavour: str) -> KerasModel | None:
    outputs = call.args[1] if len(call.args) > 1 else None
    kw = keyword(call, "outputs")
    outputs = kw.value if kw is not None else outputs
    if outputs is None:
        return None
    layers, head, known = _walk_graph(facts, outputs)
    stochastic = [c for c in layers if _stochastic(facts, c)]
    return KerasModel("functional", call, flavour, head, stochastic, known)


def _walk_graph(facts: Facts, output: ast.expr) -> tuple[list[ast.Call], Head | None, bool]:
    """Walk a functional graph back from `output`: the layer constructors on the way, the
    head (what produced `output` itself) and whether every step was understood."""
    layers: list[ast.Call] = []
    head: Head | None = None
    known = True
    todo: list[tuple[ast.expr, bool]] = [(output, True)]
    steps = 0
    while todo and steps < MAX_STEPS:
        steps += 1
        expr, is_output = todo.pop()
        value = resolve(facts, expr)
        if not isinstance(value, ast.Call):
            if is_output:
                return layers, None, False  # a list of outputs, a subscript: several heads
            known = known and isinstance(value, ast.Name)  # a parameter: an input tensor
            continue
        if keras_short(facts, value.func) == "Input":
            continue
        constructor = _layer_constructor(facts, value.func)
        if constructor is not None:
            layers.append(constructor)
            if is_output:
                head = layer_activation(facts, constructor)
            todo.extend((a, False) for a in value.args)
            continue
        if is_output:
            head = applied_activation(facts, value)
            if head is not None:
                todo.extend((a, False) for a in value.args)
                continue
        known = False
        if is_output:
            return layers, None, False
    return layers, head, known and not todo


# Per-file memo of the subclass models (several rules ask about the same class); weak so a
# file's facts and their models go away together when an editor drops the version.
_SUBCLASSES: weakref.WeakKeyDictionary[Facts, dict[ast.ClassDef, KerasModel | None]] = (
    weakref.WeakKeyDictionary()
)


def subclass_model(facts: Facts, klass: ast.ClassDef) -> KerasModel | None:
    """The model an in-file `keras.Model` subclass builds: its head is what every `return` of
    `call` produces; its layers are the Keras layers bound to `self.<attr>` in the class."""
    memo = _SUBCLASSES.setdefault(facts, {})
    if klass not in memo:
        memo[klass] = None  # a class that refers to itself resolves to "unknown"
        memo[klass] = _subclass(facts, klass)
    return memo[klass]


def _subclass(facts: Facts, klass: ast.ClassDef) -> KerasModel | None:
    info = facts.classes.get(klass.name)
    if info is None:
        return None
    flavour = None
    for base in klass.bases:
        found = keras_path(facts, base)
        if found is not None and found[1] in FUNCTIONAL:
            flavour = found[0]
    if flavour is None:
        return None
    layers: list[ast.Call] = []
    known = True
    for values in info.attributes.values():
        for value in values:
            constructor = _layer_constructor(facts, value)
            if constructor is not None:
                layers.append(constructor)
                continue
            nested = _model_of(facts, value, MAX_STEPS) if isinstance(value, ast.Call) else None
            if nested is not None:
                layers.extend(nested.stochastic)
                known = known and nested.layers_known
            elif isinstance(value, ast.Call):
                known = False
    call_method = info.methods.get("call")
    head = _call_head(facts, call_method) if call_method is not None else None
    stochastic = [c for c in layers if _stochastic(facts, c)]
    return KerasModel("subclass", klass, flavour, head, stochastic, known)


def _call_head(facts: Facts, method: FunctionNode) -> Head | None:
    heads = []
    for node in facts.walk_local(method):
        if isinstance(node, ast.Return):
            if node.value is None:
                return None
            head = _returned_head(facts, node.value)
            if head is None:
                return None
            heads.append(head)
    if not heads or len({h.activation for h in heads}) != 1:
        return None
    return heads[0]


def _returned_head(facts: Facts, value: ast.expr) -> Head | None:
    value = resolve(facts, value)
    if not isinstance(value, ast.Call):
        return None
    head = applied_activation(facts, value)
    if head is not None:
        return head
    constructor = _layer_constructor(facts, value.func)
    return layer_activation(facts, constructor) if constructor is not None else None


# ---------------------------------------------------------------------- losses
@record(frozen=True)
class KerasLoss:
    """A Keras cross-entropy loss: its class name, its `from_logits` (True/False; None when it
    is not a literal), the node naming it and the `from_logits=` keyword when written."""

    name: str
    from_logits: bool | None
    node: ast.expr
    flag: ast.keyword | None
    style: str  # "class", "string" or "function"


def loss_of(facts: Facts, expr: ast.expr | None) -> KerasLoss | None:
    """The Keras loss `expr` is or holds: `SparseCategoricalCrossentropy(from_logits=True)`,
    `"sparse_categorical_crossentropy"`, `keras.losses.binary_crossentropy`."""
    if expr is None:
        return None
    value = resolve(facts, expr)
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        name = LOSS_NAMES.get(value.value)
        return KerasLoss(name, False, value, None, "string") if name else None
    if isinstance(value, ast.Call):
        found = keras_path(facts, value.func)
        if found is None or not found[1].startswith("losses."):
            return None
        short = found[1].rsplit(".", 1)[-1]
        if short not in FROM_LOGITS_LOSSES:
            return None
        flag = keyword(value, "from_logits")
        if any(k.arg is None for k in value.keywords) or (flag is None and value.args):
            return None  # **kwargs, or from_logits passed positionally
        setting = constant_of(flag.value) if flag is not None else False
        if not isinstance(setting, bool):
            return None
        return KerasLoss(short, setting, value, flag, "class")
    found = keras_path(facts, value)
    if found is not None and found[1].startswith(("losses.", "metrics.")):
        short = found[1].rsplit(".", 1)[-1]
        name = LOSS_NAMES.get(short)
        if name is not None and short != name:
            return KerasLoss(name, False, value, None, "function")
    return None


def compile_calls(facts: Facts) -> list[tuple[ast.Call, KerasModel]]:
    """`model.compile(...)` calls on a Keras model built in this file."""
    found = []
    for call in facts.method_calls("compile"):
        model = model_of(facts, facts.receiver(call))
        if model is not None:
            found.append((call, model))
    return found


def compiled_loss(facts: Facts, call: ast.Call) -> KerasLoss | None:
    """The single loss given to `compile` (keyword `loss=` or the second positional)."""
    kw = keyword(call, "loss")
    value = kw.value if kw is not None else (call.args[1] if len(call.args) > 1 else None)
    return loss_of(facts, value)


def loss_applications(facts: Facts) -> list[tuple[ast.Call, KerasLoss, KerasModel]]:
    """Losses applied by hand in a custom step: `loss_fn(y, model(x))` or
    `keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)`, where the
    prediction comes from a call of a Keras model built in this file."""
    found = []
    for call in facts.calls:
        if len(call.args) < 2:
            continue
        direct = keras_path(facts, call.func)
        loss: KerasLoss | None
        if direct is not None and direct[1].startswith("losses."):
            short = direct[1].rsplit(".", 1)[-1]
            name = LOSS_NAMES.get(short)
            if name is None or short == name:
                continue
            flag = keyword(call, "from_logits")
            setting = constant_of(flag.value) if flag is not None else False
            if not isinstance(setting, bool) or len(call.args) > 2:
                continue
            loss = KerasLoss(name, setting, call, flag, "call")
        else:
            loss = (
                loss_of(facts, call.func)
                if isinstance(call.func, (ast.Name, ast.Attribute))
                else None
            )
            if loss is None or loss.style != "class":
                continue
        model = prediction_model(facts, call.args[1])
        if model is not None:
            found.append((call, loss, model))
    return found


def prediction_model(facts: Facts, expr: ast.expr) -> KerasModel | None:
    """The Keras model whose direct output `expr` is (`model(x, training=True)`)."""
    value = resolve(facts, expr)
    if isinstance(value, ast.Call) and not isinstance(value.func, ast.Call):
        return model_of(facts, value.func)
    return None


# ---------------------------------------------------------------------- gradient tapes
@record(frozen=True)
class Tape:
    """One `with tf.GradientTape() as tape:` block and the tape's name."""

    with_node: ast.With
    name: str


def tapes(facts: Facts) -> list[Tape]:
    found = []
    for node in facts.parents:
        if not isinstance(node, ast.With):
            continue
        for item in node.items:
            context = item.context_expr
            if (
                isinstance(context, ast.Call)
                and is_tf_call(facts, context, "GradientTape")
                and isinstance(item.optional_vars, ast.Name)
            ):
                found.append(Tape(node, item.optional_vars.id))
    return sorted(found, key=lambda t: (t.with_node.lineno, t.with_node.col_offset))


def model_calls_in(facts: Facts, node: ast.AST) -> list[tuple[ast.Call, KerasModel]]:
    """Calls of Keras models (built in this file, or `self` in a Model subclass) under `node`."""
    found = []
    for call in facts.calls_in(node):
        if isinstance(call.func, (ast.Name, ast.Attribute)) and not _is_method_call(call):
            model = model_of(facts, call.func)
            if model is not None:
                found.append((call, model))
    return found


def _is_method_call(call: ast.Call) -> bool:
    # `model.fit(...)`, `self.add_loss(...)`: a method of the model, not a forward call; only
    # `self.<attr>(...)` can be a sub-model call.
    func = call.func
    return isinstance(func, ast.Attribute) and not (
        isinstance(func.value, ast.Name) and func.value.id == "self"
    )


def breaks_tape(facts: Facts, call: ast.Call) -> ast.expr | None:
    """The tensor argument a call takes out of TensorFlow (`t.numpy()`, `np.mean(t)`,
    `float(t)`), or None when the call keeps the value on the tape."""
    if facts.method_name(call) == "numpy" and not call.args:
        return facts.receiver(call)
    qualname = facts.call_qualname(call) or ""
    if qualname.split(".")[0] == "numpy" and call.args:
        return call.args[0]
    if len(call.args) == 1 and any(_is_builtin(facts, call.func, b) for b in ("float", "int")):
        return call.args[0]
    return None


def tape_sources(facts: Facts, tape: Tape) -> list[ast.AST]:
    """What the tape records gradients for inside its block: the model calls and the tensors
    given to `tape.watch`."""
    sources: list[ast.AST] = [call for call, _ in model_calls_in(facts, tape.with_node)]
    for call in facts.calls_in(tape.with_node):
        receiver = facts.receiver(call)
        if (
            facts.method_name(call) == "watch"
            and isinstance(receiver, ast.Name)
            and receiver.id == tape.name
            and call.args
        ):
            sources.append(call.args[0])
    return sources


VARIABLE_ATTRIBUTES = {"trainable_variables", "trainable_weights", "variables", "weights"}


def takes_weight_gradients(facts: Facts, gradient: ast.Call) -> bool:
    """`tape.gradient(loss, <model>.trainable_variables)` (directly or through a name): the
    gradients are for the weights, so this is a training step (not a saliency map)."""
    sources = gradient.args[1] if len(gradient.args) > 1 else None
    kw = keyword(gradient, "sources")
    sources = kw.value if kw is not None else sources
    if sources is None:
        return False
    todo: list[ast.AST] = [sources]
    steps = 0
    while todo and steps < MAX_STEPS:
        steps += 1
        node = todo.pop()
        if isinstance(node, ast.Attribute) and node.attr in VARIABLE_ATTRIBUTES:
            return True
        if isinstance(node, ast.Name):
            value = facts.binding_value(node)
            if value is not None:
                todo.append(value)
            continue
        if isinstance(node, (ast.BinOp, ast.List, ast.Tuple, ast.Call, ast.Starred)):
            todo.extend(ast.iter_child_nodes(node))
    return False


def gradient_calls(facts: Facts, tape: Tape) -> list[ast.Call]:
    """`tape.gradient(target, sources)` calls for this tape, in its function."""
    found = []
    for call in facts.method_calls("gradient"):
        receiver = facts.receiver(call)
        if (
            isinstance(receiver, ast.Name)
            and receiver.id == tape.name
            and call.args
            and facts.scope(call) is facts.scope(tape.with_node)
        ):
            assignment = facts.reaching_assignment(receiver)
            if assignment is not None and assignment.stmt is tape.with_node:
                found.append(call)
    return found


def _reach(facts: Facts, expr: ast.AST, region: ast.AST, predicate) -> list[ast.AST]:
    """The nodes `predicate` accepts on the way back from `expr` through the names it reads
    that are bound inside `region` (a match is not looked behind), in source order."""
    todo = [expr]
    seen: set[int] = set()
    found: list[ast.AST] = []
    steps = 0
    while todo and steps < MAX_STEPS * 20:
        node = todo.pop()
        steps += 1
        if id(node) in seen:
            continue
        seen.add(id(node))
        if predicate(node):
            found.append(node)
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            assignment = facts.reaching_assignment(node)
            if (
                assignment is not None
                and assignment.value is not None
                and facts.is_inside(assignment.stmt, region)
            ):
                todo.append(assignment.value)
            continue
        if isinstance(node, (ast.Lambda, ast.FunctionDef, ast.ClassDef)):
            continue
        todo.extend(ast.iter_child_nodes(node))
    return sorted(found, key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0)))


@exemption("TL603", "neg_python_int_on_side_path.py")
def _reaches_without_break(stops: list[ast.AST], is_break: Callable[[ast.AST], bool]) -> bool:
    """Some path from the target reaches the model's output (or a watched tensor) through
    TensorFlow operations only: gradients flow along it, whatever a side path does (a Python
    `int` batch size dividing the loss takes nothing away)."""
    return any(not is_break(n) for n in stops)


def tape_break(facts: Facts, tape: Tape, target: ast.expr) -> ast.Call | None:
    """The call on the way from `tape.gradient`'s target back to the model's output that takes
    the value out of TensorFlow, so the tape loses the path (None when there is none)."""
    sources = tape_sources(facts, tape)
    source_ids = {id(s) for s in sources}
    watched_names = {s.id for s in sources if isinstance(s, ast.Name)}

    def is_source(node: ast.AST) -> bool:
        if id(node) in source_ids:
            return True
        return isinstance(node, ast.Name) and node.id in watched_names

    def is_break(node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Call)
            and facts.is_inside(node, tape.with_node)
            and breaks_tape(facts, node) is not None
        )

    # Breaks are barriers: the search from the target stops at the model's output or at one.
    stops = _reach(facts, target, tape.with_node, lambda n: is_source(n) or is_break(n))
    if not stops or _reaches_without_break(stops, is_break):
        return None
    broken = [
        n
        for n in stops
        if is_break(n) and _reach(facts, breaks_tape(facts, n), tape.with_node, is_source)  # type: ignore[arg-type]
    ]
    # The earliest break is the one to fix first (the later ones often go away with it).
    return broken[0] if broken and isinstance(broken[0], ast.Call) else None


# ---------------------------------------------------------------------- training steps
def training_flag(call: ast.Call) -> object:
    """The literal `training=` of a model call: True/False, None when absent, UNKNOWN when it
    is an expression (a `training` parameter passed along)."""
    flag = keyword(call, "training")
    if flag is None:
        if len(call.args) > 1 or any(k.arg is None for k in call.keywords):
            return UNKNOWN  # positional `training`, or **kwargs
        return None
    value = constant_of(flag.value)
    return value if isinstance(value, bool) else UNKNOWN


def evaluation_methods(facts: Facts) -> list[FunctionNode]:
    """`test_step` and `predict_step` of in-file Keras Model subclasses: Keras calls them for
    `evaluate` and `predict`, where the model must run in inference mode."""
    found = []
    for info in facts.classes.values():
        if subclass_model(facts, info.node) is None:
            continue
        for name in ("test_step", "predict_step"):
            method = info.methods.get(name)
            if method is not None:
                found.append(method)
    return found


def trains(facts: Facts) -> bool:
    """The file trains a Keras model: it calls `fit`, or records a GradientTape."""
    return bool(facts.method_calls("fit", "train_on_batch", "apply_gradients")) or bool(
        tapes(facts)
    )
