"""The optional YAML repro spec: which setup and step functions to run, and with what bounds.

In: a YAML file (read with `yaml.safe_load`). Out: a validated `ReproSpec`, or `SpecError` whose
message names the file and the offending key (unknown keys get a spelling suggestion). Example:

    step: train_step          # function in the target file, or "other.py:function"
    setup: make_batch         # called as setup(device) -> tuple (args) or dict (kwargs)
    setup_args: {batch_size: 8}
    steps: 1
    seed: 0
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

import yaml

from torchls.config import DEVICE_CHOICES
from torchls.records import field, record


class SpecError(ValueError):
    """The spec file is unreadable or invalid; the message says where and why."""


@record(frozen=True)
class ReproSpec:
    path: Path
    step: str
    setup: str | None = None
    setup_args: dict[str, Any] = field(default_factory=dict)
    steps: int | None = None
    batches: int | None = None
    seed: int | None = None
    deterministic: bool | None = None
    device: str | None = None
    allow_fallback: bool | None = None
    timeout: float | None = None
    memory: int | None = None


# key -> (accepted types, description used in messages)
_KEYS: dict[str, tuple[tuple[type, ...], str]] = {
    "step": ((str,), "a function name or 'file.py:function'"),
    "setup": ((str,), "a function name or 'file.py:function'"),
    "setup_args": ((dict,), "a mapping of keyword arguments"),
    "steps": ((int,), "a positive integer"),
    "batches": ((int,), "a positive integer"),
    "seed": ((int,), "an integer"),
    "deterministic": ((bool,), "true or false"),
    "device": ((str,), DEVICE_CHOICES),
    "allow_fallback": ((bool,), "true or false"),
    "timeout": ((int, float), "a number of seconds"),
    "memory": ((int,), "megabytes, an integer"),
}
_POSITIVE = {"steps", "batches", "timeout", "memory"}


def load_spec(path: str | Path) -> ReproSpec:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise SpecError(f"{path}: cannot read the spec: {error.strerror or error}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error)
        raise SpecError(f"{path}{where}: invalid YAML: {problem}") from None
    return parse_spec(data, path)


def parse_spec(data: Any, path: Path) -> ReproSpec:
    if not isinstance(data, dict):
        raise SpecError(f"{path}: the spec must be a mapping of keys (step, setup, ...)")
    for key in data:
        if not isinstance(key, str) or key not in _KEYS:
            close = difflib.get_close_matches(str(key), list(_KEYS), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            known = ", ".join(sorted(_KEYS))
            raise SpecError(f"{path}: unknown key {key!r}{hint} (known keys: {known})")
    for key, value in data.items():
        types, description = _KEYS[key]
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            raise SpecError(f"{path}: key {key!r} must be {description}, got {value!r}")
        if key in _POSITIVE and value <= 0:
            raise SpecError(f"{path}: key {key!r} must be positive, got {value!r}")
    if "step" not in data:
        raise SpecError(f"{path}: missing key 'step' (the function that runs one training step)")
    for key in data.get("setup_args", {}):
        if not isinstance(key, str) or not key.isidentifier():
            raise SpecError(f"{path}: setup_args key {key!r} must be a Python identifier")
    try:
        json.dumps(data.get("setup_args", {}), allow_nan=False)
    except (TypeError, ValueError):
        raise SpecError(
            f"{path}: key 'setup_args' must hold plain values (strings, numbers, lists, mappings)"
        ) from None
    return ReproSpec(path=path, **data)
