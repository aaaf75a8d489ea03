"""Training loops a library owns: a skorch net built with a module and a criterion.

Why: `NeuralNet(MyModule, criterion=nn.CrossEntropyLoss)` never shows the loss call; skorch
runs `criterion(module(X), y)` in its own loop. The pairing of the module's `forward` output
with the criterion is still checkable, for known wrappers only (skorch's nets and project
subclasses of them that leave the step and the loss as skorch writes them); an unknown
wrapper may do anything between the two, so it stays quiet.

In: a file's `Facts`. Out: `LibraryLoop`s: the wrapper call, the module argument, the loss
kind of the criterion and the origins of the module's `forward` returns.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from torchls.analysis.objects import ClassRef, ObjectModel
from torchls.records import record

if TYPE_CHECKING:
    from torchls.analysis.facts import Facts, Origin
    from torchls.analysis.queries.vocabulary import ClassInfo

SKORCH_NETS = frozenset(
    {
        "skorch.NeuralNet",
        "skorch.net.NeuralNet",
        "skorch.NeuralNetClassifier",
        "skorch.classifier.NeuralNetClassifier",
        "skorch.NeuralNetBinaryClassifier",
        "skorch.classifier.NeuralNetBinaryClassifier",
        "skorch.NeuralNetRegressor",
        "skorch.regressor.NeuralNetRegressor",
    }
)
# Methods between the module's output and the criterion: a subclass that redefines one may
# change what the criterion sees.
STEP_METHODS = frozenset(
    {"infer", "get_loss", "train_step", "train_step_single", "validation_step", "evaluation_step"}
)
CRITERIA = {"CrossEntropyLoss", "BCEWithLogitsLoss"}


@record(frozen=True)
class LibraryLoop:
    """`call` builds a library net that trains `module` with a criterion of kind `loss`;
    `origins` are where the module's `forward` returns come from."""

    call: ast.Call
    module: ast.expr
    loss: str
    origins: tuple[Origin, ...]


def library_loops(facts: Facts) -> list[LibraryLoop]:
    found = []
    for call in facts.calls:
        # The explicit criterion first: it is what most calls lack, and the cheapest to see.
        criterion = next((k.value for k in call.keywords if k.arg == "criterion"), None)
        if criterion is None:
            continue
        module = _keyword_or_first(call, "module")
        if module is None or not _is_known_net(facts, call):
            continue
        loss = _criterion_kind(facts, criterion)
        klass = _module_class(facts, module)
        if loss is None or klass is None:
            continue
        owner, info = klass
        returns = owner._forward_returns(info, 0)
        if not returns:
            continue
        origins = [o for r in returns for o in facts._origins_in(owner, r, 0, ())]
        if origins:
            found.append(LibraryLoop(call, module, loss, tuple(origins)))
    return found


def _keyword_or_first(call: ast.Call, keyword: str) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == keyword:
            return kw.value
    if call.args and not isinstance(call.args[0], ast.Starred):
        return call.args[0]
    return None


def _criterion_kind(facts: Facts, criterion: ast.expr) -> str | None:
    """The loss kind of `criterion=nn.CrossEntropyLoss` (a class, as skorch takes it) or of
    `criterion=nn.CrossEntropyLoss()` (an instance)."""
    target = criterion.func if isinstance(criterion, ast.Call) else criterion
    qualname = facts.qualname(target) or ""
    if not qualname.startswith("torch.nn."):
        return None
    short = qualname.rsplit(".", 1)[-1]
    return short if short in CRITERIA else None


def _module_class(facts: Facts, module: ast.expr) -> tuple[Facts, ClassInfo] | None:
    """The project module class the net is handed: the class itself (skorch builds it) or
    an instance built in sight."""
    if isinstance(module, ast.Call):
        return facts.module_class_of_call(module)
    if not isinstance(module, ast.Name):
        return None
    ref = _class_ref(facts, module.id)
    if ref is None or "forward" not in ref.info.methods:
        return None
    return ref.facts, ref.info


def _class_ref(facts: Facts, name: str) -> ClassRef | None:
    local = facts.classes.get(name)
    if local is not None:
        return ClassRef(facts, local)
    definition = facts.definition(name)
    if definition is None or not isinstance(definition.node, ast.ClassDef):
        return None
    other = definition.facts.classes.get(definition.node.name)
    return ClassRef(definition.facts, other) if other is not None else None


def _is_known_net(facts: Facts, call: ast.Call) -> bool:
    """`call` builds a skorch net: one of skorch's, or a project subclass of one (in any
    file) that redefines none of the steps between the module's output and the loss."""
    if facts.call_qualname(call) in SKORCH_NETS:
        return True
    if not isinstance(call.func, ast.Name):
        return False
    ref = _class_ref(facts, call.func.id)
    if ref is None:
        return False
    lineage = facts.get(ObjectModel).lineage(ref)
    if any(STEP_METHODS & set(c.info.methods) for c in lineage):
        return False
    return any(c.facts.qualname(base) in SKORCH_NETS for c in lineage for base in c.info.node.bases)
