"""Applying fixes to source text.

In: the text and findings carrying fixes. Out: the new text and how many fixes went in. Fixes
whose edits overlap an already accepted fix are skipped (a second pass picks them up).
"""

from __future__ import annotations

from collections.abc import Iterable

from torchls.analysis.findings import Edit, Finding, Fix, Position
from torchls.analysis.source import split_lines


def _offsets(text: str) -> list[int]:
    """Start offset of every row (index 0 is row 1), honouring \\r\\n and \\r terminators."""
    starts = [0]
    index = 0
    length = len(text)
    while index < length:
        char = text[index]
        if char == "\r":
            index += 2 if text.startswith("\r\n", index) else 1
            starts.append(index)
        elif char == "\n":
            index += 1
            starts.append(index)
        else:
            index += 1
    return starts


def _absolute(starts: list[int], position: Position) -> int:
    return starts[min(position.row, len(starts)) - 1] + position.column


def fixes_to_apply(findings: Iterable[Finding], unsafe: bool = False) -> list[Fix]:
    return [
        finding.fix
        for finding in findings
        if finding.fix is not None and (unsafe or finding.fix.applicability == "safe")
    ]


def apply_fixes(text: str, fixes: Iterable[Fix]) -> tuple[str, int]:
    """Apply non-overlapping fixes; returns the new text and the number applied."""
    starts = _offsets(text)
    accepted: list[tuple[int, int, str]] = []
    applied = 0
    for fix in fixes:
        ranges = [
            (_absolute(starts, e.span.start), _absolute(starts, e.span.end), e.content)
            for e in fix.edits
        ]
        if any(
            (start < other_end and other_start < end) or (start == end == other_start == other_end)
            for start, end, _ in ranges
            for other_start, other_end, _ in accepted
        ):
            continue
        accepted.extend(ranges)
        applied += 1
    for start, end, content in sorted(accepted, key=lambda r: (r[0], r[1]), reverse=True):
        text = text[:start] + content + text[end:]
    return text, applied


def edit_to_text(lines_text: str, edit: Edit) -> str:
    """Apply one edit; a helper for tests and previews."""
    return apply_fixes(lines_text, [Fix("safe", "", (edit,))])[0]


__all__ = ["apply_fixes", "edit_to_text", "fixes_to_apply", "split_lines"]
