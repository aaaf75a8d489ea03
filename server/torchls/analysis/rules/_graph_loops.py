"""TL206's questions about the loops around an accumulation: does a loop run once per
training step or batch, does the accumulator outlive it, and is the accumulator itself
backward()-ed afterwards (losses summed on purpose), and is it used as a tensor later.

Why: a list filled inside a loop over layers or heads, or rebuilt every batch, keeps nothing
alive across steps; a running sum that is backward()-ed together is intended. In: the facts
of a file, a scope, loops and an accumulator's bindings. Out: yes/no answers.
"""

from __future__ import annotations

import ast

from torchls.analysis.facts import Facts
from torchls.analysis.rules._graph_containers import bound_names

TENSOR_USES = {"item", "detach", "cpu", "numpy", "backward", "to", "cuda", "tolist", "clone"}


def feeds_backward(facts: Facts, scope: ast.AST, accumulator: str) -> bool:
    """True if the accumulator is (part of) something that gets backward()-ed: through
    assignments (`loss = losses[i]`), loops over it (`for opt, loss in zip(opts, losses)`)
    and `accelerator.backward(loss)`-style calls that take it as an argument."""
    derived = {accumulator}

    def mentions(expr: ast.AST) -> bool:
        return any(isinstance(n, ast.Name) and n.id in derived for n in ast.walk(expr))

    for node in facts.walk_local(scope):
        if isinstance(node, ast.Assign) and mentions(node.value):
            for target in node.targets:
                derived.update(bound_names(target))
        elif isinstance(node, (ast.For, ast.AsyncFor)) and mentions(node.iter):
            derived.update(n.id for n in ast.walk(node.target) if isinstance(n, ast.Name))
    for node in facts.walk_local(scope):
        if isinstance(node, ast.Call) and facts.is_backward(node):
            subjects = [facts.receiver(node), *node.args]
            if any(subject is not None and mentions(subject) for subject in subjects):
                return True
    return False


def _over_a_built_loader(facts: Facts, loop: ast.AST) -> bool:
    """`for batch in loader:` where the loader's construction is in sight (a name that only
    sounds like one, `minibatches`, may be a handful of per-domain batches of one step)."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return False
    iterable = facts.loop_source(loop)
    kind = facts.kind_of(iterable) if iterable is not None else None
    return kind is not None and kind.kind == "loader" and not kind.by_name


def outlives_a_step(facts: Facts, loops: list, assignments: list) -> bool:
    """Some loop around the accumulation trains or iterates data once per iteration (a
    step or batch loop) and the accumulator is created outside it, so it lives across steps.
    A list rebuilt every batch, or a loop over layers or classifiers, keeps nothing alive."""
    for loop in loops:
        steps = facts.node_reaches(loop, facts.is_backward) or any(
            facts.backwards_in_other_file(call) for call in facts.calls_in(loop)
        )
        if not steps and not _over_a_built_loader(facts, loop):
            continue
        if not any(facts.is_inside(a.stmt, loop) for a in assignments):
            return True
    return False


def used_as_tensor_later(facts: Facts, scope: ast.AST, accumulator: str, after: int) -> bool:
    """The accumulator is used as a tensor after line `after` (`total.backward()`,
    `torch.stack(acc)`): `.item()` on what it accumulates changes that use, so the fix is unsafe."""
    for node in facts.walk_local(scope):
        if getattr(node, "lineno", 0) <= after:
            continue
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == accumulator
            and node.attr in TENSOR_USES
        ):
            return True
        if isinstance(node, ast.Call) and (facts.call_qualname(node) or "").startswith("torch."):
            if any(isinstance(a, ast.Name) and a.id == accumulator for a in node.args):
                return True
    return False
