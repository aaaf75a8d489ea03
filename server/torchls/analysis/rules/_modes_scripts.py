"""TL201's questions about an inference loop that runs a module loaded out of sight: a script
(or a function) that gets a network from a loader it cannot see into, moves it to a device and
runs it over its data under `no_grad`, with nothing anywhere switching its mode.

Why a module of its own: `_modes.py` is at its size limit, and the question differs from the
mode analysis: that analysis only knows modes set or built in sight, while here the module
comes from elsewhere and the file's own code is the whole evidence.
In: `Facts` and nodes. Out: (model call, evaluation loop, key) for each such inference loop.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.rules._modes import _function_trains, _on_training_path, _trainer

# Methods that move a module and hand it back: a value they return that is then called is a
# module (a tensor is not callable, a function has no `.cuda()`).
_MOVES = frozenset({"cpu", "cuda", "to", "half", "float", "double", "bfloat16"})

# Loaders whose result may already be in eval mode (a scripted or pickled module keeps the
# mode it was saved in, `from_pretrained` switches to eval, hub entries may): out of scope.
_MODE_KEEPING_METHODS = frozenset({"from_pretrained", "load_from_checkpoint", "load"})


def unswitched_loaded_modules(facts: Facts) -> Iterator[tuple[ast.Call, ast.stmt, str]]:
    """(call, loop, name) for `net(x)` in a loop that feeds it what the loop iterates, under
    `no_grad`, where `net` is a local (or a script's global) bound only to a moved module
    (`net = bundle["encoder"].cpu()`, then maybe `net = net.cuda()`) that comes from a loader
    out of sight, that nothing in the file does anything else with (no `eval()`, not handed
    to any call), in a scope that never trains: a module is built in training mode, and no
    code in sight ever switched this one."""
    switched = {
        facts.key(facts.receiver(call))
        for call in facts.calls
        if facts.method_name(call) in ("train", "eval", "requires_grad_")
    }
    seen: set[tuple[int, str]] = set()
    for call in facts.calls:
        func = call.func
        if not isinstance(func, ast.Name) or func.id in switched:
            continue
        loops = facts.enclosing_loops(call)
        if not loops or not facts.in_no_grad(call):
            continue
        scope = facts.scope(call)
        loop = loops[-1]
        if (id(loop), func.id) in seen or not _moved_module_from_out_of_sight(facts, func, scope):
            continue
        if not _only_called(facts, func.id, scope) or _scope_trains(facts, scope):
            continue
        if not isinstance(loop, (ast.For, ast.AsyncFor)) or not _fed_from_loop(facts, loop, call):
            continue
        seen.add((id(loop), func.id))
        yield call, loop, func.id


def _moved_module_from_out_of_sight(facts: Facts, name: ast.Name, scope: ast.AST) -> bool:
    """Every binding of `name` in `scope` is a move (`.cpu()`, `.cuda()`, `.to(device)`) of
    `name` itself or of a value from a loader call out of sight that is not known to keep a
    saved mode (`torch.load`, `torch.jit.load`, `from_pretrained`); one binding at least is
    of such a loaded value."""
    bindings = facts.assignments_of(name.id, scope)  # type: ignore[arg-type]
    loaded = False
    for binding in bindings:
        value = binding.value
        if binding.index is not None or binding.loop is not None or value is None:
            return False
        if not (isinstance(value, ast.Call) and facts.method_name(value) in _MOVES):
            return False
        root = facts.same_object(value)
        if isinstance(root, ast.Name) and root.id == name.id:
            continue  # `net = net.cuda()`
        if not _loaded_out_of_sight(facts, root, scope):
            return False
        loaded = True
    return loaded


def _loaded_out_of_sight(facts: Facts, expr: ast.AST | None, scope: ast.AST) -> bool:
    """`expr` is, through subscripts, attributes and single local bindings, the result of a
    call of a function this file neither defines nor knows to keep a saved mode."""
    for _ in range(4):
        while isinstance(expr, (ast.Subscript, ast.Attribute)):
            expr = expr.value
        if isinstance(expr, ast.Name):
            bindings = facts.assignments_of(expr.id, scope)  # type: ignore[arg-type]
            if len(bindings) != 1 or bindings[0].index is not None or bindings[0].loop:
                return False
            expr = bindings[0].value
            continue
        if not isinstance(expr, ast.Call) or facts.called_function(expr) is not None:
            return False
        kind = facts.kind_of(expr)
        if kind is not None and kind.kind != "data":
            return False  # a constructor or factory the mode analysis already follows
        qualname = facts.call_qualname(expr) or ""
        if qualname.startswith(("torch", "copy.")):
            return False
        return facts.method_name(expr) not in _MODE_KEEPING_METHODS
    return False


def _only_called(facts: Facts, name: str, scope: ast.AST) -> bool:
    """Everything the file does with `name` in `scope` is call it or move it: it is handed to
    nothing (which could switch its mode out of sight) and none of its methods runs."""
    for node in facts.scope_nodes.get(scope, ()):
        if not (isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load)):
            continue
        parent = facts.parents.get(node)
        if isinstance(parent, ast.Call) and parent.func is node:
            continue
        if isinstance(parent, ast.Attribute) and parent.attr in _MOVES:
            continue
        return False
    return True


def _scope_trains(facts: Facts, scope: ast.AST) -> bool:
    """The function (or the script's top level) backwards or steps an optimizer, or is run
    on a training path."""
    if isinstance(scope, ast.Module):
        trains = _trainer(facts)
        return any(
            facts.node_reaches(statement, trains)
            for statement in scope.body
            if not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        )
    return _function_trains(facts, scope) or _on_training_path(facts, scope)


def _fed_from_loop(facts: Facts, loop: ast.For | ast.AsyncFor, call: ast.Call) -> bool:
    """Some argument of `call` is built, before it in the loop body, from what the loop
    iterates: through assignments, nested loops over such values and the lists they fill
    (`for line in batch: vecs.append(encode(line))`, then `net(torch.tensor(vecs))`)."""
    names = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    before = [
        node
        for node in ast.walk(loop)
        if isinstance(node, (ast.stmt, ast.Call))
        and (node.lineno, node.col_offset) < (call.lineno, call.col_offset)
    ]
    for _ in range(6):
        grown = False
        for node in before:
            bound: list[ast.AST] = []
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value:
                sources, bound = [node.value], list(getattr(node, "targets", [])) or [node.target]  # type: ignore[union-attr]
            elif isinstance(node, (ast.For, ast.AsyncFor)):
                sources, bound = [node.iter], [node.target]
            elif isinstance(node, ast.Call) and facts.method_name(node) in ("append", "extend"):
                sources, bound = list(node.args), [facts.receiver(node)]  # type: ignore[list-item]
            else:
                continue
            if not any(
                isinstance(n, ast.Name) and n.id in names for s in sources for n in ast.walk(s)
            ):
                continue
            for target in bound:
                for n in ast.walk(target):
                    if isinstance(n, ast.Name) and n.id not in names:
                        names.add(n.id)
                        grown = True
        if not grown:
            break
    arguments = [*call.args, *(k.value for k in call.keywords)]
    return any(isinstance(n, ast.Name) and n.id in names for a in arguments for n in ast.walk(a))
