"""Where the `DistributedSampler`s of a file are and which `DataLoader` each feeds, for TL802
(`sampler-without-set-epoch`).

Why a module of its own: these predicates find the samplers (direct or through a name bound to
the class) and their loaders (by keyword, by name in the sampler's scope, through factories,
`self` attributes and wrappers that return their argument); the rule module keeps the epoch
loops, the `set_epoch` calls and the fix. In: the file's `Facts` and sampler/loader calls.
Out: those calls, the keys they are stored under, and whether a sampler shuffles.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.objects import ObjectModel, Value
from torchls.analysis.queries.vocabulary import _unwrap_iterable, argument_at
from torchls.analysis.rules._distributed import MAX_DEPTH

EVAL_NAME_RE = re.compile(r"val|test|eval|infer|predict")

SAMPLERS = {
    "torch.utils.data.distributed.DistributedSampler",
    "torch.utils.data.DistributedSampler",
}


def _sampler_binding(facts: Facts, sampler: ast.Call) -> tuple[str | None, ast.Assign | None]:
    """(text key the sampler is stored under, the assignment) — `train_sampler`,
    `self.sampler` — or (None, None) when it is passed inline. The assignment is None when
    the sampler is one arm of a conditional expression."""
    parent = facts.parents.get(sampler)
    direct = True
    if isinstance(parent, ast.IfExp):
        parent, direct = facts.parents.get(parent), False
    if isinstance(parent, ast.Assign) and len(parent.targets) == 1:
        return facts.key(parent.targets[0]), parent if direct else None
    return None, None


def _loader_of(facts: Facts, sampler: ast.Call, sampler_key: str | None) -> ast.Call | None:
    for call in facts.calls:
        kind = facts.kind_of(call)
        if kind is None or kind.kind != "loader" or kind.node is not call:
            continue
        for keyword in call.keywords:
            if keyword.arg != "sampler":
                continue
            value = keyword.value
            if value is sampler:
                return call
            # By name only in the sampler's own scope: `sampler` in another function is
            # another sampler.
            if sampler_key is not None and facts.key(value) == sampler_key:
                if sampler_key.startswith("self.") or facts.scope(call) is facts.scope(sampler):
                    return call
    return None


def _shuffles(facts: Facts, sampler: ast.Call) -> bool:
    """True unless the sampler is built with `shuffle=False` (or a shuffle we cannot read)."""
    shuffle = next((k.value for k in sampler.keywords if k.arg == "shuffle"), None)
    if shuffle is None and len(sampler.args) > 3:
        shuffle = sampler.args[3]
    if shuffle is None:
        return True
    return isinstance(shuffle, ast.Constant) and shuffle.value is True


def _constructed_loader(
    facts: Facts, expr: ast.AST | None, depth: int = 0
) -> tuple[Facts, ast.Call] | None:
    """The `DataLoader(...)` call `expr` holds, through names, parameters bound at every call
    site, single-valued `self` attributes, factory returns (a returned tuple's element too) and
    argument-returning wrappers."""
    if expr is None or depth > MAX_DEPTH * 2:
        return None
    if isinstance(expr, ast.Call):
        kind = facts.kind_of(expr)
        if kind is not None and kind.kind == "loader" and kind.node is expr:
            return facts, expr
        returns = facts.function_returns(expr)
        if returns is not None and len(returns) == 1:
            owner, returned = returns[0]
            return _constructed_loader(owner, returned, depth + 1)
        handed_back = facts.returned_arguments(expr)
        if len(handed_back) == 1:
            return _constructed_loader(facts, handed_back[0], depth + 1)
        return None
    if isinstance(expr, ast.Name):
        unpacked = _unpacked_element(facts, expr)
        if unpacked is not None:
            return _constructed_loader(unpacked.facts, unpacked.expr, depth + 1)
        bound = facts.binding_value(expr)
        if bound is None:
            return _passed_from_other_files(facts, expr, depth)
        return _distributed_alternative(facts, expr) or _constructed_loader(facts, bound, depth + 1)
    if isinstance(expr, ast.Attribute):
        values = facts.self_attribute_values(expr)
        if len(values) == 1:
            return _constructed_loader(facts, values[0], depth + 1)
    return None


def _distributed_alternative(facts: Facts, name: ast.Name) -> tuple[Facts, ast.Call] | None:
    """The loader built on a DistributedSampler when every binding of `name` in its scope is a
    loader construction and one of them is (`if dist.is_initialized(): loader =
    DataLoader(ds, sampler=DistributedSampler(ds))`, `else: loader = DataLoader(ds,
    shuffle=True)`): the distributed run takes that arm."""
    scope = facts.scope(name)
    bindings = facts.assignments_of(name.id, scope)
    if len(bindings) < 2:
        return None
    with_sampler: list[ast.Call] = []
    for binding in bindings:
        value = binding.value
        if binding.index is not None or binding.loop is not None or not isinstance(value, ast.Call):
            return None
        kind = facts.kind_of(value)
        if kind is None or kind.kind != "loader" or kind.node is not value:
            return None
        if _sampler_of(facts, value) is not None:
            with_sampler.append(value)
    return (facts, with_sampler[0]) if len(with_sampler) == 1 else None


def _passed_from_other_files(
    facts: Facts, name: ast.Name, depth: int
) -> tuple[Facts, ast.Call] | None:
    """The loader a parameter is given by every call of its function in the project's other
    files (`train_validate_test(model, opt, train_loader, ...)` in run_training.py, the loader
    unpacked there from a factory): one loader call, the same at every site."""
    function = facts.parameter_of(name)
    if function is None:
        return None
    sites = facts.calls_from_other_files(function)
    found: tuple[Facts, ast.Call] | None = None
    method = isinstance(facts.parents.get(function), ast.ClassDef)
    for other, site in sites:
        bound = method and isinstance(site.func, ast.Attribute)
        told, value = argument_at(site, function, name.id, bound)
        built = _constructed_loader(other, value, depth + 1) if told else None
        if built is None or (found is not None and built[1] is not found[1]):
            return None
        found = built
    return found


def _unpacked_element(facts: Facts, name: ast.Name) -> Value | None:
    """What `name` holds when it is unpacked from a project function's returned tuple
    (`train_loader, val_loader = build_loaders(cfg)`, the factory in another module): that
    position of the tuple, when every return of the factory agrees on one expression."""
    assignment = facts.reaching_assignment(name)
    if assignment is None or assignment.index is None or assignment.loop is not None:
        return None
    if not isinstance(assignment.value, ast.Call):
        return None
    return _element_of(facts, assignment.value, assignment.index, 0)


def _element_of(facts: Facts, call: ast.Call, index: int, depth: int) -> Value | None:
    """Position `index` of the tuple `call` returns; through a factory whose only return is
    another project call (`return create_dataloaders(train, val, test, batch_size=b)`)."""
    found = facts.get(ObjectModel).returned_element(call, index)
    if found is not None:
        return found[0] if len(found) == 1 else None
    returns = facts.function_returns(call)
    if depth >= MAX_DEPTH or returns is None or len(returns) != 1:
        return None
    owner, returned = returns[0]
    if not isinstance(returned, ast.Call):
        return None
    return _element_of(owner, returned, index, depth + 1)


def _sampler_of(facts: Facts, loader: ast.Call) -> ast.Call | None:
    value = next((k.value for k in loader.keywords if k.arg == "sampler"), None)
    if isinstance(value, ast.Name):
        value = facts.binding_value(value)
    if isinstance(value, ast.Call) and _is_sampler_call(facts, value):
        return value
    return None


def _sampler_calls(facts: Facts) -> list[ast.Call]:
    """Constructions of a DistributedSampler: direct, or through a name bound to the class
    (`sampler_cls = RandomSampler if local_rank == -1 else DistributedSampler`, then
    `sampler_cls(dataset)`: a distributed run builds a DistributedSampler)."""
    direct = facts.calls_to(*SAMPLERS)
    aliased = [
        call
        for call in facts.calls
        if isinstance(call.func, ast.Name) and call not in direct and _is_sampler_call(facts, call)
    ]
    return sorted([*direct, *aliased], key=lambda c: (c.lineno, c.col_offset))


def _is_sampler_call(facts: Facts, call: ast.Call) -> bool:
    if facts.call_qualname(call) in SAMPLERS:
        return True
    if not isinstance(call.func, ast.Name) or call.func.id in facts.imports:
        return False
    bound = facts.binding_value(call.func)
    choices = [bound.body, bound.orelse] if isinstance(bound, ast.IfExp) else [bound]
    return any(
        isinstance(choice, (ast.Name, ast.Attribute)) and facts.qualname(choice) in SAMPLERS
        for choice in choices
    )


def _distributed_loader(
    facts: Facts, sampler: ast.Call
) -> tuple[ast.Call, str | None, ast.Assign | None, str, ast.Call] | None:
    """(sampler, its key, its assignment, loader key, loader call) when the sampler feeds a
    DataLoader stored under a name or `self` attribute."""
    sampler_key, assignment = _sampler_binding(facts, sampler)
    loader = _loader_of(facts, sampler, sampler_key)
    statement = facts.parents.get(loader) if loader is not None else None
    if isinstance(statement, ast.Call) and loader in facts.returned_arguments(statement):
        statement = facts.parents.get(statement)  # `backend.distribute(DataLoader(...))`
    if loader is None or not isinstance(statement, ast.Assign) or len(statement.targets) != 1:
        return None
    loader_key = facts.key(statement.targets[0])
    if loader_key is None:
        return None
    return sampler, sampler_key, assignment, loader_key, loader


def _loops_over_values(facts: Facts) -> Iterator[tuple[ast.For | ast.AsyncFor, ast.expr]]:
    """(loop, what it iterates) for the batch loops that are not evaluation ones, and for loops
    over a project wrapper handing back its argument (`for b in progress(loader, level)`,
    returning `tqdm(loader)` or `loader` itself): the argument is what is iterated."""
    for loop in facts.loops:
        if not isinstance(loop, (ast.For, ast.AsyncFor)):
            continue
        role = facts.batch_loops.get(loop)
        if role == "eval":
            continue
        # `enumerate(loader)`, `tqdm(loader)`: the loader is what they wrap.
        iterable = _unwrap_iterable(loop.iter) or loop.iter
        if role is None:
            handed = facts.returned_arguments(iterable) if isinstance(iterable, ast.Call) else []
            if len(handed) != 1:
                continue
            function = facts.enclosing_function(loop)
            if function is not None and EVAL_NAME_RE.search(function.name.lower()):
                continue  # `validate(loader)`: an evaluation pass, whatever it is handed
            iterable = handed[0]
        yield loop, iterable
