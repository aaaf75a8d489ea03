"""Loading what the user asked to run: a script as `__main__`, or setup/step functions.

In: the request's file and `name` or `path.py:name` references. Out: callables, or
`SetupError` when a file or function cannot be found (a problem with the request, not a bug in
the user's code, so it is reported as an error rather than as a finding).
"""

from __future__ import annotations

import builtins
import importlib.util
import inspect
import linecache
import os
import re
import runpy
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


class SetupError(RuntimeError):
    """The target could not be loaded as requested."""


def run_script(file: str, argv: list[str], source: str | None = None) -> None:
    """Run `file` like `python file args...`: as `__main__`, its folder first on sys.path.
    With `source` (a notebook's code cells), that text runs instead, under `file`'s name, and
    tracebacks and the report read its lines, not the notebook's JSON."""
    sys.argv = [file, *argv]
    sys.path.insert(0, os.path.dirname(file))
    if source is None:
        runpy.run_path(file, run_name="__main__")
        return
    lines = source.splitlines(keepends=True)
    linecache.cache[file] = (len(source), None, lines, file)
    main = ModuleType("__main__")
    main.__file__ = file
    main.__builtins__ = builtins
    previous = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    try:
        exec(compile(source, file, "exec"), main.__dict__)
    finally:
        if previous is not None:
            sys.modules["__main__"] = previous


_MODULES: dict[str, ModuleType] = {}


def load_module(path: str) -> ModuleType:
    if path in _MODULES:
        return _MODULES[path]
    if not os.path.isfile(path):
        raise SetupError(f"file not found: {path}")
    stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0]) or "target"
    name = stem if stem not in sys.modules else f"{stem}__torchls_probe"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SetupError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, os.path.dirname(path))
    spec.loader.exec_module(module)
    _MODULES[path] = module
    return module


def find_function(reference: str, default_file: str, what: str) -> Callable[..., Any]:
    """`name` in the target file, or `other.py:name` (relative to the target's folder)."""
    path, _, name = reference.rpartition(":")
    if not path:
        path = default_file
    elif not os.path.isabs(path):
        path = os.path.join(os.path.dirname(default_file), path)
    module = load_module(os.path.abspath(path))
    function = module
    for part in name.split("."):
        function = getattr(function, part, None)
        if function is None:
            raise SetupError(f"the {what} function {name!r} was not found in {path}")
    if not callable(function):
        raise SetupError(f"the {what} entry {name!r} in {path} is not callable")
    return function


def call_setup(setup: Callable[..., Any], device: Any, extra: dict[str, Any]) -> Any:
    """setup(device, **extra) when it takes a positional parameter, else setup(**extra)."""
    try:
        parameters = inspect.signature(setup).parameters.values()
    except (TypeError, ValueError):
        return setup(device, **extra)
    positional = [
        p
        for p in parameters
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in extra
    ]
    if positional or any(p.kind == p.VAR_POSITIONAL for p in parameters):
        return setup(device, **extra)
    return setup(**extra)


def step_arguments(result: Any) -> tuple[tuple, dict]:
    """What setup returned, as the step's arguments: tuple -> args, dict -> kwargs."""
    if result is None:
        return (), {}
    if isinstance(result, dict):
        return (), dict(result)
    if isinstance(result, (tuple, list)):
        return tuple(result), {}
    return (result,), {}
