"""What the code's own type tests say about a scheduler, for the TL4xx scheduler rules.

Why it exists: a scheduler chosen at run time (a configuration picks the class, a pipeline
hands it over) has no constructor in sight, but the code that steps it often tests its type
first (`if isinstance(scheduler, ReduceLROnPlateau): scheduler.step(loss)`, or the class name
compared as text). Inside such a branch the type is known whatever was chosen. In: the file's
`Facts` and a `scheduler.step(...)` call. Out: the torch scheduler class a branch proves the
receiver is, and whether a condition only tests the scheduler itself (its presence or type),
which says nothing about how often the step runs.
"""

from __future__ import annotations

import ast

from torchls.analysis.facts import Facts

_SCHEDULER_MODULE = "torch.optim.lr_scheduler."
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.Module)
# Schedulers whose stepping rate follows from the class alone, without reading the
# constructor's arguments (a plateau counts its patience in calls to `step(metric)`).
TYPE_DESIGNS = {"ReduceLROnPlateau": "epoch"}
# The classes of `torch.optim.lr_scheduler` a test may spell as text (`type(s).__name__`).
CLASS_NAMES = frozenset(
    {
        "ReduceLROnPlateau",
        "StepLR",
        "MultiStepLR",
        "ExponentialLR",
        "CosineAnnealingLR",
        "CosineAnnealingWarmRestarts",
        "CyclicLR",
        "OneCycleLR",
        "LambdaLR",
        "MultiplicativeLR",
        "LinearLR",
        "ConstantLR",
        "PolynomialLR",
        "SequentialLR",
        "ChainedScheduler",
    }
)


def narrowed_scheduler(facts: Facts, call: ast.Call) -> str | None:
    """The class name (`ReduceLROnPlateau`) that the innermost type test around `call`
    proves its receiver to be, in `call`'s function; None when no test says."""
    key = facts.key(facts.receiver(call))
    if key is None:
        return None
    child: ast.AST = call
    current = facts.parents.get(call)
    while current is not None and not isinstance(current, _SCOPES):
        if isinstance(current, ast.If):
            if any(item is child for item in current.body):
                found = _proved(facts, current.test, key)
            else:
                negated = current.test
                found = (
                    _proved(facts, negated.operand, key)
                    if isinstance(negated, ast.UnaryOp) and isinstance(negated.op, ast.Not)
                    else None
                )
            if found is not None:
                return found
        child, current = current, facts.parents.get(current)
    return None


def _proved(facts: Facts, test: ast.expr, key: str) -> str | None:
    """The class a true `test` proves `key` holds (one arm of an `and` is enough)."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        for value in test.values:
            found = _proved(facts, value, key)
            if found is not None:
                return found
        return None
    if isinstance(test, ast.Call) and isinstance(test.func, ast.Name):
        if test.func.id == "isinstance" and len(test.args) == 2:
            if facts.key(test.args[0]) == key:
                return _scheduler_class(facts, test.args[1])
        return None
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, op, right = test.left, test.ops[0], test.comparators[0]
        if isinstance(op, (ast.Is, ast.Eq)):
            for subject, other in ((left, right), (right, left)):
                if _type_of(facts, subject) == key:
                    return _scheduler_class(facts, other)
                if _class_name_of(facts, subject) == key:
                    return _named_class(other)
        if isinstance(op, ast.In) and _class_name_of(facts, right) == key:
            return _named_class(left)  # `"ReduceLROnPlateau" in type(s).__name__`
    return None


def _type_of(facts: Facts, expr: ast.expr) -> str | None:
    """`key` for `type(x)` and `x.__class__`."""
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name):
        if expr.func.id == "type" and len(expr.args) == 1 and not expr.keywords:
            return facts.key(expr.args[0])
        return None
    if isinstance(expr, ast.Attribute) and expr.attr == "__class__":
        return facts.key(expr.value)
    return None


def _class_name_of(facts: Facts, expr: ast.expr) -> str | None:
    """`key` for `type(x).__name__` and `x.__class__.__name__`."""
    if isinstance(expr, ast.Attribute) and expr.attr == "__name__":
        return _type_of(facts, expr.value)
    return None


def _scheduler_class(facts: Facts, expr: ast.expr) -> str | None:
    qualname = facts.qualname(expr)
    if qualname is None or not qualname.startswith(_SCHEDULER_MODULE):
        return None
    return qualname.rsplit(".", 1)[1]


def _named_class(expr: ast.expr) -> str | None:
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value if expr.value in CLASS_NAMES else None
    return None


def tests_only_scheduler(facts: Facts, test: ast.expr, scheduler: ast.expr | None) -> bool:
    """True when `test` only asks whether the scheduler is there or what type it is
    (`if scheduler:`, `if scheduler is not None and isinstance(scheduler, ...)`): such a
    branch is taken on every pass or never, it does not change how often a step runs."""
    key = facts.key(scheduler)
    if key is None:
        return False
    if isinstance(test, ast.BoolOp):
        return all(tests_only_scheduler(facts, value, scheduler) for value in test.values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return tests_only_scheduler(facts, test.operand, scheduler)
    if facts.key(test) == key:
        return True
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, op, right = test.left, test.ops[0], test.comparators[0]
        if isinstance(op, (ast.Is, ast.IsNot)) and isinstance(right, ast.Constant):
            return right.value is None and facts.key(left) == key
        if isinstance(op, (ast.Is, ast.IsNot, ast.Eq, ast.NotEq)):
            return key in (_type_of(facts, left), _class_name_of(facts, left))
        if isinstance(op, (ast.In, ast.NotIn)):
            return _class_name_of(facts, right) == key and isinstance(left, ast.Constant)
        return False
    if isinstance(test, ast.Call) and isinstance(test.func, ast.Name):
        return (
            test.func.id in ("isinstance", "hasattr")
            and len(test.args) == 2
            and facts.key(test.args[0]) == key
        )
    return False


def plateau_may_reach(facts: Facts, call: ast.Call, function: ast.AST) -> bool:
    """Every type test of the receiver between `call` and `function` lets a
    `ReduceLROnPlateau` through: a branch that proves it is one, or the other arm of a test
    proving another class (`elif` after `isinstance(s, OneCycleLR)`). A type test this
    cannot read, or of another object, stops it; tests of anything else do not matter."""
    key = facts.key(facts.receiver(call))
    if key is None:
        return False
    child: ast.AST = call
    current = facts.parents.get(call)
    while current is not None and current is not function:
        if isinstance(current, ast.If) and _tests_a_type(current.test):
            in_body = any(item is child for item in current.body)
            test = current.test
            if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
                test, in_body = test.operand, not in_body
            proved = _proved(facts, test, key)
            if proved is None or (proved == "ReduceLROnPlateau") != in_body:
                return False
        child, current = current, facts.parents.get(current)
    return current is function


def _tests_a_type(test: ast.expr) -> bool:
    names = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(test) if isinstance(n, ast.Attribute)}
    return bool({"isinstance", "type", "ReduceLROnPlateau", "__class__"} & names)
