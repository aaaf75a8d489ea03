"""Loss calls and their contracts.

In: `Facts`. Out: every call that computes a loss of a known kind (module instance or
functional), with its input and target expressions, plus the documented contract of each kind
(used by the rules and by the editor hover).
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from torchls.analysis.findings import Related
from torchls.analysis.objects import ObjectModel, Value, _on_self
from torchls.analysis.queries.vocabulary import (
    PASS_THROUGH_FUNCTIONS,
    PASS_THROUGH_METHODS,
    Assignment,
    LossCall,
    ObjectKind,
    parameter_default,
)
from torchls.analysis.registry import exemption
from torchls.records import record

if TYPE_CHECKING:
    from torchls.analysis.facts import Facts
    from torchls.analysis.queries.vocabulary import FunctionNode

FUNCTIONAL_LOSSES = {
    "cross_entropy": "CrossEntropyLoss",
    "nll_loss": "NLLLoss",
    "binary_cross_entropy": "BCELoss",
    "binary_cross_entropy_with_logits": "BCEWithLogitsLoss",
    "mse_loss": "MSELoss",
    "l1_loss": "L1Loss",
    "smooth_l1_loss": "SmoothL1Loss",
    "huber_loss": "HuberLoss",
    "kl_div": "KLDivLoss",
}


@record(frozen=True)
class Contract:
    input: str
    target: str
    note: str


CONTRACTS: dict[str, Contract] = {
    "CrossEntropyLoss": Contract(
        "`[N, C]` (or `[N, C, d1, ...]`) float **raw logits**, not softmax output",
        "`[N]` int64 class indices in `[0, C)`, or `[N, C]` float class probabilities",
        "applies `log_softmax` itself; `ignore_index` and `label_smoothing` work on indices",
    ),
    "NLLLoss": Contract(
        "`[N, C]` float **log-probabilities** (output of `log_softmax`)",
        "`[N]` int64 class indices in `[0, C)`",
        "does not normalise its input; pair it with `log_softmax`, or use cross-entropy",
    ),
    "BCEWithLogitsLoss": Contract(
        "float **raw logits** of any shape",
        "float targets of the same shape, values in `[0, 1]`",
        "applies the sigmoid itself, in a numerically stable way",
    ),
    "BCELoss": Contract(
        "float **probabilities** in `[0, 1]` of any shape",
        "float targets of the same shape, values in `[0, 1]`",
        "unstable after a sigmoid; prefer `BCEWithLogitsLoss` on the logits",
    ),
    "MSELoss": Contract(
        "float tensor of any shape",
        "float tensor of the **same shape** (`[N, 1]` against `[N]` broadcasts to `[N, N]`)",
        "reduction `mean` averages over every element",
    ),
    "L1Loss": Contract(
        "float tensor of any shape",
        "float tensor of the **same shape**",
        "broadcasting mismatched shapes gives a wrong loss silently",
    ),
    "SmoothL1Loss": Contract(
        "float tensor of any shape",
        "float tensor of the **same shape**",
        "broadcasting mismatched shapes gives a wrong loss silently",
    ),
    "HuberLoss": Contract(
        "float tensor of any shape",
        "float tensor of the **same shape**",
        "broadcasting mismatched shapes gives a wrong loss silently",
    ),
    "KLDivLoss": Contract(
        "float **log-probabilities**",
        "float probabilities (or log-probabilities with `log_target=True`)",
        "use `reduction='batchmean'` for the mathematical KL divergence",
    ),
}


def _argument(call: ast.Call, position: int, keyword: str) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == keyword:
            return kw.value
    if len(call.args) > position and not isinstance(call.args[position], ast.Starred):
        return call.args[position]
    return None


def loss_kind_of_call(facts: Facts, call: ast.Call) -> tuple[str, ast.Call | None] | None:
    """("CrossEntropyLoss", constructor-or-None) when `call` computes a loss of known kind."""
    qualname = facts.call_qualname(call) or ""
    if qualname.startswith("torch.nn.functional."):
        name = FUNCTIONAL_LOSSES.get(qualname.rsplit(".", 1)[-1])
        return (name, None) if name else None
    if qualname in ("torch.binary_cross_entropy_with_logits",):
        return ("BCEWithLogitsLoss", None)
    func = call.func
    held = held_functional_loss(facts, func)
    if held is not None:
        return held[0], None
    if (
        isinstance(func, ast.Attribute)
        and func.attr == "forward"
        and isinstance(func.value, (ast.Name, ast.Attribute))
        and not (isinstance(func.value, ast.Name) and func.value.id == "self")
    ):
        # `criterion.forward(scores, y)` computes what `criterion(scores, y)` does (the
        # hooks aside): the same loss, with the same contract on its input.
        func = func.value
    # A loss object is called as `criterion(...)`, `self.criterion(...)` or
    # `nn.CrossEntropyLoss()(...)`; method calls on anything else (`x.sum()`) are not losses.
    if isinstance(func, (ast.Call, ast.Name)) or (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id == "self"
        and func.attr != "forward"
    ):
        kind = _loss_object_kind(facts, func)
    else:
        kind = None
    if kind is not None and kind.kind == "loss" and kind.detail in CONTRACTS:
        # Fixes may edit the constructor only when it is in this file.
        same_file = isinstance(kind.node, ast.Call) and facts.owns(kind.node)
        return kind.detail, kind.node if same_file else None
    if (
        kind is not None and kind.kind in ("loss", "model") and not kind.by_name
    ) or _runs_call_method(facts, call):
        wrapped = _wrapped_loss(facts, call)
        if wrapped is not None:
            return wrapped, None
    return None


def _functional_loss_name(facts: Facts, expr: ast.expr | None) -> str | None:
    qualname = facts.qualname(expr) or ""
    if qualname.startswith("torch.nn.functional."):
        return FUNCTIONAL_LOSSES.get(qualname.rsplit(".", 1)[-1])
    return None


def held_functional_loss(facts: Facts, func: ast.expr) -> tuple[str, str, str] | None:
    """(kind, input keyword, target keyword) when the called name or `self` attribute holds
    a functional loss itself, bound once: `self.loss_func = F.binary_cross_entropy_with_logits`,
    or a lambda that hands its first two parameters on as the loss's input and target
    (`lambda out, y: F.cross_entropy(out, y, ignore_index=-1)`). The call then computes that
    loss, with its input and target at the same positions (keywords: the lambda's names)."""
    if not (
        isinstance(func, ast.Name)
        or (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "self"
        )
    ):
        return None
    if isinstance(func, ast.Name) and func.id not in facts.bound_names:
        return None
    held = facts.binding_value(func)
    if held is None and isinstance(func, ast.Attribute):
        held = _value_for_guard(facts, func)
    if isinstance(held, (ast.Name, ast.Attribute)):
        name = _functional_loss_name(facts, held)
        return (name, "input", "target") if name else None
    if not isinstance(held, ast.Lambda) or not isinstance(held.body, ast.Call):
        return None
    params = [a.arg for a in [*held.args.posonlyargs, *held.args.args]]
    if len(params) < 2 or held.args.vararg or held.args.kwarg:
        return None
    body = held.body
    name = _functional_loss_name(facts, body.func)
    if name is None:
        return None
    given = (_argument(body, 0, "input"), _argument(body, 1, "target"))
    if _lambda_changes_arguments(given, params):
        return None
    return name, params[0], params[1]


@exemption("TL101", "neg_ctc_or_cross_entropy.py")
def _kinds_differ_by_path(facts: Facts, bindings: list[Assignment]) -> bool:
    """The loss name is bound to losses of different kinds on different paths (`CTCLoss()` in
    one branch, `CrossEntropyLoss()` in the other): which contract applies depends on the path."""
    if len(bindings) < 2:
        return False
    kinds = {
        (found.kind, found.detail) if found is not None else None
        for found in (facts.kind_of(b.value) for b in bindings if b.value is not None)
    }
    return len(kinds) > 1


@exemption("TL102", "neg_lambda_loss_turns_probabilities_back.py")
def _lambda_changes_arguments(given: tuple[ast.expr | None, ...], params: list[str]) -> bool:
    """The lambda kept as the loss changes its input or target before the loss sees it
    (`lambda p, y: F.binary_cross_entropy_with_logits(torch.logit(p), y)`): its input is
    not the loss's."""
    return not all(
        isinstance(g, ast.Name) and g.id == p for g, p in zip(given, params, strict=False)
    )


def _setting_test(facts: Facts, test: ast.expr) -> tuple[str, object] | None:
    """(`attr`, constant) for a test `self.attr == constant` on a setting bound once."""
    if not (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Eq)
        and isinstance(test.left, ast.Attribute)
        and isinstance(test.left.value, ast.Name)
        and test.left.value.id == "self"
        and isinstance(test.comparators[0], ast.Constant)
    ):
        return None
    if len(facts.self_attribute_values(test.left)) != 1:
        return None  # the setting changes after construction: the tests may disagree
    return test.left.attr, test.comparators[0].value


def _value_for_guard(facts: Facts, func: ast.Attribute) -> ast.expr | None:
    """The value of `self.attr`, bound in each arm of an `if self.task == "a": ... elif
    self.task == "b": ...` chain, that holds at a use under the same test of the same setting
    (bound once): `self.loss_fn(out, y)` under `if self.task == "a":` calls what the "a" arm
    kept. None when some binding is not directly under such a test, or none matches."""
    values = facts.self_attribute_values(func)
    if len(values) < 2:
        return None
    by_test: dict[tuple[str, object], ast.expr] = {}
    for value in values:
        stmt = facts.parents.get(value)
        arm = facts.parents.get(stmt) if stmt is not None else None
        if not isinstance(arm, ast.If) or stmt not in arm.body:
            return None
        test = _setting_test(facts, arm.test)
        if test is None or test in by_test:
            return None
        by_test[test] = value
    if len({attr for attr, _ in by_test}) != 1:
        return None
    node: ast.AST = func
    while True:
        parent = facts.parents.get(node)
        if parent is None or isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return None
        if isinstance(parent, ast.If) and node in parent.body:
            test = _setting_test(facts, parent.test)
            if test is not None and test in by_test:
                return by_test[test]
        node = parent


class WrappedLosses:
    """Per file: the loss kind each project loss module of the file applies to its input
    (`_forward_loss_of_input`), worked out once per class and shared through `facts.get`."""

    def __init__(self, facts: Facts) -> None:
        self.by_class: dict[ast.AST, str | None] = {}


def _runs_call_method(facts: Facts, call: ast.Call) -> bool:
    """`call` runs the `__call__` of an object of a project class of another file
    (`self.loss_fn(out, y)`). In this file, the loss inside that `__call__` is reported
    itself: its parameter is what the call sites pass."""
    target = facts.callee(call)
    return (
        target is not None and target[1].name == "__call__" and target[2] and target[0] is not facts
    )


def _wrapped_loss(facts: Facts, call: ast.Call) -> str | None:
    """The kind of loss a project loss module applies to its input: its `forward` hands its
    first parameter, unchanged or only reshaped, cast or selected, as the input of losses of
    one known kind (`bce = F.binary_cross_entropy_with_logits(inputs, targets)` in a focal
    loss). Only logits losses count: what they expect of the input holds whatever the
    wrapper does with the loss values afterwards."""
    instance = facts.module_instance(call)
    if instance is None:
        # A loss object of a project class with `__call__` (`self.loss_fn = FocalLoss()`,
        # its class maybe in another file): that method is what the call runs.
        target = facts.callee(call)
        if target is None or target[1].name != "__call__" or not target[2]:
            return None
        owner, method = target[0], target[1]
    else:
        owner, info, _ = instance
        forward = info.methods.get("forward")
        if forward is None:
            return None
        method = forward
    cache = owner.get(WrappedLosses).by_class
    if method in cache:
        return cache[method]
    found = cache[method] = _forward_loss_of_input(owner, method)
    return found


def _forward_loss_of_input(owner: Facts, forward: FunctionNode) -> str | None:
    params = [a.arg for a in [*forward.args.posonlyargs, *forward.args.args]][1:]
    if not params:
        return None
    carriers = _carriers_of(owner, forward, params[0])
    if carriers is None:
        return None  # rebound to something else: the loss may see another value
    kinds: set[str] = set()
    for inner in owner.calls_in(forward):
        if not any(_passes_through(owner, a, carriers) for a in inner.args):
            continue
        found = loss_kind_of_call(owner, inner)
        if found is None:
            continue
        argument = _argument(inner, 0, "input")
        if argument is None or not _passes_through(owner, argument, carriers):
            return None  # the input is the loss's target, or goes in after a change
        kinds.add(found[0])
    if len(kinds) == 1 and kinds <= {"BCEWithLogitsLoss", "CrossEntropyLoss"}:
        return kinds.pop()
    return None


def _passes_through(owner: Facts, expr: ast.expr, carriers: set[str]) -> bool:
    """`expr` holds the values of a carrier, only reshaped, cast or selected: a softmax
    output stays one through `p.transpose(1, 2).contiguous()[mask].view(-1, c)`."""
    while True:
        if isinstance(expr, ast.Name):
            return expr.id in carriers
        if isinstance(expr, ast.Subscript):
            expr = expr.value
        elif (
            isinstance(expr, ast.Call)
            and isinstance(expr.func, ast.Attribute)
            and (expr.func.attr in PASS_THROUGH_METHODS)
        ):
            expr = expr.func.value
        elif (
            isinstance(expr, ast.Call)
            and expr.args
            and (owner.call_qualname(expr) in PASS_THROUGH_FUNCTIONS)
        ):
            expr = expr.args[0]
        else:
            return False


def _carriers_of(owner: Facts, forward: ast.AST, name: str) -> set[str] | None:
    """The local names of `forward` that hold its parameter `name`'s values, only reshaped,
    cast or selected (`predict = predict.transpose(1, 2)`); None when the parameter is rebound
    to anything else. A carrier bound otherwise on some path is not one."""
    stores: dict[str, list[ast.expr | None]] = {}
    plain: set[int] = set()
    nodes = list(owner.walk_local(forward))
    for node in nodes:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            if isinstance(node.targets[0], ast.Name):
                stores.setdefault(node.targets[0].id, []).append(node.value)
                plain.add(id(node.targets[0]))
    for node in nodes:
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            if id(node) not in plain:
                stores.setdefault(node.id, []).append(None)  # unpacked, looped, augmented
    carriers = {name}
    changed = True
    while changed:
        changed = False
        for local, values in stores.items():
            if local in carriers:
                continue
            held = carriers | {local}  # `flat = flat.view(-1, c)` keeps what `flat` held
            if all(v is not None and _passes_through(owner, v, held) for v in values):
                carriers.add(local)
                changed = True
    rebound = stores.get(name, [])
    if not all(v is not None and _passes_through(owner, v, carriers) for v in rebound):
        return None
    return carriers


def _loss_object_kind(facts: Facts, func: ast.expr, depth: int = 0) -> ObjectKind | None:
    """What the loss object `func` is. A name bound to losses of different kinds on different
    paths (`criterion = CTCLoss()` in one branch, `CrossEntropyLoss()` in the other) is
    unknown: which contract applies depends on the path. A parameter is what every call site
    passes for it, or its default (`def train(..., criterion=nn.CrossEntropyLoss())`)."""
    kind = facts.kind_of(func)
    if isinstance(func, ast.Attribute) and (kind is None or kind.by_name) and depth < 3:
        # `self.loss = loss` in `__init__(self, loss=nn.CrossEntropyLoss())`: the attribute
        # holds what the parameter does (what the constructions pass, or its default).
        held = facts.binding_value(func)
        if isinstance(held, ast.Name) and facts.parameter_of(held) is not None:
            found = _loss_object_kind(facts, held, depth + 1)
            if found is not None and not found.by_name:
                return found
    if not isinstance(func, ast.Name) or (kind is not None and kind.kind != "loss"):
        return kind  # only names that may hold a loss need the questions below
    if (kind is None or kind.by_name) and func.id not in facts.parameter_names:
        return kind  # neither a loss with several definitions nor a parameter (fast path)
    scope = facts.scope(func)
    bindings = facts.assignments_of(func.id, scope) or facts.assignments_of(func.id, facts.tree)
    if kind is not None and not kind.by_name and _kinds_differ_by_path(facts, bindings):
        return None
    if kind is not None and not kind.by_name:
        return kind
    rebound = any(b.value is not None or b.loop is not None for b in bindings)
    function = facts.parameter_of(func) if not rebound else None
    if function is None:
        return kind
    values = facts.parameter_arguments(func)
    if values is None:
        default = parameter_default(function, func.id)
        values = [default] if default is not None and not facts.call_sites(function) else []
    found_kinds = {
        _loss_object_kind(facts, v, depth + 1)
        if isinstance(v, ast.Name) and depth < 3
        else facts.kind_of(v)
        for v in values
    }
    if len(found_kinds) == 1:
        only = found_kinds.pop()
        if only is not None:
            return only
    return None if values else kind


def find_loss_calls(facts: Facts) -> list[LossCall]:
    found = []
    bound = facts.bound_names
    for call in facts.calls:
        if not call.args and not call.keywords:
            continue
        func = call.func
        if isinstance(func, ast.Name) and func.id not in bound:
            continue  # `len(...)`, `print(...)`: a name nothing in the file binds holds no loss
        kind = loss_kind_of_call(facts, call)
        if kind is None:
            continue
        name, constructor = kind
        held = held_functional_loss(facts, func) if constructor is None else None
        keywords = held[1:] if held is not None else ("input", "target")
        found.append(
            LossCall(
                call,
                name,
                _argument(call, 0, keywords[0]),
                _argument(call, 1, keywords[1]),
                constructor,
            )
        )
    return found


def loss_related(facts: Facts, loss_call: LossCall) -> tuple[Related, ...]:
    """Where the loss module was built, when that is in another file (a base class's `fit`
    picking it from the config): the finding names the input, this shows which loss."""
    kind = facts.kind_of(loss_call.call.func)
    constructor = kind.node if kind is not None and kind.kind == "loss" else None
    if not isinstance(constructor, ast.Call):
        return ()
    owner = facts.get(ObjectModel).owner_of(constructor)
    if owner is facts:
        return ()
    built = f"{loss_call.loss} built here"
    return (Related(owner.source.span(constructor), built, owner.filename),)


@record(frozen=True)
class ChosenLoss:
    """A loss call whose loss object is one of several losses picked on different paths
    (`self.criterion = nn.CrossEntropyLoss()` under one arm of a config test, another loss
    under the other, maybe in a base class of another file): the constructor of one
    choice, the file it is in, and the loss kinds of all the choices."""

    call: ast.Call
    loss: str
    input: ast.expr
    constructor: ast.Call
    owner: Facts
    kinds: frozenset[str]


class ChosenLosses:
    """Per file: every call of a loss object bound to losses of different kinds on different
    paths (or once to a loss and elsewhere only to `None`), with the constructors of each
    kind, worked out once and shared through `facts.get` (TL101 and TL102 both ask)."""

    def __init__(self, facts: Facts) -> None:
        self.calls: list[tuple[ast.Call, ast.expr, dict[str, list[Value]]]] = []
        model = facts.get(ObjectModel)
        known = {id(loss_call.call) for loss_call in facts.loss_calls}
        for call in facts.calls:
            func = call.func
            if id(call) in known or not call.args:
                continue
            if not (
                (isinstance(func, ast.Name) and func.id in facts.bound_names)
                or (isinstance(func, ast.Attribute) and _on_self(func))
            ):
                continue
            values = model.values(func)
            if not values or len(values) < 2:
                continue
            kinds = _loss_kinds(values)
            given = _argument(call, 0, "input")
            if not kinds or given is None:
                continue
            if _tests_the_choice(facts, call, [v for vs in kinds.values() for v in vs]):
                continue
            self.calls.append((call, given, kinds))


def _loss_kinds(values: list[Value]) -> dict[str, list[Value]]:
    """The values by loss kind, `None` placeholders aside; empty when one is not a loss."""
    kinds: dict[str, list[Value]] = {}
    for value in values:
        if isinstance(value.expr, ast.Constant) and value.expr.value is None:
            continue
        kind = value.facts.kind_of(value.expr)
        if kind is None or kind.kind != "loss" or kind.by_name or kind.detail is None:
            return {}
        kinds.setdefault(kind.detail, []).append(value)
    return kinds


def chosen_losses(facts: Facts, loss: str) -> list[ChosenLoss]:
    """The calls of this file that run a loss object bound to losses of different kinds on
    different paths (or bound once to a loss and elsewhere only to `None`, a placeholder a
    set-up method replaces), one of them `loss`, at a place that does not itself test the
    setting that picks the loss: the call then feeds `loss` on every path where the setting
    picks it. `chosen_losses(facts, "CrossEntropyLoss")`."""
    found = []
    for call, given, kinds in facts.get(ChosenLosses).calls:
        chosen = kinds[loss][0] if loss in kinds else None
        if chosen is None or not isinstance(chosen.expr, ast.Call):
            continue
        found.append(ChosenLoss(call, loss, given, chosen.expr, chosen.facts, frozenset(kinds)))
    return found


def _test_words(test: ast.expr) -> set[object]:
    """The names, attribute names and constants a test reads (`self` and `None` aside)."""
    words: set[object] = set()
    for node in ast.walk(test):
        if isinstance(node, ast.Name) and node.id != "self":
            words.add(node.id)
        elif isinstance(node, ast.Attribute):
            words.add(node.attr)
        elif isinstance(node, ast.Constant) and node.value is not None:
            words.add(node.value)
    return words


def _enclosing_tests(facts: Facts, node: ast.AST) -> list[ast.expr]:
    tests = []
    current = facts.parents.get(node)
    while current is not None and not isinstance(
        current, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    ):
        if isinstance(current, (ast.If, ast.IfExp, ast.While)):
            tests.append(current.test)
        current = facts.parents.get(current)
    return tests


@exemption("TL101", "neg_chosen_loss_under_the_same_test.py")
def _tests_the_choice(facts: Facts, call: ast.Call, values: list[Value]) -> bool:
    """The loss call sits under a test that reads what picks the loss (`if "CTC" in
    opt.prediction:` around both the binding and the call): each arm may prepare the input
    its own loss expects, so no one contract holds for the call."""
    picked: set[object] = set()
    for value in values:
        for test in _enclosing_tests(value.facts, value.expr):
            picked |= _test_words(test)
    return any(_test_words(test) & picked for test in _enclosing_tests(facts, call))
