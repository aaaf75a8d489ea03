"""What to run and within which bounds: the request the server hands the probe as JSON.

In: a dict parsed from JSON (the server writes it; a person may too, with `python -m
torchls_probe --request FILE`). Out: a validated `Request`, or `RequestError` naming the first
bad key. Paths are absolute by the time they get here; the server resolves them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DEVICES_HELP = "auto, cpu, cuda, cuda:N or mps"


class RequestError(ValueError):
    """The request is malformed; the message names the key."""


@dataclass
class Request:
    file: str
    mode: str = "script"
    root: str = ""
    cwd: str = ""  # where the script runs; empty: the root
    argv: list[str] = field(default_factory=list)
    step: str | None = None
    setup: str | None = None
    setup_args: dict[str, Any] = field(default_factory=dict)
    steps: int = 2
    batches: int | None = None
    device: str = "auto"
    allow_fallback: bool = False
    seed: int = 0
    deterministic: bool = False
    timeout_s: float = 60.0
    memory_mb: int = 4096
    output_cap_bytes: int = 1 << 20
    report_cap_bytes: int = 512 << 10
    max_entries_per_line: int = 8
    max_outputs: int = 4
    max_lines: int = 400
    max_events: int = 20
    out: str | None = None
    output_file: str | None = None
    rewrite: str | None = None  # inspect mode: where to write the plain-data copy
    initial_save: str | None = None  # --compare baseline: the models' weights at first call
    initial_load: str | None = None  # --compare candidate: start from the baseline's weights
    command: str = ""
    # A notebook's code cells as one script (`file` names the notebook): run instead of the
    # file's own text, attributed to `file` with rows of that script.
    source: str | None = None
    # A rank of a distributed repro (`torchls repro --nproc N`): the report file of each local
    # rank, the shared exchange folder, the collective timeout, when torchrun was launched.
    distributed: dict[str, Any] | None = None

    @property
    def batch_cap(self) -> int:
        return self.batches if self.batches is not None else self.steps


# key -> accepted python types; bool is checked before int because bool subclasses int.
_TYPES: dict[str, tuple[type, ...]] = {
    "file": (str,),
    "mode": (str,),
    "root": (str,),
    "cwd": (str,),
    "argv": (list,),
    "step": (str, type(None)),
    "setup": (str, type(None)),
    "setup_args": (dict,),
    "steps": (int,),
    "batches": (int, type(None)),
    "device": (str,),
    "allow_fallback": (bool,),
    "seed": (int,),
    "deterministic": (bool,),
    "timeout_s": (int, float),
    "memory_mb": (int,),
    "output_cap_bytes": (int,),
    "report_cap_bytes": (int,),
    "max_entries_per_line": (int,),
    "max_outputs": (int,),
    "max_lines": (int,),
    "max_events": (int,),
    "out": (str, type(None)),
    "output_file": (str, type(None)),
    "rewrite": (str, type(None)),
    "initial_save": (str, type(None)),
    "initial_load": (str, type(None)),
    "command": (str,),
    "source": (str, type(None)),
    "distributed": (dict, type(None)),
}


def parse_request(data: Any) -> Request:
    if not isinstance(data, dict):
        raise RequestError("the request must be a JSON object")
    unknown = sorted(set(data) - set(_TYPES) - {"version"})
    if unknown:
        raise RequestError(f"unknown request key {unknown[0]!r}")
    if "file" not in data:
        raise RequestError("missing request key 'file'")
    for key, value in data.items():
        if key == "version":
            continue
        expected = _TYPES[key]
        wrong_bool = isinstance(value, bool) and bool not in expected
        if wrong_bool or not isinstance(value, expected):
            names = " or ".join(t.__name__ for t in expected).replace("NoneType", "null")
            raise RequestError(f"request key {key!r} must be {names}, got {value!r}")
    request = Request(**{k: v for k, v in data.items() if k != "version"})
    _check_values(request)
    return request


def _check_values(request: Request) -> None:
    if request.mode not in ("script", "function", "inspect"):
        raise RequestError(
            f"request key 'mode' must be 'script', 'function' or 'inspect', got {request.mode!r}"
        )
    if request.mode == "function" and not request.step:
        raise RequestError("function mode needs the key 'step'")
    for key in ("steps", "memory_mb", "output_cap_bytes", "report_cap_bytes"):
        if getattr(request, key) < 1:
            raise RequestError(f"request key {key!r} must be at least 1")
    if request.batches is not None and request.batches < 1:
        raise RequestError("request key 'batches' must be at least 1")
    if request.timeout_s <= 0:
        raise RequestError("request key 'timeout_s' must be positive")
    if not all(isinstance(arg, str) for arg in request.argv):
        raise RequestError("request key 'argv' must be a list of strings")
    block = request.distributed
    if block is not None:
        reports = block.get("reports")
        if not isinstance(reports, list) or not all(isinstance(r, str) for r in reports):
            raise RequestError("request key 'distributed' needs 'reports', a list of paths")
        if not isinstance(block.get("exchange"), str):
            raise RequestError("request key 'distributed' needs 'exchange', a folder")
    if not valid_device(request.device):
        raise RequestError(f"request key 'device' must be {DEVICES_HELP}, got {request.device!r}")


def valid_device(text: str) -> bool:
    if text in ("auto", "cpu", "cuda", "mps"):
        return True
    prefix, _, index = text.partition(":")
    return prefix == "cuda" and index.isdigit()
