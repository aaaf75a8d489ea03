"""Documentation of the codes torchls reports that are no static check: TL000 and the TL9xx.

In: nothing. Out: `PROBE_RULES`, code → `Rule` (name and severity from the catalog, a doc in
the four usual sections, a check that finds nothing), so `torchls rule TL907` and the editor's
"show documentation" explain such a finding like any other; and `CHECKER_CODES`, the ones
`torchls check` reports by itself. TL000 is the checker's syntax error
(`torchls.checker.PARSE_FAILURE_CODE`: the analysis does not import the checker, a test keeps
the two equal); the TL9xx are findings of runtime runs. None of them is in the static registry:
`all_rules()` and `--select` cover only what `torchls check` runs, the README table and
docs/rules.md list that plus `CHECKER_CODES`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from torchls.analysis.registry import SEVERITY_LETTERS, Hit, Rule

if TYPE_CHECKING:
    from torchls.analysis.facts import Facts

# Reported by `torchls check` itself, whatever the selection: no option, configuration or
# suppression comment hides them, so the docs offer no way to silence them.
CHECKER_CODES: frozenset[str] = frozenset({"TL000"})


def _not_from_the_source(facts: Facts) -> Iterator[Hit]:
    """These findings come from a run or from the parser; reading the facts finds none."""
    return iter(())


_DOCS: dict[str, tuple[str, str, str, str]] = {
    "TL000": (
        "syntax-error",
        "E",
        "The file does not parse: the part Python could not read was not checked",
        """
        ## What it catches
        A file, or a notebook's code cell, that Python cannot parse, at the line and column
        where Python stops. No other rule ran on the lines the error hides (on the whole file
        when nothing parsed); the part that does parse is still checked and reported.

        ## Why it is wrong
        Python will not run the file, and a check that skipped it quietly would pass code
        nobody analysed. So a syntax error is an error finding in every output format and
        fails the check (exit status 1, 0 with `--exit-zero`), whatever the selection:
        `--select TL000` and `--ignore TL000` are refused as usage errors, a configuration's
        `select` or `ignore` naming it only gets a warning, and `# noqa` does not silence it.

        ## Example
        ```python
        def half_typed(:      # TL000: invalid syntax
            pass
        ```

        ## Fix
        None automatic: correct the syntax at the reported place (a notebook's finding names
        the cell), then check again.
        """,
    ),
    "TL901": (
        "first-non-finite",
        "E",
        "The first NaN/Inf of a run, on the line that produced it",
        """
        ## What it catches
        The first NaN or Inf a bounded run produced, with its phase (input, forward, loss,
        backward, optimizer step) and the user line that made it from finite values.

        ## Why it is wrong
        One non-finite value spreads to every parameter within a step or two; by the time the
        loss prints `nan` the line that started it is long gone.

        ## Example
        ```python
        probs = torch.softmax(logits, dim=1)
        loss = -(y * torch.log(probs)).sum()     # TL901: log(0) in the forward pass
        ```

        ## Fix
        Guard the operation the finding names (`log_softmax` instead of `log(softmax)`, a
        clamp or eps, a lower learning rate when it starts in the step).
        """,
    ),
    "TL902": (
        "parameter-without-gradient",
        "W",
        "A trainable parameter got no gradient, or is in no optimizer",
        """
        ## What it catches
        A trainable parameter whose gradient was missing or all zero at its optimizer's first
        step (an unused layer, a detached branch), or one that no optimizer updates.

        ## Why it is wrong
        The parameter never learns: the layer keeps its initial weights while the rest of the
        model trains around it, and nothing reports an error.

        ## Example
        ```python
        def forward(self, x):
            return self.head(self.body(x).detach())   # TL902: self.body gets no gradient
        ```

        ## Fix
        Connect the layer to the loss (drop the `.detach()`, use the layer), or freeze it on
        purpose with `requires_grad_(False)`; pass every trainable parameter to an optimizer.
        """,
    ),
    "TL903": (
        "loss-contract-violated",
        "E",
        "The tensors reaching a loss break its contract at run time",
        """
        ## What it catches
        At a loss call, on the real tensors: probabilities passed as logits, float or
        out-of-range class targets, `[N, 1]` against `[N]` broadcasting, and the other
        contracts TL1xx can only guess statically.

        ## Why it is wrong
        Most such mismatches do not raise: the loss computes a number, just not the intended
        one, and training quietly optimises the wrong objective.

        ## Example
        ```python
        loss = F.mse_loss(model(x), y)    # TL903: [64, 1] against [64] broadcasts to [64, 64]
        ```

        ## Fix
        Make the shapes and value ranges match what the loss expects; the finding names the
        tensor and what it held.
        """,
    ),
    "TL904": (
        "runtime-warning",
        "I",
        "A warning raised during the run, on the user line that caused it",
        """
        ## What it catches
        A Python or PyTorch warning raised while the bounded run executed, placed on the
        innermost user line on the stack rather than inside the library.

        ## Why it is wrong
        Warnings flag deprecated calls and implicit behaviour (an implicit softmax dimension,
        a broadcasting loss) that may change or already misbehave.

        ## Example
        ```python
        probs = F.softmax(logits)        # TL904: implicit dimension choice is deprecated
        ```

        ## Fix
        Follow the warning's advice at that line.
        """,
    ),
    "TL905": (
        "probe-error",
        "E",
        "The repro raised; the finding sits on the innermost user line",
        """
        ## What it catches
        The bounded run raised an exception, exited non-zero or crashed; the finding is placed
        on the innermost user line of the traceback and names the operation that was running.

        ## Why it is wrong
        The same error would stop the real training run, usually after a much longer start-up.

        ## Example
        ```python
        out = model(x.view(-1, 784))     # TL905: shape '[-1, 784]' is invalid for the input
        ```

        ## Fix
        Fix the error at the line shown; the run's report keeps the full traceback.
        """,
    ),
    "TL906": (
        "probe-limit",
        "W",
        "The repro was stopped by a time, memory or output limit",
        """
        ## What it catches
        The bounded run hit one of its limits (wall clock, CPU time, memory, output) before it
        finished; the finding sits on the user line that was running.

        ## Why it is wrong
        Findings after that point are missing, and a limit hit in a few steps often means an
        unintended loop, a huge allocation or a data loader that never ends.

        ## Example
        ```python
        for batch in itertools.cycle(loader):   # TL906: never ends within the time limit
            step(batch)
        ```

        ## Fix
        Shorten the repro (fewer steps, a smaller batch) or raise the limit if the work is
        intended.
        """,
    ),
    "TL907": (
        "loss-diverging",
        "W",
        "Loss or gradient norm explodes within the bounded steps",
        """
        ## What it catches
        Within the steps of a bounded run, the loss grows by orders of magnitude, the gradient
        norm explodes, or an optimizer update is larger than the weights it changes. The
        finding sits on the optimizer's construction (its learning rate) or on the loss line,
        with the step and the figures.

        ## Why it is wrong
        A run that diverges this early rarely recovers: it ends in NaNs or in a model stuck
        at a useless point, usually after hours of compute.

        ## Example
        ```python
        optimizer = torch.optim.SGD(model.parameters(), lr=10.0)   # TL907
        ```

        ## Fix
        Lower the learning rate (or add warmup), clip gradients, or check the loss scale
        (a sum where a mean was meant).
        """,
    ),
    "TL908": (
        "collective-hang",
        "E",
        "A collective that not every rank reached (distributed repro)",
        """
        ## What it catches
        In a distributed repro (`--nproc N`), a collective (`barrier`, `all_reduce`, ..., the
        construction of `DistributedDataParallel` or its backward) that a rank waited in for
        the collective timeout (`--collective-timeout`, 5 s) while the others had finished or
        waited elsewhere, with every rank's stack at that moment and the branch around it.

        ## Why it is wrong
        The ranks that did enter wait forever: the job hangs until a timeout, typically with
        no error message on any rank.

        ## Example
        ```python
        if rank == 0:
            dist.all_reduce(metric)     # TL908: the other ranks never get here
        ```

        ## Fix
        Call the collective on every rank, outside rank-specific branches (see TL801).
        """,
    ),
    "TL909": (
        "rank-divergence",
        "E",
        "Replicated parameters or buffers differ across ranks after a step",
        """
        ## What it catches
        In a distributed repro (`--nproc N`), parameters or buffers that should hold the same
        values on every rank differ at a step boundary: those of a model wrapped in
        `DistributedDataParallel`, of one whose tensors the script all-reduces or broadcasts,
        or, in a script that sets up a process group, of a model trained on every rank. It
        names the first differing tensor, the ranks and the largest difference, and sits at
        the cause where the run shows one: replicas already different before the first step
        were made different where they were made, so the finding is on the per-rank seed
        (`torch.manual_seed(base + rank)`), else on the line that built the model (never
        broadcast), with the construction and the model's first use as related locations;
        replicas that drift later are reported at the first use. `# noqa: TL909` on the
        finding's line or on the model's first use says a model per rank is meant.

        ## Why it is wrong
        Data-parallel training assumes identical replicas; once they drift, each rank trains
        a different model, and the checkpoint saved by rank 0 is just one of them.

        ## Example
        ```python
        torch.manual_seed(rank)          # TL909: each rank starts from different weights
        model = Net()
        ```

        ## Fix
        Build the model with the same seed everywhere (or broadcast rank 0's state), and keep
        updates inside DistributedDataParallel or a synchronised optimizer.
        """,
    ),
    "TL910": (
        "rank-data-overlap",
        "W",
        "Ranks got the same samples, or an epoch repeats the previous order",
        """
        ## What it catches
        In a distributed repro (`--nproc N`) of data-parallel training, ranks that received
        the same samples from a loader (every batch fingerprinted sample by sample), or a
        `DistributedSampler` whose epoch never changes, so each epoch repeats the order.
        Shared samples from a loader without a `DistributedSampler` are reported where the
        run saw the `DataLoader` built, since that is the line to change, with the loop that
        read them as related information; from a loader that has one (built with the wrong
        rank or world size, say), and when the construction is not known, at that loop.
        `# noqa: TL910` on either line silences it.

        ## Why it is wrong
        Duplicated samples waste the extra GPUs (the effective batch is smaller than it looks)
        and a repeated order removes the shuffling between epochs.

        ## Example
        ```python
        loader = DataLoader(dataset, batch_size=64, shuffle=True)   # TL910: no sampler
        ```

        ## Fix
        Use a `DistributedSampler` and call `sampler.set_epoch(epoch)` every epoch.
        """,
    ),
    "TL911": (
        "checkpoint-not-weights-only",
        "E",
        "A checkpoint file that weights_only loading refuses (torchls inspect)",
        """
        ## What it catches
        Found by `torchls inspect` on a checkpoint file: `torch.load(weights_only=True)`
        refuses it, listing the pickled globals that block it and where in the file's
        structure they sit.

        ## Why it is wrong
        `weights_only=True` is the default since PyTorch 2.6, so the file fails to load as it
        is, and loading it with `weights_only=False` runs whatever code the pickle names.

        ## Example
        ```python
        torch.save({"model": model.state_dict(), "args": args}, "last.pt")  # TL911 on last.pt
        ```

        ## Fix
        Save plain data (`vars(args)`, `dataclasses.asdict(cfg)`, state dicts), or allow-list
        the classes you trust with `torch.serialization.add_safe_globals`.
        """,
    ),
}

PROBE_RULES: dict[str, Rule] = {
    code: Rule(
        code,
        name,
        SEVERITY_LETTERS[severity],
        summary,
        "none",
        doc,
        _not_from_the_source,
    )
    for code, (name, severity, summary, doc) in _DOCS.items()
}
