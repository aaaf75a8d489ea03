"""Incremental re-analysis (`analysis/incremental.py`): after an edit, only the statements it
can affect are analysed again, and the findings are exactly those of a whole-file analysis.

The parity tests edit every top-level function and class of the bundled examples and of
the rule fixtures three ways (deleted, moved down two rows, body emptied with the row count
kept), in both directions (the edit, and its undoing), and compare the incremental result
with a fresh analysis of the same text: code, position, message, fix and related spans."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from torchls.analysis import Finding, Span, analyze
from torchls.analysis.incremental import plan
from torchls.analysis.source import parse_source, reparse

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = sorted((ROOT / "tests" / "rules" / "fixtures").rglob("*.py"))
EXAMPLES = sorted((ROOT / "examples").rglob("*.py"))


def edits(text: str) -> list[tuple[str, str]]:
    """(name, edited text) for each top-level def and class of `text`."""
    lines = text.split("\n")
    out: list[tuple[str, str]] = []
    for stmt in ast.parse(text).body:
        if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        first = min([stmt.lineno, *(d.lineno for d in stmt.decorator_list)])
        last = stmt.end_lineno or stmt.lineno
        out.append((f"delete {stmt.name}", "\n".join(lines[: first - 1] + lines[last:])))
        moved = [*lines[: first - 1], "# moved", "", *lines[first - 1 :]]
        out.append((f"move {stmt.name}", "\n".join(moved)))
        body = stmt.body[0]
        start = min([body.lineno, *(d.lineno for d in getattr(body, "decorator_list", ()))])
        if start > stmt.lineno:
            indent = lines[start - 1][: len(lines[start - 1]) - len(lines[start - 1].lstrip())]
            hollow = [*lines[: start - 1], indent + "pass", *[""] * (last - start), *lines[last:]]
            out.append((f"empty {stmt.name}", "\n".join(hollow)))
    return out


def shown(findings: list[Finding]) -> list[tuple[object, ...]]:
    return [(f.code, f.span, f.message, f.fix, f.related) for f in findings]


def incremental(before: str, after: str, filename: str) -> list[Finding] | None:
    earlier = analyze(before, filename)
    if earlier.parsed is None or earlier.error:
        return None
    result = analyze(after, filename, previous=earlier.parsed, previous_findings=earlier.findings)
    return result.findings


def parity_failures(path: Path) -> list[str]:
    text = path.read_text()
    try:
        ast.parse(text)
    except SyntaxError:
        return []
    failures = []
    for name, edited in edits(text):
        for before, after, direction in ((text, edited, "edit"), (edited, text, "undo")):
            got = incremental(before, after, str(path))
            if got is None:
                continue
            want = analyze(after, str(path)).findings
            if shown(got) != shown(want):
                failures.append(f"{path.name}: {direction} of {name}")
    return failures


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_edit_of_an_example_gives_the_findings_of_a_whole_analysis(path: Path) -> None:
    assert parity_failures(path) == []


def test_every_edit_of_a_rule_fixture_gives_the_findings_of_a_whole_analysis() -> None:
    failures = [failure for path in FIXTURES for failure in parity_failures(path)]
    assert len(FIXTURES) > 100
    assert failures == []


INDEPENDENT = """
import torch
import torch.nn as nn
import torch.nn.functional as F


def helper_a(model, loader, opt):
    criterion = nn.CrossEntropyLoss()
    for x, y in loader:
        opt.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        opt.step()


def helper_b(model, loader, opt):
    criterion = nn.CrossEntropyLoss()
    for x, y in loader:
        opt.zero_grad()
        loss = criterion(F.softmax(model(x), dim=1), y)
        loss.backward()
        opt.step()


class SoftNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(8, 4)

    def forward(self, x):
        return F.softmax(self.layer(x), dim=1)


def helper_c(loader):
    model = SoftNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    criterion = nn.CrossEntropyLoss()
    for x, y in loader:
        opt.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        opt.step()
"""


def statement_names(parsed_body: list[ast.stmt], indexes: frozenset[int]) -> set[str]:
    return {getattr(parsed_body[i], "name", "?") for i in indexes}


def test_an_edit_in_one_function_re_analyses_that_function_alone() -> None:
    earlier = analyze(INDEPENDENT, "train.py")
    assert [(f.code, f.span.start.row) for f in earlier.findings] == [
        ("TL101", 20),
        ("TL101", 40),
    ]
    edited = INDEPENDENT.replace(
        "loss = criterion(model(x), y)", "loss = criterion(F.softmax(model(x), dim=1), y)", 1
    )
    assert earlier.parsed is not None
    parsed = reparse(earlier.parsed, edited)
    reduced = plan(parsed, earlier.findings)
    assert reduced is not None
    assert statement_names(parsed.tree.body, reduced.affected) == {"helper_a"}
    # The reduced module: the imports and helper_a, nothing else.
    assert [type(s).__name__ for s in reduced.parsed.tree.body] == [
        "Import",
        "Import",
        "Import",
        "FunctionDef",
    ]
    # The other two findings are the earlier ones, kept as they were.
    assert [f for f in reduced.kept] == earlier.findings


def test_a_callee_edit_re_analyses_its_callers_and_their_findings_follow() -> None:
    earlier = analyze(INDEPENDENT, "train.py")
    assert earlier.parsed is not None
    edited = INDEPENDENT.replace("return F.softmax(self.layer(x), dim=1)", "return self.layer(x)")
    parsed = reparse(earlier.parsed, edited)
    reduced = plan(parsed, earlier.findings)
    assert reduced is not None
    assert statement_names(parsed.tree.body, reduced.affected) == {"SoftNet", "helper_c"}
    earlier = analyze(INDEPENDENT, "train.py")
    result = analyze(
        edited, "train.py", previous=earlier.parsed, previous_findings=earlier.findings
    )
    assert [(f.code, f.span.start.row) for f in result.findings] == [("TL101", 20)]


def test_rows_added_above_move_the_kept_findings_and_messages_naming_rows_are_redone() -> None:
    earlier = analyze(INDEPENDENT, "train.py")
    assert earlier.parsed is not None
    edited = INDEPENDENT.replace("def helper_a(", "# two new rows\n\ndef helper_a(", 1)
    result = analyze(
        edited, "train.py", previous=earlier.parsed, previous_findings=earlier.findings
    )
    assert shown(result.findings) == shown(analyze(edited, "train.py").findings)
    assert [(f.code, f.span.start.row) for f in result.findings] == [("TL101", 22), ("TL101", 42)]
    assert "line 33" in result.findings[1].message  # the softmax's row, moved too


def test_an_import_edit_or_an_edit_reaching_most_of_the_file_analyses_it_whole() -> None:
    earlier = analyze(INDEPENDENT, "train.py")
    assert earlier.parsed is not None
    with_import = INDEPENDENT.replace("import torch\n", "import torch\nimport math\n", 1)
    assert plan(reparse(earlier.parsed, with_import), earlier.findings) is None
    earlier = analyze(INDEPENDENT, "train.py")
    assert earlier.parsed is not None
    everything = INDEPENDENT.replace(
        "criterion = nn.CrossEntropyLoss()", "criterion = nn.NLLLoss()"
    )
    assert plan(reparse(earlier.parsed, everything), earlier.findings) is None


def test_without_an_earlier_parse_relation_there_is_no_plan() -> None:
    fresh = parse_source(INDEPENDENT)
    assert plan(fresh, []) is None


def test_a_finding_between_statements_comes_from_the_reduced_analysis() -> None:
    earlier = analyze(INDEPENDENT, "train.py")
    assert earlier.parsed is not None
    edited = INDEPENDENT.replace("def helper_a(", "# a note\ndef helper_a(", 1)
    reduced = plan(reparse(earlier.parsed, edited), earlier.findings)
    assert reduced is not None
    comment_row = edited.split("\n").index("# a note") + 1
    between = Finding(
        "TL999", "on a comment", "information", Span.of(comment_row, 0, comment_row, 8)
    )
    inside_kept = Finding("TL999", "in helper_b", "information", reduced.kept[0].span)
    merged = reduced.merge([between, inside_kept])
    assert between in merged  # no statement owns the row: the reduced analysis answers for it
    assert inside_kept not in merged  # helper_b was not re-analysed: its earlier findings stand
