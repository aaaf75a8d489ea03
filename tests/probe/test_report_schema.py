"""The report schema is one file both sides hold the report to (issue #31, part 3).

Real runs of the real probe (CPU torch) write reports that follow
`torchls_probe/report.schema.json`; the stdlib validator both sides run (`torchls_probe.schema`)
agrees with `jsonschema` on those reports and on thousands of broken variants of them; the
TypedDicts readers are typed with (`torchls.probe.document`) have the schema's keys; a report that
breaks the schema is replaced by the probe, refused by the server, and said so.
"""

from __future__ import annotations

import copy
import json
import random
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from torchls.probe import ReproOptions, report_schema, run_repro
from torchls.probe.document import SCHEMA_OBJECTS
from torchls.probe.report import as_report, parse_probe_report, synthesize

pytest.importorskip("torch")

SCHEMA = report_schema.schema()
JSONSCHEMA = jsonschema.Draft202012Validator(SCHEMA)

SCRIPTS = {
    "clean": """\
import torch
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
""",
    "nonfinite": """\
import torch
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    x = torch.zeros(8, 4)
    loss = torch.log(model(x) * 0).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
""",
    "raises": """\
import torch
model = torch.nn.Linear(4, 2)
out = model(torch.randn(3, 5))
""",
    "warns": """\
import warnings
import torch
model = torch.nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
warnings.warn("a warning the user's code raises")
loss = torch.nn.functional.mse_loss(model(torch.randn(8, 3)), torch.randn(8))
loss.backward()
optimizer.step()
""",
}


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    found = {}
    for name, source in SCRIPTS.items():
        folder = tmp_path_factory.mktemp(name)
        path = folder / "train.py"
        path.write_text(source, encoding="utf-8")
        options = ReproOptions(python=sys.executable, timeout_s=60.0, sandbox="none", steps=2)
        found[name] = run_repro(path, options).data
    return found


def test_the_schema_is_valid_and_uses_only_what_the_validator_checks() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["properties"]["schema_version"] == {"const": 2}


def test_real_reports_follow_the_schema(reports: dict[str, dict[str, Any]]) -> None:
    statuses = {name: data["status"] for name, data in reports.items()}
    assert statuses == {"clean": "ok", "nonfinite": "ok", "raises": "error", "warns": "ok"}
    assert [f["code"] for f in reports["nonfinite"]["findings"]][:1] == ["TL901"]
    assert reports["raises"]["exception"]["kind"] == "user"
    assert any(f["code"] == "TL904" for f in reports["warns"]["findings"])
    for name, data in reports.items():
        assert list(JSONSCHEMA.iter_errors(data)) == [], name
        assert report_schema.problems(data) == [], name


def _paths(value: Any, path: tuple = ()) -> list[tuple]:
    found = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value[:3]):
            found += _paths(item, (*path, index))
    return found


def _set(document: Any, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        document = document[key]
    document[path[-1]] = value


def _get(document: Any, path: tuple) -> Any:
    for key in path:
        document = document[key]
    return document


BREAKS = ["x", -1, 1 << 40, 1.5, None, True, [], {}, [1] * 2001, "y" * 5000]


def test_the_validator_agrees_with_jsonschema_on_broken_reports(
    reports: dict[str, dict[str, Any]],
) -> None:
    """Every field of the real reports replaced by values of other types and ranges, and an
    unknown field added to every object: both validators accept or refuse each the same."""
    chooser = random.Random(31)
    refused = accepted = 0
    for data in reports.values():
        paths = [p for p in _paths(data) if p]
        for path in chooser.sample(paths, min(len(paths), 300)):
            for value in chooser.sample(BREAKS, 4):
                broken = copy.deepcopy(data)
                _set(broken, path, value)
                ours = report_schema.problems(broken)
                theirs = list(JSONSCHEMA.iter_errors(broken))
                assert bool(ours) == bool(theirs), (path, value, ours, theirs[:1])
                refused += bool(ours)
                accepted += not ours
        for path in _paths(data):
            if isinstance(_get(data, path), dict):
                broken = copy.deepcopy(data)
                _get(broken, path)["unexpected_field"] = 1
                ours = report_schema.problems(broken)
                assert bool(ours) == bool(list(JSONSCHEMA.iter_errors(broken))), path
    assert refused > 1000 and accepted > 50  # both kinds of verdict were really compared


def test_the_typed_records_have_the_schema_keys() -> None:
    for where, typed in SCHEMA_OBJECTS.items():
        if where == "#":
            node = SCHEMA
        elif where.startswith("#/$defs/"):
            node = SCHEMA["$defs"][where[len("#/$defs/") :]]
        else:
            node = SCHEMA["properties"][where]
        assert set(typed.__annotations__) | set(typed.__required_keys__) | set(
            typed.__optional_keys__
        ) == set(node["properties"]), where
        assert set(typed.__required_keys__) == set(node.get("required", [])), where


def test_every_strict_object_of_the_schema_has_a_typed_record() -> None:
    covered = {id(SCHEMA)}
    for where in SCHEMA_OBJECTS:
        if where.startswith("#/$defs/"):
            covered.add(id(SCHEMA["$defs"][where[len("#/$defs/") :]]))
        elif where != "#":
            covered.add(id(SCHEMA["properties"][where]))
    strict_top = [
        name
        for name, node in SCHEMA["properties"].items()
        if node.get("additionalProperties") is False and id(node) not in covered
    ]
    strict_defs = [
        name
        for name, node in SCHEMA["$defs"].items()
        if node.get("additionalProperties") is False and id(node) not in covered
    ]
    assert strict_top == [] and strict_defs == []


def test_a_report_for_a_run_that_wrote_none_follows_the_schema() -> None:
    data = synthesize(
        status="crashed",
        file="/p/train.py",
        message="killed",
        code="TL905",
        stopped_by="crash",
        request={"steps": 2, "timeout_s": 10.0, "device": "cpu"},
    )
    typed, broken = as_report(data)
    assert broken == [] and typed is not None and typed["findings"][0]["code"] == "TL905"
    assert list(JSONSCHEMA.iter_errors(data)) == []


def test_the_probe_replaces_a_report_that_breaks_the_schema(tmp_path: Path) -> None:
    """A bug that made the probe's report break the schema (simulated: its assembly adds a
    field the schema does not have) gives a TL905 that says so, not a silent partial report."""
    source = (
        "import torchls_probe.report as report\n"
        "honest = report.assemble\n"
        "def assemble(**kwargs):\n"
        "    data = honest(**kwargs)\n"
        "    data['bogus'] = 1\n"
        "    return data\n"
        "report.assemble = assemble\n"
    ) + SCRIPTS["clean"]
    path = tmp_path / "train.py"
    path.write_text(source, encoding="utf-8")
    report = run_repro(path, ReproOptions(python=sys.executable, timeout_s=60.0, sandbox="none"))
    assert report.status == "error"
    assert [f.code for f in report.findings] == ["TL905"]
    message = report.findings[0].message
    assert "internal error of torchls_probe" in message and "unknown field 'bogus'" in message
    assert list(JSONSCHEMA.iter_errors(report.data)) == []


def test_the_refusal_names_where_the_report_broke_it() -> None:
    data = synthesize(
        status="ok", file="/x.py", message="m", code="TL905", stopped_by="end", request={}
    )
    data["findings"][0]["related"] = [{"filename": "/x.py", "line": 1}]
    data, why = parse_probe_report(json.dumps(data))
    assert data is None and why is not None
    assert "findings[0].related[0]: missing 'column'" in why


def test_long_text_from_the_run_is_cut_to_the_schema_not_lost(tmp_path: Path) -> None:
    """An exception message of 100,000 characters and 3,000 distinct warnings are the user's
    code's doing: the report keeps them, cut to the schema's bounds, instead of being refused."""
    source = (
        "import warnings\n"
        "import torch\n"
        "for i in range(3000):\n"
        "    warnings.warn(f'warning number {i}')\n"
        "model = torch.nn.Linear(2, 2)\n"
        "raise ValueError('x' * 100_000)\n"
    )
    path = tmp_path / "train.py"
    path.write_text(source, encoding="utf-8")
    report = run_repro(path, ReproOptions(python=sys.executable, timeout_s=60.0, sandbox="none"))
    assert report.status == "error"
    exception = report.data["exception"]
    assert exception is not None and exception["type"] == "ValueError"
    assert 1000 <= len(exception["message"]) <= 4000
    assert all(len(f.message) <= 4000 for f in report.findings)
    assert len(report.data["warnings"]) <= 1000
    assert list(JSONSCHEMA.iter_errors(report.data)) == []
