"""TL202's question about a model run through one of its own methods, in the loop itself:
`self.model.predict(batch)` right after `self.model.eval()`, where `self.model` is an
`nn.Module` (its parameters feed an optimizer, it is switched to eval) of a class this file
cannot see (handed to the trainer's constructor) or of a project class whose method reaches
its own forward.

Why a module of its own: `_modes.py` is at its size limit, and the mode analysis only knows a
forward as `model(x)` or `model.forward(x)`, so the modes of such a call are not recorded; the
eval() that dominates the loop is read here instead.
In: `Facts` and nodes. Out: (method call, loop, key) for each such loop.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.queries.vocabulary import MODULE_API
from torchls.analysis.rules._modes import _derived_from_target, evaluation_context, modes_of
from torchls.analysis.rules._modes_paths import _reaches_own_forward

# transformers' `generate()` turns gradients off itself, and a project's decoding method of
# that name usually does the same: with its class out of sight it is not assumed to record.
SKIPPED = MODULE_API | {"generate"}


def eval_loops_through_own_methods(facts: Facts) -> Iterator[tuple[ast.Call, ast.AST, str]]:
    """(call, loop, key): in an evaluation loop, `key.method(...)` is fed what the loop
    fetched (`scores = model.predict(batch.to(device))`) and its result is kept, after a
    `key.eval()` that precedes the loop in an enclosing block of the same function with no
    `train` on `key` anywhere in that function; `key` is a module by what the file does with
    it (its `parameters()` are read), and `method` is not one of `nn.Module`'s own. When the
    model's project class is in sight, the method must reach its forward with no decorator
    on the way; a model built by a library (whose methods may be anything) is left out."""
    analysis = modes_of(facts)
    with_parameters = {
        facts.key(facts.receiver(call))
        for call in facts.method_calls("parameters", "named_parameters")
    }
    seen: set[tuple[int, str]] = set()
    for call in facts.calls:
        func = call.func
        if not isinstance(func, ast.Attribute) or func.attr in SKIPPED:
            continue
        if call in analysis.at_call or isinstance(facts.parents.get(call), ast.Expr):
            continue
        receiver = func.value
        key = facts.key(receiver)
        if key is None or key not in with_parameters or not facts.is_kind(receiver, "model"):
            continue
        context = evaluation_context(facts, call)
        if not isinstance(context, (ast.For, ast.AsyncFor)) or (id(context), key) in seen:
            continue
        arguments = [*call.args, *(k.value for k in call.keywords)]
        names = {n.id for a in arguments for n in ast.walk(a) if isinstance(n, ast.Name)}
        if not names & _derived_from_target(facts, context, call):
            continue
        if not _runs_forward(facts, receiver, func.attr):
            continue
        if not _switched_to_eval_before(facts, key, context):
            continue
        seen.add((id(context), key))
        yield call, context, key


def _runs_forward(facts: Facts, receiver: ast.expr, method: str) -> bool:
    """The method may run the model's forward: its class is out of sight (a model handed
    over), or it is a project class whose `method` reaches its own forward."""
    kind = facts.kind_of(receiver)
    built = kind.node if kind is not None else None
    if isinstance(built, ast.Call):
        found = facts.module_class_of_call(built)
        if found is None:
            return False  # built by a library, or by something that is not a module class
        owner, info = found
        defined = info.methods.get(method)
        return defined is not None and (
            _reaches_own_forward(owner, info.methods, defined, 0) is not None
        )
    return built is None


def _switched_to_eval_before(facts: Facts, key: str, loop: ast.AST) -> bool:
    """A plain `key.eval()` statement precedes `loop` in a block that holds the loop (or a
    statement around it) in the same function, and nothing in that function calls
    `key.train(...)`."""
    function = facts.enclosing_function(loop)
    if function is None:
        return False
    switches = [
        call
        for call in facts.calls_in(function)
        if facts.method_name(call) in ("eval", "train") and facts.key(facts.receiver(call)) == key
    ]
    if any(facts.method_name(call) == "train" for call in switches):
        return False
    statements = {facts.enclosing_statement(call) for call in switches if not call.args}
    anchor: ast.AST = loop
    while anchor is not function:
        parent = facts.parents.get(anchor)
        if parent is None:
            return False
        for field in ("body", "orelse", "finalbody"):
            block = getattr(parent, field, None)
            if isinstance(block, list) and anchor in block:
                earlier = block[: block.index(anchor)]
                if any(isinstance(s, ast.Expr) and s in statements for s in earlier):
                    return True
        anchor = parent
    return False
