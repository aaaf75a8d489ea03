"""Parameter bookkeeping: root models, which parameters got gradients, which optimizers hold them.

In: root modules (called from user code with no module on the stack) and the optimizers that
stepped. Out: lists of parameters without a gradient, with an all-zero gradient, or missing from
every optimizer, each with the source line where the layer was defined (found with `ast` in the
class's own file) so that TL902 points at `self.head = nn.Linear(...)`.
"""

from __future__ import annotations

import ast
import functools
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from torchls_probe.attribution import Location, UserCode


@dataclass
class Roots:
    """Models seen being called from user code, in first-call order."""

    user: UserCode
    models: list[torch.nn.Module] = field(default_factory=list)
    first_call: dict[int, Location] = field(default_factory=dict)
    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)
    optimizer_lines: dict[int, Location] = field(default_factory=dict)
    without_grad: dict[str, Location | None] = field(default_factory=dict)
    zero_grad: dict[str, Location | None] = field(default_factory=dict)
    checked_optimizers: set[int] = field(default_factory=set)
    got_grad: set[int] = field(default_factory=set)  # parameters a complete backward reached
    # Every optimizer made, stepped or not yet (weakly: a script may make one per epoch): a
    # generator whose optimizer steps after the critic's first steps is not "in no optimizer".
    made: list[weakref.ref] = field(default_factory=list)

    def add_model(self, module: torch.nn.Module, where: Location | None) -> bool:
        if any(m is module for m in self.models):
            return False
        if next(module.parameters(), None) is None:
            return False  # a loss module or a parameter-free wrapper
        self.models.append(module)
        if where is not None:
            self.first_call[id(module)] = where
        return True

    def optimizer_made(self, optimizer: torch.optim.Optimizer) -> None:
        if len(self.made) < 256:
            self.made.append(weakref.ref(optimizer))

    def add_optimizer(self, optimizer: torch.optim.Optimizer, where: Location | None) -> bool:
        if any(o is optimizer for o in self.optimizers):
            return False
        self.optimizers.append(optimizer)
        if where is not None:
            self.optimizer_lines[id(optimizer)] = where
        return True

    def named_parameters(self) -> list[tuple[str, torch.nn.Parameter, torch.nn.Module]]:
        seen: set[int] = set()
        found = []
        for model in self.models:
            for name, param in model.named_parameters():
                if param.requires_grad and id(param) not in seen:
                    seen.add(id(param))
                    found.append((f"{type(model).__name__}.{name}", param, model))
        return found

    def check_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """At an optimizer's first step: its parameters that got no or an all-zero gradient."""
        if id(optimizer) in self.checked_optimizers:
            return
        self.checked_optimizers.add(id(optimizer))
        in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
        for name, param, model in self.named_parameters():
            if id(param) not in in_optimizer:
                continue
            if param.grad is None:
                self.without_grad.setdefault(name, definition(model, name, self.user))
            elif not bool(param.grad.detach().any()):
                self.zero_grad.setdefault(name, definition(model, name, self.user))

    def check_unused_after_backward(self, reached: set[int]) -> None:
        """No optimizer ever stepped (a hand-written update, function mode without one): the
        parameters that no complete backward reached (`reached`: ids seen with a gradient right
        after a backward, so a `zero_grad` before the run stopped does not count)."""
        for name, param, model in self.named_parameters():
            if id(param) not in reached:
                self.without_grad.setdefault(name, definition(model, name, self.user))

    def not_in_optimizer(self, copied_from: dict[int, int] | None = None) -> dict[str, Any]:
        """Trainable parameters of the models seen that no optimizer made holds (one that has
        not stepped yet within the bound counts), less two kinds of model that are meant to be
        outside every optimizer: one whose weights are copied from parameters an optimizer
        holds (a DQN's target network, `target.load_state_dict(online.state_dict())`;
        `copied_from` maps written memory to its source), and, once a backward reached some
        parameter, one no backward reached (a teacher, an EMA or target model run under
        `no_grad` or detached). A model left out of the optimizer by mistake still gets its
        gradients, and is still reported."""
        if not self.optimizers:
            return {}
        made = [o for ref in self.made if (o := ref()) is not None]
        optimizers = [
            *self.optimizers,
            *(o for o in made if all(o is not s for s in self.optimizers)),
        ]
        held_params = [p for o in optimizers for g in o.param_groups for p in g["params"]]
        held = {id(p) for p in held_params}
        held_memory = {_pointer(p) for p in held_params} if copied_from else set()
        copies = copied_from or {}
        reached = self.got_grad
        found = {}
        for name, param, model in self.named_parameters():
            if id(param) in held:
                continue
            if reached and id(param) not in reached:
                continue  # frozen by use: no backward ever reached it
            if copies.get(_pointer(param), -1) in held_memory:
                continue  # mirrors a trained parameter
            found[name] = definition(model, name, self.user)
        return found


def _pointer(t: torch.Tensor) -> int | None:
    try:
        return t.data_ptr()
    except RuntimeError:  # no storage: never matches a copy
        return None


def definition(model: torch.nn.Module, qualified: str, user: UserCode) -> Location | None:
    """Where the submodule holding parameter `Model.a.b.weight` was assigned (`self.b = ...`)."""
    parts = qualified.split(".")[1:-1]
    owner: Any = model
    location: Location | None = None
    for part in parts:
        found = _assignment(type(owner), part, user)
        if found is not None:
            location = found
        owner = getattr(owner, part, None)
        if owner is None:
            break
    if location is None and not parts:
        location = _assignment(type(model), qualified.split(".")[-1], user)
    return location


def _assignment(cls: type, attribute: str, user: UserCode) -> Location | None:
    init = getattr(cls, "__init__", None)
    code = getattr(init, "__code__", None)
    filename = user.filename(code) if code is not None else None
    if filename is None:
        return None  # a library class: its source is not the user's to fix
    return _find(filename, cls.__name__, attribute)


@functools.lru_cache(maxsize=256)
def _find(filename: str, class_name: str, attribute: str) -> Location | None:
    tree = _parse(filename)
    if tree is None:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for inner in ast.walk(node):
                targets = []
                if isinstance(inner, ast.Assign):
                    targets = inner.targets
                elif isinstance(inner, ast.AnnAssign):
                    targets = [inner.target]
                for target in targets:
                    if (
                        isinstance(target, ast.Attribute)
                        and target.attr == attribute
                        and isinstance(target.value, ast.Name)
                        and target.value.id == "self"
                    ):
                        return _node_location(filename, inner)
    return None


@functools.lru_cache(maxsize=64)
def _parse(filename: str) -> ast.AST | None:
    try:
        with open(filename, "rb") as handle:
            return ast.parse(handle.read(), filename)
    except (OSError, SyntaxError, ValueError):
        return None


def _node_location(filename: str, node: ast.stmt) -> Location:
    import os

    # ast columns are UTF-8 byte offsets, like co_positions: converted once, at report time.
    end_col = node.end_col_offset if node.end_lineno == node.lineno else None
    return Location(os.path.realpath(filename), node.lineno, node.col_offset, node.lineno, end_col)
