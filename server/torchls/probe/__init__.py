"""torchls.probe: run a bounded, sandboxed repro of a training step and read its report.

The server side of the runtime probe. It never imports torch or pygls: it starts the user's
interpreter on `torchls_probe` (shipped in the same distribution) inside a sandbox, supervises
it and returns a `ReproReport`. Entry points:

- `run_repro(path, options, on_progress=..., cancel_event=...)`: one cold run.
- `ReproSession`: keeps a warm worker per interpreter and forks a fresh child per run.
"""

from __future__ import annotations

import importlib
from typing import Any

# Loaded on first use, so that the server can import small helpers of this package (the
# untrusted-text functions, the safe source reader) without starting the whole probe machinery.
_HOMES = {
    "ReproOptions": "options",
    "ReproUsageError": "options",
    "ProbeFinding": "report",
    "RelatedLocation": "report",
    "ReproReport": "report",
    "ProgressEvent": "runner",
    "ReproCancelled": "runner",
    "run_repro": "runner",
    "ReproSpec": "spec",
    "SpecError": "spec",
    "load_spec": "spec",
    "ReproSession": "warm",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


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
