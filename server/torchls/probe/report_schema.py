"""The report schema as the server applies it: the probe's own validator, loaded from the file.

In: a decoded report. Out: its problems against `torchls_probe/report.schema.json` ("path:
what is wrong"), [] when it follows the schema. The validator and the schema live once, in the
probe package that every run gets a copy of; the server never imports that package (it runs in
the user's interpreter, next to torch), so the one stdlib module is loaded here by its path.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from types import ModuleType
from typing import Any

from torchls.probe.locate import probe_package


@lru_cache(maxsize=1)
def _validator() -> ModuleType:
    path = probe_package() / "schema.py"
    spec = importlib.util.spec_from_file_location("torchls_report_schema", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the report schema's validator from {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def schema_path() -> str:
    return str(probe_package() / "report.schema.json")


def problems(document: Any) -> list[str]:
    """Where `document` breaks the report schema (at most a handful), [] when it follows it."""
    validator = _validator()
    return list(validator.problems(document, validator.load(schema_path())))


def schema() -> dict[str, Any]:
    validator = _validator()
    return dict(validator.load(schema_path()))
