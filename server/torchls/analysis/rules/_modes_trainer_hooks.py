"""TL203's questions about a training step a library's loop runs: the loss hook of a
`transformers.Trainer` subclass (`compute_loss(self, model, inputs)`, run by the Trainer's own
loop on every training step right after it puts `model` in train mode, and backwarded there)
that, itself or in a method of its class it calls, puts the trained model in eval mode, under
its own name or under another attribute the class binds to it (`self.teacher = self.model`),
before the model runs again in that step.

Why a module of its own: `_modes.py` is at its size limit, and the loop is out of sight (in
the library): what is known is the hook's contract, not a loop.
In: `Facts` and nodes. Out: (eval() call, alias binding or None) for each such switch.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts, FunctionNode
from torchls.analysis.objects import ClassRef, ObjectModel
from torchls.analysis.registry import exemption

# The hook the Trainer's loop runs for each training step, with the model it trains.
_LOSS_HOOK = "compute_loss"


def _library_trainer(facts: Facts, ref: ClassRef) -> bool:
    """`ref` or one of its project bases subclasses a Trainer of transformers or trl."""
    for klass in facts.get(ObjectModel).lineage(ref):
        for base in klass.info.bases:
            root = base.split(".")[0]
            if root in ("transformers", "trl") and base.endswith("Trainer"):
                return True
    return False


def evals_in_training_steps(facts: Facts) -> Iterator[tuple[ast.Call, ast.AST | None]]:
    """(eval() call, binding): in a library Trainer subclass, `compute_loss` or a method of
    the class it passes its model to (a few calls down) calls `eval()` on that model, on
    `self.model`, or on `self.<attr>` that some method binds to `self.model` (`binding`),
    and the model is used after it in that function with no `train()` in between. An eval()
    under a test of `.training` (or in an arm whose other arm calls `train()`) is left out."""
    for info in facts.classes.values():
        hook = info.methods.get(_LOSS_HOOK)
        if hook is None or not _library_trainer(facts, ClassRef(facts, info)):
            continue
        params = [a.arg for a in [*hook.args.posonlyargs, *hook.args.args]]
        if len(params) < 2:
            continue
        aliases = {
            f"self.{attr}": value
            for attr, values in info.attributes.items()
            for value in values
            if facts.key(value) == "self.model"
        }
        todo: list[tuple[FunctionNode, str, int]] = [(hook, params[1], 0)]
        visited: set[int] = set()
        while todo:
            function, model, depth = todo.pop()
            if id(function) in visited or depth > 3:
                continue
            visited.add(id(function))
            trained = {model, "self.model"}
            for call in facts.calls_in(function):
                helper = facts.called_function(call)
                if helper is not None and facts.enclosing_class(helper) is info.node:
                    passed = _parameter_receiving(helper, call, model)
                    if passed is not None:
                        todo.append((helper, passed, depth + 1))
                if facts.method_name(call) != "eval" or call.args or call.keywords:
                    continue
                key = facts.key(facts.receiver(call))
                if key not in trained and key not in aliases:
                    continue
                if _guarded(facts, call, function) or not _used_after(facts, function, call, model):
                    continue
                yield call, aliases.get(key)


def _parameter_receiving(helper: FunctionNode, call: ast.Call, name: str) -> str | None:
    """The helper's parameter that `call` passes the local `name` to (by position or
    keyword)."""
    params = [a.arg for a in [*helper.args.posonlyargs, *helper.args.args]]
    if params and params[0] == "self" and isinstance(call.func, ast.Attribute):
        params = params[1:]
    for position, argument in enumerate(call.args):
        if isinstance(argument, ast.Starred):
            return None
        if isinstance(argument, ast.Name) and argument.id == name and position < len(params):
            return params[position]
    for keyword in call.keywords:
        if isinstance(keyword.value, ast.Name) and keyword.value.id == name and keyword.arg:
            return keyword.arg
    return None


@exemption("TL203", "neg_trainer_loss_hook_keeps_train_mode.py")
def _guarded(facts: Facts, call: ast.Call, function: FunctionNode) -> bool:
    """The eval() runs under an `if` (or `while`) whose test reads `.training`, or in an arm
    of an `if` whose other arm calls `train()`: a mode chosen on purpose."""
    child: ast.AST = call
    current = facts.parents.get(call)
    while current is not None and current is not function:
        if isinstance(current, (ast.If, ast.While, ast.IfExp)):
            test = current.test
            if any(isinstance(n, ast.Attribute) and n.attr == "training" for n in ast.walk(test)):
                return True
            if isinstance(current, ast.If):
                other = current.orelse if child in current.body else current.body
                if any(
                    isinstance(n, ast.Call) and facts.method_name(n) == "train"
                    for s in other
                    for n in ast.walk(s)
                ):
                    return True
        child, current = current, facts.parents.get(current)
    return False


def _used_after(facts: Facts, function: FunctionNode, switch: ast.Call, model: str) -> bool:
    """After `switch` in `function`, the trained model (`model` or `self.model`) is read
    again with gradients on (a forward under `no_grad` is the evaluation eval() was for),
    and no `train()` call comes before that read."""
    after = (switch.end_lineno or switch.lineno, switch.end_col_offset or 0)
    reads = []
    for node in facts.walk_local(function):
        if (getattr(node, "lineno", 0), getattr(node, "col_offset", 0)) <= after:
            continue
        if isinstance(node, ast.Call) and facts.method_name(node) == "train":
            reads.append((node.lineno, node.col_offset, False))
        elif _reads_model(facts, node, model) and not facts._in_no_grad_block(node):
            reads.append((getattr(node, "lineno", 0), getattr(node, "col_offset", 0), True))
    reads.sort()
    return bool(reads) and reads[0][2]


def _reads_model(facts: Facts, node: ast.AST, model: str) -> bool:
    """`node` reads the trained model: the hook's model parameter or `self.model`, other
    than asking its `.training` flag."""
    parent = facts.parents.get(node)
    if isinstance(parent, ast.Attribute) and parent.attr == "training":
        return False
    if isinstance(node, ast.Name):
        return node.id == model and isinstance(node.ctx, ast.Load)
    return isinstance(node, ast.Attribute) and facts.key(node) == "self.model"
