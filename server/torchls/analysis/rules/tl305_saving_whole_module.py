"""TL305 saving-whole-module: `torch.save(model, path)` pickles an `nn.Module`
instead of its weights.

Only a value known to be a module counts (not a name alone). In: the file's `Facts`.
Out: `Hit`s with an unsafe fix saving `model.state_dict()`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts, ObjectKind
from torchls.analysis.findings import Fix
from torchls.analysis.registry import Hit, exemption, rule
from torchls.analysis.rules._checkpoints import SAVE
from torchls.analysis.rules._edits import replace_node


def _module_on_every_branch(facts: Facts, target: ast.expr) -> bool:
    """Every binding of the name `target` in its function is a module built in sight
    (`net = Net()`) or the result of `torch.load(...)` (a run resumed from a whole pickled
    module), and one of them is the former: `net = Net() if fresh else torch.load(path)`
    in two branches."""
    if not isinstance(target, ast.Name):
        return False
    bindings = facts.assignments_of(target.id, facts.scope(target))
    built = False
    for binding in bindings:
        value = binding.value
        if binding.index is not None or binding.loop is not None or value is None:
            return False
        if isinstance(value, ast.Call) and facts.call_qualname(value) == "torch.load":
            continue
        kind = facts.kind_of(value)
        if kind is None or kind.kind != "model" or kind.by_name:
            return False
        built = True
    return built


@exemption("TL305", "neg_state_dict_under_model_names.py")
def _not_known_a_module(facts: Facts, target: ast.expr, kind: ObjectKind | None) -> bool:
    """The saved name is not known to hold a module: no construction, annotation or wrapper in
    sight says so, only its name (`model_state = model.state_dict()`), which decides nothing."""
    return (kind is None or kind.by_name) and not _module_on_every_branch(facts, target)


@exemption("TL305", "neg_saved_value_known_not_a_module.py")
def _known_not_a_module(kind: ObjectKind | None) -> bool:
    """The saved value is known to be something other than a module, such as the dict
    `model.state_dict()` returns: saving it is the recommended way."""
    return kind is not None and kind.kind != "model"


@rule(
    "TL305",
    "saving-whole-module",
    "I",
    "torch.save(model) pickles the class instead of saving the weights",
    fix="unsafe",
)
def saving_whole_module(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    `torch.save(model, path)` where `model` is an `nn.Module`: built from a module class in
    sight, or a parameter annotated as one; also the network a parallel wrapper holds
    (`torch.save(net.module, path)`), and a name that is either such a module or, when the
    run resumes, what `torch.load` returned (`net = Net()` / `net = torch.load(path)`).

    ## Why it is wrong
    Pickling the module stores a reference to its class and module path, not just tensors.
    The file breaks when the code is refactored or moved, cannot be loaded with
    `weights_only=True` (the default since PyTorch 2.6), and drags along anything the model
    references.

    ## Example
    ```python
    torch.save(model, "model.pt")              # TL305
    ```

    ## Fix
    `torch.save(model.state_dict(), "model.pt")` and rebuild the model before
    `load_state_dict`. Offered as an unsafe fix: the loading side must change too.
    """
    for call in facts.calls_to(*SAVE):
        if not call.args or not isinstance(call.args[0], (ast.Name, ast.Attribute)):
            continue
        target = call.args[0]
        kind = facts.kind_of(target)
        if (kind is None or kind.by_name) and (
            isinstance(target, ast.Attribute) and target.attr == "module"
        ):
            kind = facts.kind_of(target.value)  # `net.module` of a DataParallel-wrapped net
        if _not_known_a_module(facts, target, kind):
            continue  # a name like `model_state` says nothing about what is saved
        if _known_not_a_module(kind):
            continue
        text = facts.source.segment(target)
        yield Hit(
            target,
            f"`torch.save({text}, ...)` pickles the whole module (class and import path); save "
            f"`{text}.state_dict()` instead",
            Fix(
                "unsafe",
                f"Save `{text}.state_dict()`",
                (replace_node(facts, target, f"{text}.state_dict()"),),
            ),
        )
