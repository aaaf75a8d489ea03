"""The report's schema check: the one validator both sides of the probe run.

In: a decoded JSON document and `report.schema.json` (next to this file). Out: the problems,
each "path: what is wrong" (`findings[3].line: expected integer`), at most a handful; an empty
list means the document follows the schema. The probe checks its report before writing it; the
server loads this same file (by path, from the probe folder it copies into every run) and checks
every report it reads, because the run's code can write that file.

Only the part of JSON Schema (2020-12) the report's schema uses is understood: `type`, `enum`,
`const`, `properties`, `required`, `additionalProperties`, `items`, `minItems`, `maxItems`,
`minimum`, `maximum`, `minLength`, `maxLength`, `pattern`, `anyOf`, `$ref` into `$defs`. A
keyword outside that set is an error in the schema itself (so the file cannot silently mean more
than is checked); `tests/probe/test_report_schema.py` holds this validator to `jsonschema`.
Standard library only: it runs inside the user's interpreter next to torch.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

SCHEMA_FILE = Path(__file__).with_name("report.schema.json")
MAX_PROBLEMS = 5

_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}
_KNOWN = {
    "$schema",
    "$id",
    "$defs",
    "$comment",
    "title",
    "description",
    "type",
    "enum",
    "const",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "anyOf",
    "$ref",
}


class SchemaError(Exception):
    """The schema file itself uses a keyword this validator does not check."""


@cache
def load(path: str = str(SCHEMA_FILE)) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        schema = json.load(handle)
    _check_keywords(schema, "#")
    return schema


def problems(document: Any, schema: dict[str, Any] | None = None) -> list[str]:
    """Where `document` breaks the schema (first `MAX_PROBLEMS`); [] when it follows it."""
    root = schema if schema is not None else load()
    found: list[str] = []
    _check(document, root, root, "", found)
    return found


def fit(document: Any, schema: dict[str, Any] | None = None) -> Any:
    """`document` with every string and list cut to the schema's `maxLength`/`maxItems`: the
    probe's own text (a warning, an exception message, a module path) can be as long as the
    user's code makes it, and a report must not be lost over one long message."""
    root = schema if schema is not None else load()
    return _fit(document, root, root)


def _resolve(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    reference = node.get("$ref")
    return root["$defs"][reference[len("#/$defs/") :]] if reference else node


def _fit(value: Any, node: dict[str, Any], root: dict[str, Any]) -> Any:
    node = _resolve(node, root)
    for option in node.get("anyOf", ()):
        option = _resolve(option, root)
        kinds = option.get("type")
        allowed = [kinds] if isinstance(kinds, str) else kinds or list(_TYPES)
        if any(_TYPES[kind](value) for kind in allowed):
            return _fit(value, option, root)
    if isinstance(value, str) and "maxLength" in node:
        return value[: node["maxLength"]]
    if isinstance(value, list):
        kept = value[: node.get("maxItems", len(value))]
        items = node.get("items")
        return [_fit(item, items, root) for item in kept] if items else kept
    if isinstance(value, dict):
        properties = node.get("properties", {})
        extra = node.get("additionalProperties")
        fitted = {}
        for key, item in value.items():
            sub = properties.get(key, extra if isinstance(extra, dict) else None)
            fitted[key] = _fit(item, sub, root) if sub is not None else item
        return fitted
    return value


def _check_keywords(node: Any, where: str) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key not in _KNOWN:
                raise SchemaError(f"{where}: keyword {key!r} is not checked here")
            if key in ("properties", "$defs"):
                for name, sub in value.items():
                    _check_keywords(sub, f"{where}/{key}/{name}")
            elif key in ("items", "additionalProperties"):
                _check_keywords(value, f"{where}/{key}")
            elif key == "anyOf":
                for index, sub in enumerate(value):
                    _check_keywords(sub, f"{where}/anyOf/{index}")


def _name(path: str) -> str:
    return path or "(report)"


def _check(
    value: Any, node: dict[str, Any], root: dict[str, Any], path: str, found: list[str]
) -> None:
    if len(found) >= MAX_PROBLEMS:
        return
    if "$ref" in node:
        reference = node["$ref"]
        if not reference.startswith("#/$defs/"):
            raise SchemaError(f"unsupported reference {reference!r}")
        node = root["$defs"][reference[len("#/$defs/") :]]
    if "anyOf" in node:
        for option in node["anyOf"]:
            trial: list[str] = []
            _check(value, option, root, path, trial)
            if not trial:
                break
        else:
            found.append(f"{_name(path)}: matches none of the allowed forms")
            return
    kinds = node.get("type")
    if kinds is not None:
        allowed = [kinds] if isinstance(kinds, str) else kinds
        if not any(_TYPES[kind](value) for kind in allowed):
            found.append(f"{_name(path)}: expected {' or '.join(allowed)}, got {_json_type(value)}")
            return
    if "const" in node and not _same(value, node["const"]):
        found.append(f"{_name(path)}: expected {node['const']!r}")
        return
    if "enum" in node and not any(_same(value, option) for option in node["enum"]):
        found.append(f"{_name(path)}: {_short(value)} is not one of {node['enum']}")
        return
    if isinstance(value, str):
        if len(value) > node.get("maxLength", len(value)):
            found.append(f"{_name(path)}: longer than {node['maxLength']} characters")
        if len(value) < node.get("minLength", 0):
            found.append(f"{_name(path)}: shorter than {node['minLength']} characters")
        if "pattern" in node and re.search(node["pattern"], value) is None:
            found.append(f"{_name(path)}: {_short(value)} does not match {node['pattern']}")
    elif _TYPES["number"](value):
        if "minimum" in node and value < node["minimum"]:
            found.append(f"{_name(path)}: {value} is below {node['minimum']}")
        if "maximum" in node and value > node["maximum"]:
            found.append(f"{_name(path)}: {value} is above {node['maximum']}")
    elif isinstance(value, list):
        if len(value) > node.get("maxItems", len(value)):
            found.append(f"{_name(path)}: more than {node['maxItems']} items")
            return  # walking an oversized list is what the bound is there to prevent
        if len(value) < node.get("minItems", 0):
            found.append(f"{_name(path)}: fewer than {node['minItems']} items")
        if "items" in node:
            for index, item in enumerate(value):
                _check(item, node["items"], root, f"{path}[{index}]", found)
    elif isinstance(value, dict):
        for key in node.get("required", ()):
            if key not in value:
                found.append(f"{_name(path)}: missing {key!r}")
        properties = node.get("properties", {})
        extra = node.get("additionalProperties", True)
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if key in properties:
                _check(item, properties[key], root, where, found)
            elif extra is False:
                found.append(f"{_name(path)}: unknown field {_short(key)}")
            elif isinstance(extra, dict):
                _check(item, extra, root, where, found)


def _same(value: Any, expected: Any) -> bool:
    # JSON Schema: true is not 1, while 1 and 1.0 are the same number.
    return (type(value) is type(expected) and value == expected) or (
        _TYPES["number"](value) and _TYPES["number"](expected) and value == expected
    )


def _json_type(value: Any) -> str:
    for kind in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _TYPES[kind](value):
            return kind
    return type(value).__name__


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
