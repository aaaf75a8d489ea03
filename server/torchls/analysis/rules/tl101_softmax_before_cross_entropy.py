"""TL101 `softmax-before-cross-entropy`: cross-entropy fed a softmax (or log-softmax)
output rather than logits, with a fix that passes the logits when the softmax is local.
"""

from __future__ import annotations

from collections.abc import Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.losses import loss_related
from torchls.analysis.registry import Hit, rule
from torchls.analysis.rules._losses import (
    _input_rule,
    chosen_lead,
    chosen_loss_inputs,
    chosen_related,
    describe,
    library_loop_inputs,
    related_for,
)


@rule(
    "TL101",
    "softmax-before-cross-entropy",
    "E",
    "Cross-entropy gets softmax output instead of logits",
    fix="safe",
)
def softmax_before_cross_entropy(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    The input of `nn.CrossEntropyLoss` / `F.cross_entropy` is already a softmax (or
    log-softmax, or `exp(log_softmax(...))`) output: directly, through local variables and
    shape-only methods (`.view()`, `.reshape()`, `.squeeze()`), through a helper's parameter
    (a cross-entropy wrapper, an `nn.Sequential` head passed to a custom module), or because
    the model's `forward` (or an `nn.Sequential`) ends in a softmax, also in another project
    file. A module kept on `self` is followed also when the class builds it in either arm of
    an `if` (reported only when every arm ends in a softmax), and a wrapper module whose
    `forward` runs a module it is handed (`self.wrap(x, nn.Sequential(self.fc, self.softmax))`)
    outputs what that module does; a head a method attaches to the module it is handed
    (`module.probe = Probe()` in a callback's set-up hook, the only such assignment in the
    file) is followed into the method of that class that runs it; a row taken by looping
    over a softmax output is still one. A network a function is handed only by callers in
    other project files (`client.fit(net=copy.deepcopy(global_net))` in the script) is what
    those callers pass. Explicit `forward` calls count as the calls they stand for
    (`loss_fn.forward(net.forward(x), y)`), and an `nn.Sequential()` filled by
    `add_module(...)` statements ends in the layer the last of them adds (not known, so not
    reported, when a layer is added under a branch or a loop).
    A loss passed as a default argument counts, also one a constructor stores on `self`
    (`def __init__(self, loss=nn.CrossEntropyLoss()): self.loss = loss`); a loss name bound
    to different kinds on different paths (CTC in one branch, cross-entropy in the other) is
    not reported. A project loss module whose `forward` hands its input to `F.cross_entropy`,
    also after reshaping or selecting it (`p.permute(0, 2, 3, 1)[mask].view(-1, c)`), counts
    as cross-entropy. A loop a library owns is checked too: a skorch net (or a project
    subclass of one that keeps skorch's loss step) built with `criterion=nn.CrossEntropyLoss`
    and a module class whose `forward` ends in a softmax
    (`NeuralNetClassifier(Net, criterion=nn.CrossEntropyLoss)`); other wrappers are not
    followed. When an
    `if` chooses the model or the tensor (`model = A()` / `model = B()`, a module-level choice
    read by the training function included), a choice that feeds a softmax is reported with
    the line of that choice; a softmax in `forward` under `if self.flag:`, with the flag a
    constructor parameter the model is built with set (or left by default) to a false
    constant, is a path that never runs and is not reported.

    A base class's method that runs `self(x)` (or `self.forward(x)`) runs the `forward` of
    the object's class: a subclass (in the same file or in another project file that imports
    the base) that keeps that method and what it calls on `self` (the loss included) but
    whose `forward` ends in a softmax is a path of its own, reported with the line of that
    class. A subclass's own override of a method the inherited one calls
    (`self.head_loss(pred, y)` in the base's training step) gets what that step computes on
    an object of the subclass: the subclass's `forward` output, also unpacked from a tuple.
    Softmax outputs joined by `torch.cat` / `torch.stack` (a tensor grown in a loop from
    `torch.tensor([])` included) or cut by a mask or slices (`p[mask == 1]`, `p[:, :k]`)
    are still softmax outputs. A loss object of a project class with `__call__` kept on
    `self` (`self.objective = SmoothedCE(0.1)` in the constructor, its class in this file or
    another) runs that `__call__`, whose cross-entropy gets what the call passes.
    A loss object a setting picks (`self.criterion = nn.CrossEntropyLoss()` in one arm of a
    config test, `nn.NLLLoss()` in the other, maybe in a base class's `fit` in another file;
    or a `None` placeholder a set-up method replaces) is cross-entropy on the paths that pick
    it: a softmax output fed to it is reported, unless the call itself sits under a test of
    the same setting (each arm may prepare its own input).

    ## Why it is wrong
    Cross-entropy applies `log_softmax` to its input itself. Feeding it probabilities squashes
    the logits twice: the loss stays high, gradients shrink, and training stalls or converges to
    a worse model without any error.

    ## Example
    ```python
    probs = F.softmax(model(x), dim=1)
    loss = F.cross_entropy(probs, y)      # TL101
    ```

    ## Fix
    Pass the raw logits: `loss = F.cross_entropy(model(x), y)`; keep the softmax only for
    metrics or inference. The fix is applied automatically when the softmax is local.
    """
    for loss_call, origins, fix in _input_rule(
        facts, {"CrossEntropyLoss"}, {"softmax", "log_softmax"}, "softmax", True
    ):
        yield Hit(
            loss_call.input,  # type: ignore[arg-type]
            f"{loss_call.loss} input {describe(facts, loss_call.input, origins[0])} is already "
            "a softmax output; cross-entropy expects raw logits",
            fix,
            related_for(facts, origins, "softmax") + loss_related(facts, loss_call),
        )
    for chosen, origins in chosen_loss_inputs(facts, "CrossEntropyLoss", {"softmax"}):
        yield Hit(
            chosen.input,
            f"{chosen_lead(facts, chosen)} {describe(facts, chosen.input, origins[0])} is "
            "already a softmax output; cross-entropy expects raw logits",
            None,
            related_for(facts, origins, "softmax") + chosen_related(facts, chosen),
        )
    for loop, origins in library_loop_inputs(facts, "CrossEntropyLoss", {"softmax", "log_softmax"}):
        yield Hit(
            loop.module,
            f"the net trains {describe(facts, loop.module, origins[0])} with CrossEntropyLoss, but "
            "its forward output is already a softmax output; cross-entropy expects raw logits",
            None,
            related_for(facts, origins, "softmax"),
        )
