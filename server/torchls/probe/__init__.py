"""torchls.probe: run a bounded, sandboxed repro of a training step and read its report.

The server side of the runtime probe. It never imports torch or pygls: it starts the user's
interpreter on `torchls_probe` (shipped in the same distribution) inside a sandbox, supervises
it and returns a `ReproReport`. Entry points:

- `run_repro(path, options, on_progress=..., cancel_event=...)`: one cold run.
- `ReproSession`: keeps a warm worker per interpreter and forks a fresh child per run.
"""

from torchls.probe.options import ReproOptions, ReproUsageError
from torchls.probe.report import ProbeFinding, RelatedLocation, ReproReport
from torchls.probe.runner import ProgressEvent, ReproCancelled, run_repro
from torchls.probe.spec import ReproSpec, SpecError, load_spec
from torchls.probe.warm import ReproSession

__all__ = [
    "ProbeFinding",
    "ProgressEvent",
    "RelatedLocation",
    "ReproCancelled",
    "ReproOptions",
    "ReproReport",
    "ReproSession",
    "ReproSpec",
    "ReproUsageError",
    "SpecError",
    "load_spec",
    "run_repro",
]
