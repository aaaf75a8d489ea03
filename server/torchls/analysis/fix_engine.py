"""The one fix engine: what `torchls check --fix`, the editor's fix-all and its quick fixes share.

Why one: the CLI and the editor used to apply fixes with two loops that disagreed (the editor
rewrote a file that did not parse). In: source text, the filename, which rules are enabled,
whether unsafe fixes may be applied. Out: a `FixOutcome` with the fixed text, the analysis of
that text (what remains to report), how many fixes went in, and why it stopped early.

Policy, in one place:
- a file with a syntax error is never rewritten (its fix spans could be stale, like ruff),
- fixes are applied pass after pass until nothing changes (a fix can make another one
  possible, and fixes that overlap wait for the next pass), at most `MAX_FIX_PASSES` times,
- a pass whose result does not parse is thrown away and the last good text is kept,
- only `safe` fixes unless `unsafe` is asked for.
"""

from __future__ import annotations

from collections.abc import Callable

from torchls.analysis import AnalysisResult, Finding, Workspace, analyze
from torchls.analysis.fixes import apply_fixes, fixes_to_apply
from torchls.records import record

MAX_FIX_PASSES = 5


@record
class FixOutcome:
    """The text after applying fixes until none was left, and what is still to report."""

    text: str
    result: AnalysisResult  # the analysis of `text`: what remains to report
    fixed: int = 0
    broken: bool = False  # a pass was rejected because it broke parsing
    refused: str | None = None  # why nothing was attempted (the file does not parse)


def refusal(result: AnalysisResult) -> str | None:
    """Why the text behind `result` must not be rewritten, or None when it may be."""
    if result.error is not None:
        return result.error
    if result.syntax_errors or result.parsed is None:
        return "the file has a syntax error; fix it before applying fixes"
    return None


def fix_until_stable(
    text: str,
    filename: str,
    enabled: Callable[[str], bool] | None = None,
    *,
    unsafe: bool = False,
    workspace: Workspace | None = None,
    result: AnalysisResult | None = None,
) -> FixOutcome:
    """`text` with every applicable fix applied until stable; `result`, when given, is the
    analysis of `text` already made (the CLI has it), so it is not repeated."""
    if result is None:
        result = analyze(text, filename, enabled, workspace=workspace)
    outcome = FixOutcome(text, result)
    if (reason := refusal(result)) is not None:
        outcome.refused = reason
        return outcome
    for _ in range(MAX_FIX_PASSES):
        fixes = fixes_to_apply(outcome.result.findings, unsafe=unsafe)
        if not fixes:
            break
        candidate, applied = apply_fixes(outcome.text, fixes)
        if applied == 0 or candidate == outcome.text:
            break
        after = analyze(candidate, filename, enabled, workspace=workspace)
        if refusal(after) is not None:
            outcome.broken = True  # keep the last good text rather than write broken code
            break
        outcome = FixOutcome(candidate, after, outcome.fixed + applied)
    return outcome


def is_safe(finding: Finding) -> bool:
    """Whether `finding` has a fix that fix-all and plain `--fix` may apply."""
    return finding.fix is not None and finding.fix.applicability == "safe"
