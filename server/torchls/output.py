"""Rendering check results and rule docs for people (text) and tools (json, sarif, github).

In: `FileReport`s from `torchls.checker`, or `Rule`s from the registry. Out: strings; nothing
here writes to a stream or decides an exit code. Findings carry 1-based rows and 0-based
code-point columns; every format here shows 1-based columns (what editors and ruff show).
The JSON shape is a public contract (see design.md): change it only with the contract.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from torchls import __version__
from torchls.analysis import Edit, Finding, Position, Rule, all_rules, get_rule
from torchls.analysis.probe_rules import CHECKER_CODES
from torchls.checker import PARSE_FAILURE_CODE, FileReport
from torchls.notebook import cell_finding
from torchls.records import record

SARIF_SCHEMA = (
    "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
)
SARIF_SRCROOT = "%SRCROOT%"


@record(frozen=True)
class Style:
    """ANSI styling, or none: decided once by the CLI (TTY, NO_COLOR, --color)."""

    enabled: bool = False

    def _wrap(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.enabled else text

    def bold(self, text: str) -> str:
        return self._wrap(text, "1")

    def code(self, text: str) -> str:
        return self._wrap(text, "1;31")

    def marker(self, text: str) -> str:
        return self._wrap(text, "36")

    def dim(self, text: str) -> str:
        return self._wrap(text, "2")

    def good(self, text: str) -> str:
        return self._wrap(text, "32")


def is_fixable(finding: Finding, unsafe_fixes: bool) -> bool:
    """Whether `--fix` would apply this finding's fix under the current flags."""
    if finding.fix is None:
        return False
    return finding.fix.applicability == "safe" or unsafe_fixes


def all_findings(reports: Iterable[FileReport]) -> list[tuple[FileReport, Finding]]:
    return [(report, finding) for report in reports for finding in report.findings]


def placed(report: FileReport, finding: Finding) -> tuple[int | None, Finding]:
    """The finding as the user reads the file: in a notebook, its cell number and the finding
    with rows counted in that cell (messages say cell lines too); elsewhere (None, it)."""
    if report.cells is None:
        return None, finding
    return cell_finding(finding, report.cells)


def _where(report: FileReport, cell: int | None) -> str:
    return report.display if cell is None else f"{report.display}:cell {cell}"


# --- text ------------------------------------------------------------------------------------


def text_findings(reports: Sequence[FileReport], unsafe_fixes: bool, style: Style) -> str:
    """One `path:row:col: CODE [*] message` line per finding."""
    lines = []
    for report, found in all_findings(reports):
        cell, finding = placed(report, found)
        start = finding.span.start
        where = f"{style.bold(_where(report, cell))}:{start.row}:{start.column + 1}:"
        marker = f" {style.marker('[*]')}" if is_fixable(finding, unsafe_fixes) else ""
        lines.append(f"{where} {style.code(finding.code)}{marker} {finding.message}")
    return "\n".join(lines) + ("\n" if lines else "")


def text_summary(
    reports: Sequence[FileReport],
    fix: bool,
    unsafe_fixes: bool,
    style: Style,
    incomplete: bool = False,
) -> str:
    """The closing lines: fixed count (with --fix), findings by severity, and what --fix could
    do. `incomplete`: some paths could not be read, so "All checks passed!" would be a lie."""
    findings = [finding for _, finding in all_findings(reports)]
    lines = []
    fixed = sum(report.fixed for report in reports)
    if fix and fixed:
        lines.append(f"Fixed {_plural(fixed, 'finding')}.")
    if not findings:
        if incomplete:
            lines.append("No findings in the files checked; some paths could not be checked.")
        else:
            lines.append(style.good("All checks passed!"))
        return "\n".join(lines) + "\n"
    lines.append(f"Found {severity_counts(findings)}.")
    fixable = sum(is_fixable(f, unsafe_fixes) for f in findings)
    hidden = sum(f.fix is not None and not is_fixable(f, unsafe_fixes) for f in findings)
    hint = _fix_hint(fixable, hidden, fix, unsafe_fixes)
    if hint:
        lines.append(hint)
    return "\n".join(lines) + "\n"


SEVERITY_WORDS = (("error", "error", "errors"), ("warning", "warning", "warnings"))


def severity_counts(findings: Sequence[Finding]) -> str:
    """`3 findings (1 error, 1 warning, 1 advice)`: E, W and I are not all errors (the README
    defines E as a definite bug), so the total says which is which."""
    counts = Counter(finding.severity for finding in findings)
    parts = [
        _plural(counts[severity], one, many)
        for severity, one, many in SEVERITY_WORDS
        if counts[severity]
    ]
    if advice := len(findings) - sum(counts[severity] for severity, _, _ in SEVERITY_WORDS):
        parts.append(f"{advice} advice")
    return f"{_plural(len(findings), 'finding')} ({', '.join(parts)})"


def _fix_hint(fixable: int, hidden: int, fix: bool, unsafe_fixes: bool) -> str:
    hidden_note = (
        f"{_plural(hidden, 'hidden fix', 'hidden fixes')} can be enabled with the "
        "--unsafe-fixes option"
    )
    if fixable and not fix:
        option = "--fix --unsafe-fixes options" if unsafe_fixes else "--fix option"
        text = f"[*] {fixable} fixable with the {option}"
        return f"{text} ({hidden_note})." if hidden else f"{text}."
    if hidden:
        return f"No fixes available ({hidden_note})."
    return ""


def _plural(count: int, singular: str, plural: str | None = None) -> str:
    return f"{count} {singular if count == 1 else plural or singular + 's'}"


# --- statistics ------------------------------------------------------------------------------


@record(frozen=True)
class Statistic:
    """One row of `--statistics`: a rule and how many findings it had."""

    code: str
    name: str
    count: int
    fixable: bool


def statistics(reports: Sequence[FileReport], unsafe_fixes: bool) -> list[Statistic]:
    """Counts per code, most frequent first (ties by code), as `ruff --statistics` orders."""
    findings = [finding for _, finding in all_findings(reports)]
    counts = Counter(f.code for f in findings)
    fixable = {f.code for f in findings if is_fixable(f, unsafe_fixes)}
    out = []
    for code, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        rule = get_rule(code)
        name = rule.name if rule else ""
        out.append(Statistic(code, name, count, code in fixable))
    return out


def text_statistics(stats: Sequence[Statistic], style: Style) -> str:
    if not stats:
        return ""
    count_width = max(len(str(s.count)) for s in stats)
    code_width = max(len(s.code) for s in stats)
    lines = [
        f"{s.count:>{count_width}}\t{style.code(s.code.ljust(code_width))}\t"
        f"{style.marker('[*]') if s.fixable else '[ ]'} {s.name}"
        for s in stats
    ]
    return "\n".join(lines) + "\n"


def json_statistics(stats: Sequence[Statistic]) -> str:
    rows = [{"code": s.code, "name": s.name, "count": s.count, "fixable": s.fixable} for s in stats]
    return json.dumps(rows, indent=2) + "\n"


# --- json (the public contract) --------------------------------------------------------------


def _location(position: Position) -> dict[str, int]:
    return {"row": position.row, "column": position.column + 1}


def _edit_json(edit: Edit) -> dict[str, Any]:
    return {
        "content": edit.content,
        "location": _location(edit.span.start),
        "end_location": _location(edit.span.end),
    }


def finding_json(report: FileReport, found: Finding) -> dict[str, Any]:
    """One finding in ruff's JSON shape; `url` stays null until rule docs are published. In a
    notebook `cell` is the cell's number (1-based over all cells) and rows count in that
    cell, each fix edit's in its own (`cell` on the edit); elsewhere `cell` is null."""
    cell, finding = placed(report, found)
    fix = finding.fix
    edits = [_edit_json(edit) for edit in fix.edits] if fix is not None else []
    if cell is not None and found.fix is not None and report.cells is not None:
        for edit, row in zip(edits, found.fix.edits, strict=True):
            edit["cell"] = report.cells.locate(row.span.start.row)[0]
    return {
        "filename": report.filename,
        "cell": cell,
        "code": finding.code,
        "message": finding.message,
        "severity": finding.severity,
        "location": _location(finding.span.start),
        "end_location": _location(finding.span.end),
        "fix": None
        if fix is None
        else {
            "applicability": fix.applicability,
            "message": fix.message,
            "edits": edits,
        },
        "url": None,
    }


def json_findings(reports: Sequence[FileReport]) -> str:
    rows = [finding_json(report, finding) for report, finding in all_findings(reports)]
    return json.dumps(rows, indent=2, ensure_ascii=False) + "\n"


# --- github actions annotations --------------------------------------------------------------

_GITHUB_LEVEL = {"error": "error", "warning": "warning", "information": "notice"}


def _github_escape(text: str, property_value: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if property_value:
        text = text.replace(":", "%3A").replace(",", "%2C")
    return text


def github_findings(reports: Sequence[FileReport]) -> str:
    """Workflow commands that GitHub Actions turns into inline annotations on the diff."""
    lines = []
    for report, found in all_findings(reports):
        cell, finding = placed(report, found)
        start, end = finding.span.start, finding.span.end
        title = finding.code if cell is None else f"{finding.code} (cell {cell})"
        props = ",".join(
            [
                f"file={_github_escape(report.display, True)}",
                f"line={start.row}",
                f"col={start.column + 1}",
                f"endLine={end.row}",
                f"endColumn={end.column + 1}",
                f"title={_github_escape(title, True)}",
            ]
        )
        message = f"{_where(report, cell)}:{start.row}:{start.column + 1}: {finding.code} "
        message += finding.message
        lines.append(f"::{_GITHUB_LEVEL[finding.severity]} {props}::{_github_escape(message)}")
    return "\n".join(lines) + ("\n" if lines else "")


# --- sarif (code scanning) -------------------------------------------------------------------

_SARIF_LEVEL = {"error": "error", "warning": "warning", "information": "note"}


def _sarif_region(start: Position, end: Position) -> dict[str, int]:
    return {
        "startLine": start.row,
        "startColumn": start.column + 1,
        "endLine": end.row,
        "endColumn": end.column + 1,
    }


def _sarif_artifact(report: FileReport) -> dict[str, str]:
    """Where a file is: relative to %SRCROOT% (the working folder) when inside it, which is
    what code scanning maps onto the repository, else an absolute file URI."""
    from urllib.parse import quote  # here: only SARIF output needs it

    display = report.display
    if display == "-" or not os.path.isabs(display):
        return {"uri": quote(display.replace(os.sep, "/")), "uriBaseId": SARIF_SRCROOT}
    return {"uri": Path(display).as_uri()}


def _sarif_result(report: FileReport, found: Finding, index: dict[str, int]) -> dict[str, Any]:
    artifact = _sarif_artifact(report)
    cell, finding = placed(report, found)
    location: dict[str, Any] = {
        "physicalLocation": {
            "artifactLocation": artifact,
            "region": _sarif_region(finding.span.start, finding.span.end),
        }
    }
    if cell is not None:
        # SARIF has no notion of cells: the region counts rows in the cell named here.
        location["properties"] = {"cell": cell}
    result: dict[str, Any] = {
        "ruleId": finding.code,
        "level": _SARIF_LEVEL[finding.severity],
        "message": {"text": finding.message},
        "locations": [location],
    }
    if finding.code in index:
        result["ruleIndex"] = index[finding.code]
    if finding.fix is not None and cell is None:
        # (A notebook's edits count rows in cells, not in the file a SARIF fix would edit.)
        replacements = [
            {
                "deletedRegion": _sarif_region(edit.span.start, edit.span.end),
                "insertedContent": {"text": edit.content},
            }
            for edit in finding.fix.edits
        ]
        result["fixes"] = [
            {
                "description": {"text": finding.fix.message},
                "artifactChanges": [{"artifactLocation": artifact, "replacements": replacements}],
            }
        ]
    if finding.fix is not None:
        result["properties"] = {"fixApplicability": finding.fix.applicability}
    return result


def _first_section(doc: str) -> str:
    """The text of a rule doc's first section ("What it catches"), as one paragraph."""
    match = re.search(r"^## [^\n]*\n(.*?)(?=^## |\Z)", doc, re.MULTILINE | re.DOTALL)
    body = match.group(1) if match else doc
    return " ".join(body.split())


def sarif_rule(rule: Rule) -> dict[str, Any]:
    """A rule's reportingDescriptor: id, name, descriptions, help and default level."""
    return {
        "id": rule.code,
        "name": rule.name,
        "shortDescription": {"text": rule.summary},
        "fullDescription": {"text": _first_section(rule.doc) or rule.summary},
        "help": {"text": rule.doc, "markdown": rule.doc},
        "defaultConfiguration": {"level": _SARIF_LEVEL[rule.severity]},
        "properties": {"fix": rule.fix, "tags": ["pytorch", "correctness"]},
    }


def sarif_findings(reports: Sequence[FileReport]) -> str:
    """A SARIF 2.1.0 log; columns are declared as code points, which is what we count. TL000's
    descriptor (from its documentation, which is no rule of the registry) follows the rules'
    only when a file had a syntax error."""
    rules = all_rules()
    parse_failure = get_rule(PARSE_FAILURE_CODE)
    if parse_failure and any(f.code == PARSE_FAILURE_CODE for _, f in all_findings(reports)):
        rules.append(parse_failure)
    index = {rule.code: position for position, rule in enumerate(rules)}
    descriptors = [sarif_rule(rule) for rule in rules]
    log = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "torchls",
                        "version": __version__,
                        "semanticVersion": __version__,
                        "rules": descriptors,
                    }
                },
                "originalUriBaseIds": {SARIF_SRCROOT: {"uri": Path.cwd().as_uri() + "/"}},
                "columnKind": "unicodeCodePoints",
                "results": [_sarif_result(r, f, index) for r, f in all_findings(reports)],
            }
        ],
    }
    return json.dumps(log, indent=2, ensure_ascii=False) + "\n"


# --- rules -----------------------------------------------------------------------------------

_FIX_TEXT = {
    "safe": "safe fix available (applied by --fix)",
    "unsafe": "unsafe fix available (applied by --fix --unsafe-fixes)",
    "none": "no automatic fix",
}


def _silencing(rule: Rule) -> str:
    """How to silence one of the rule's findings, or that nothing does (TL000)."""
    if rule.code in CHECKER_CODES:
        return "Always reported: no selection, configuration or # noqa hides it"
    return f"Silence on one line with: # noqa: {rule.code}"


def rule_doc(rule: Rule, style: Style) -> str:
    """The header (code, name, severity, fix) followed by the rule's Markdown doc."""
    header = [
        f"{style.code(rule.code)} {style.bold(rule.name)}",
        rule.summary,
        "",
        f"Severity: {rule.severity}",
        f"Fix: {_FIX_TEXT[rule.fix]}",
        _silencing(rule),
    ]
    return "\n".join(header) + "\n\n" + rule.doc.strip() + "\n"


def rule_json(rule: Rule) -> dict[str, Any]:
    return {
        "code": rule.code,
        "name": rule.name,
        "severity": rule.severity,
        "fix": rule.fix,
        "summary": rule.summary,
        "doc": rule.doc,
    }


def rules_table(rules: Sequence[Rule], style: Style) -> str:
    """Every rule on one line: code, name, severity, fix availability and summary."""
    rows = [("CODE", "NAME", "SEVERITY", "FIX", "SUMMARY")]
    rows += [(r.code, r.name, r.severity, r.fix, r.summary) for r in rules]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = []
    for index, row in enumerate(rows):
        cells = [row[i].ljust(widths[i]) for i in range(4)]
        if index == 0:
            lines.append(style.bold("  ".join([*cells, row[4]])))
        else:
            lines.append("  ".join([style.code(cells[0]), *cells[1:], row[4]]))
    return "\n".join(lines) + "\n"


def dumps(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False) + "\n"
