"""Host-value predicates for TL501 (`batch-not-moved-to-device`): a loader value that is meant
to stay on the CPU (the lengths of `pack_padded_sequence`, an argument of `len`/`range`, a loop's
iterable), in the loop itself or in how the model's `forward` uses the parameter it binds to.

Kept apart from the rule module so that it stays short. In: `Facts`, the model call and the
loader name passed to it. Out: whether the name is a host-only input.
"""

from __future__ import annotations

import ast

from torchls.analysis.facts import Facts
from torchls.analysis.registry import exemption

PACKING = ("pack_padded_sequence", "pack_sequence")
# Builtins that take plain Python values (a list of lengths, a count), not device tensors.
HOST_BUILTINS = {"len", "range", "max", "min", "sum", "list", "sorted", "zip", "enumerate"}


def _packing_lengths(facts: Facts, name: ast.Name) -> bool:
    """This read of `name` is the `lengths` of `pack_padded_sequence` (wanted on the CPU)."""
    parent = facts.parents.get(name)
    if isinstance(parent, ast.Call) and name in parent.args:
        qualname = facts.call_qualname(parent) or ""
        packing = qualname.endswith(PACKING) or facts.short_name(parent) in PACKING
        return packing and parent.args.index(name) == 1
    return isinstance(parent, ast.keyword) and _host_use(facts, name)


def _host_use(facts: Facts, name: ast.Name) -> bool:
    """This read of `name` wants a host value: the `lengths` of `pack_padded_sequence` (which
    needs them on the CPU), an argument of `len`/`range`/`max`..., or a `for` loop's iterable."""
    parent = facts.parents.get(name)
    if isinstance(parent, ast.keyword):
        call = facts.parents.get(parent)
        return (
            isinstance(call, ast.Call)
            and parent.arg == "lengths"
            and (facts.call_qualname(call) or facts.short_name(call)).endswith(PACKING)
        )
    if isinstance(parent, ast.Call) and name in parent.args:
        qualname = facts.call_qualname(parent) or ""
        if qualname.endswith(PACKING) or facts.short_name(parent) in PACKING:
            return parent.args.index(name) == 1
        return isinstance(parent.func, ast.Name) and parent.func.id in HOST_BUILTINS
    return isinstance(parent, (ast.For, ast.comprehension)) and parent.iter is name


def _forward_of(facts: Facts, func: ast.expr) -> tuple[Facts, ast.FunctionDef] | None:
    """The `forward` method (and the facts of its file) of the module object `func` names."""
    value = facts.binding_value(func) if isinstance(func, (ast.Name, ast.Attribute)) else None
    for _ in range(4):
        if not isinstance(value, ast.Call) or not facts.returns_receiver(value):
            break
        receiver = facts.receiver(value)
        value = facts.binding_value(receiver) if receiver is not None else None
        value = value if value is not None else receiver
    if not isinstance(value, ast.Call):
        return None
    found = facts.module_class_of_call(value)
    if found is None:
        return None
    owner, info = found
    forward = info.methods.get("forward")
    return (owner, forward) if isinstance(forward, ast.FunctionDef) else None


@exemption("TL501", "neg_packing_lengths_stay_on_cpu.py")
def _host_only_input(facts: Facts, call: ast.Call, argument: ast.Name) -> bool:
    """The loader value is used as a host value, not as a tensor input: in the loop it is
    passed as `pack_padded_sequence`'s lengths, or the model's `forward` only ever uses the
    parameter it binds to as one (packing lengths, `len(...)`, a loop over it)."""
    scope = facts.scope(argument)
    for node in facts.scope_nodes.get(scope, ()):
        if (
            isinstance(node, ast.Name)
            and node.id == argument.id
            and node is not argument
            and facts.reaching_assignment(node) is facts.reaching_assignment(argument)
            and _packing_lengths(facts, node)  # `len(x)` alone says nothing: tensors have it
        ):
            return True
    found = _forward_of(facts, call.func)
    if found is None or argument not in call.args:
        return False
    owner, forward = found
    params = [a.arg for a in [*forward.args.posonlyargs, *forward.args.args]][1:]
    position = call.args.index(argument)
    if position >= len(params):
        return False
    uses = [
        node
        for node in owner.scope_nodes.get(forward, ())
        if isinstance(node, ast.Name) and node.id == params[position]
    ]
    return bool(uses) and all(_host_use(owner, use) for use in uses)
