"""Pure static analysis of PyTorch training code: source text in, findings out.

Never imports pygls or torch. The one entry point is `analyze()`; `loss_contracts()` (and
`loss_contract_at()`) serve the editor hover. Rules live in `torchls.analysis.rules`,
registered in `registry`; `catalog` loads them and looks them up.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING

from torchls.analysis.catalog import all_rules, get_rule
from torchls.analysis.findings import Edit, Finding, Fix, Position, Related, Span
from torchls.analysis.registry import RULES, Hit, Rule
from torchls.analysis.resolver import CachedView, Workspace, imports_project_names
from torchls.analysis.source import ParsedSource, SourceError, SyntaxProblem, decode_source
from torchls.records import field, record

if TYPE_CHECKING:
    from torchls.analysis.contracts import ContractTable
    from torchls.analysis.incremental import Plan

__all__ = [
    "RULES",
    "AnalysisResult",
    "Edit",
    "Finding",
    "Fix",
    "Position",
    "Related",
    "Rule",
    "SourceError",
    "Span",
    "SyntaxProblem",
    "Workspace",
    "all_rules",
    "analyze",
    "collector_paused",
    "forget_caches",
    "get_rule",
    "loss_contract_at",
    "loss_contracts",
]


@record
class AnalysisResult:
    """Findings (sorted by position) for one file, plus what kept the analysis from being whole.

    `error` is set (and `findings` empty) only when the file could not be analysed at all.
    `syntax_errors` lists the first syntax error when some lines had to be skipped.
    """

    findings: list[Finding] = field(default_factory=list)
    syntax_errors: list[SyntaxProblem] = field(default_factory=list)
    error: str | None = None
    parsed: ParsedSource | None = None
    # The file imports names from modules that may be project files: an analysis with a
    # workspace could find more (editors run that second, off the typing path).
    imports_project_names: bool = False
    # Set when the time budget ran out: the findings are those of the rules that finished.
    stopped_early: str | None = None
    # (top-level statements analysed again, statements in the file) when an edit's analysis
    # kept the earlier findings of the rest (`previous_findings`); None for a whole analysis.
    reanalysed: tuple[int, int] | None = None


def analyze(
    source: str | bytes,
    filename: str = "<stdin>",
    enabled: Callable[[str], bool] | None = None,
    respect_noqa: bool = True,
    workspace: Workspace | CachedView | None = None,
    previous: ParsedSource | None = None,
    budget_s: float | None = None,
    previous_findings: Sequence[Finding] | None = None,
) -> AnalysisResult:
    """Run every enabled rule on one file's source. With a `workspace`, names imported from
    other project files are followed into them (model classes, factories, loss wrappers).
    `previous` (the `parsed` of this document's last result) lets an editor re-parse only the
    statements an edit touched; its unchanged statements are reused, so it must not be in use
    by another analysis at the same time. With `budget_s`, rules that have not started when the
    budget runs out are skipped and `stopped_early` says so (an editor must never stall).
    With `previous_findings` too (the complete findings of that `previous` version, under the
    same rule selection and project state), only the statements the edit can affect are
    analysed again and the others keep their findings (`incremental.py`)."""
    # The analysis allocates hundreds of thousands of small objects; letting the cyclic GC
    # scan the (large, acyclic) syntax tree over and over costs more than the analysis itself.
    with collector_paused(), _analysing(workspace):
        return _analyze(
            source,
            filename,
            enabled,
            respect_noqa,
            workspace,
            previous,
            budget_s,
            previous_findings,
        )


@contextmanager
def collector_paused() -> Iterator[None]:
    """No automatic cyclic garbage collection inside (restored as it was after). The
    analysis breaks the cycles it makes itself (`Facts.release`), so little is left for the
    collector; what it would do meanwhile is scan every syntax tree and fact table still
    alive, again and again as they age."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _analysing(workspace: Workspace | CachedView | None) -> AbstractContextManager[None]:
    """The workspace's `analysing()` guard (facts it drops meanwhile stay intact), or none."""
    project = workspace.workspace if isinstance(workspace, CachedView) else workspace
    guard = getattr(project, "analysing", None)
    return guard() if guard is not None else nullcontext()


def _analyze(
    source: str | bytes,
    filename: str,
    enabled: Callable[[str], bool] | None,
    respect_noqa: bool,
    workspace: Workspace | CachedView | None,
    previous: ParsedSource | None,
    budget_s: float | None = None,
    previous_findings: Sequence[Finding] | None = None,
) -> AnalysisResult:
    from torchls.analysis.modes import WholeFileNeeded
    from torchls.analysis.source import reparse

    try:
        text = decode_source(source) if isinstance(source, bytes) else source
        project = workspace.workspace if isinstance(workspace, CachedView) else workspace
        shared = project is not None and getattr(project, "share_parses", False)
        if previous is None and shared and not filename.startswith("<"):
            # The parse that files importing this one may already have made (or will make).
            parsed = project.parsed(filename, text)
        else:
            parsed = reparse(previous, text)
        rules = [r for r in all_rules() if enabled is None or enabled(r.code)]
        whole_file = frozenset(r.code for r in rules if r.needs_whole_file(text))
        reduced = None
        if previous_findings is not None:
            from torchls.analysis.incremental import plan  # an editor's edits only

            reduced = plan(parsed, previous_findings, whole_file)
        run = (parsed, filename, workspace, rules, respect_noqa, budget_s)
        try:
            findings, stopped_early, imports_project = _run_rules(*run, reduced)
        except WholeFileNeeded:
            reduced = None
            findings, stopped_early, imports_project = _run_rules(*run, None)
        return AnalysisResult(
            findings,
            parsed.syntax_errors,
            None,
            parsed,
            imports_project,
            stopped_early,
            (len(reduced.affected), len(parsed.tree.body)) if reduced is not None else None,
        )
    except SourceError as error:
        return AnalysisResult(error=str(error))
    except RecursionError:
        return AnalysisResult(error="nesting too deep to analyse")


def _run_rules(
    parsed: ParsedSource,
    filename: str,
    workspace: Workspace | CachedView | None,
    rules: list[Rule],
    respect_noqa: bool,
    budget_s: float | None,
    reduced: Plan | None,
) -> tuple[list[Finding], str | None, bool]:
    """(sorted findings, why the budget stopped the rules if it did, whether the file imports
    project names): every rule on the facts of `parsed`, or with a `reduced` plan on those of
    its reduced module (rules marked `whole_file` on the whole file), merged with what the
    plan kept."""
    from torchls.analysis.facts import build_facts
    from torchls.analysis.noqa import is_silenced, noqa_map

    facts = whole_facts = None
    try:
        facts = build_facts(reduced.parsed if reduced else parsed, filename, workspace)
        if reduced is not None:
            facts.outside, facts.replaced = reduced.outside, reduced.replaced
            facts.fresh = reduced.fresh
        silenced = noqa_map(parsed.lines) if respect_noqa else {}
        findings: list[Finding] = []
        stopped_early = None
        deadline = time.monotonic() + budget_s if budget_s is not None else None
        for index, rule_ in enumerate(rules):
            if deadline is not None and time.monotonic() > deadline:
                skipped = ", ".join(r.code for r in rules[index:])
                stopped_early = f"analysis stopped after {budget_s:g} s; not checked: {skipped}"
                break
            rule_facts = facts
            if reduced is not None and rule_.code in reduced.whole_file:
                if whole_facts is None:
                    whole_facts = build_facts(parsed, filename, workspace)
                rule_facts = whole_facts
            for hit in rule_.check(rule_facts):
                finding = _to_finding(rule_, hit, parsed)
                if finding.span.start.row in parsed.blanked_rows:
                    continue
                if is_silenced(silenced, finding.span.start.row, finding.code):
                    continue
                findings.append(finding)
        if reduced is not None:
            findings = reduced.merge(findings)
        findings.sort(key=lambda f: (f.span.start, f.code))
        return findings, stopped_early, imports_project_names(facts)
    finally:
        for done in (facts, whole_facts):
            if done is not None:
                done.release()  # freed now by reference counting (see `Facts.release`)


def forget_caches() -> None:
    """Empty the analysis's process-wide caches (function summaries by text, kinds by name):
    an editor with no document open calls this, so their entries, spread over the heap
    between freed syntax trees, do not keep that memory from going back to the system."""
    from torchls.analysis.queries.kinds import _kind_from_name
    from torchls.analysis.summaries import forget_summaries

    forget_summaries()
    _kind_from_name.cache_clear()


def _to_finding(rule_: Rule, hit: Hit, parsed: ParsedSource) -> Finding:
    span = hit.where if isinstance(hit.where, Span) else parsed.span(hit.where, hit.end)
    return Finding(rule_.code, hit.message, rule_.severity, span, hit.fix, hit.related)


def loss_contract_at(
    source: str,
    row: int,
    column: int,
    filename: str = "<stdin>",
    workspace: Workspace | CachedView | None = None,
) -> str | None:
    """Markdown describing the loss contract at a 1-based row / 0-based code-point column."""
    table = loss_contracts(source, filename, workspace)
    return table.markdown_at(row, column) if table is not None else None


def loss_contracts(
    source: str,
    filename: str = "<stdin>",
    workspace: Workspace | CachedView | None = None,
) -> ContractTable | None:
    """Every loss contract of `source` by position (`ContractTable.markdown_at`): an editor
    builds it once per document version and answers each hover from it. None when the text
    cannot be analysed."""
    from torchls.analysis.contracts import contract_table
    from torchls.analysis.facts import build_facts
    from torchls.analysis.source import parse_source

    facts = None
    try:
        with _analysing(workspace):
            facts = build_facts(parse_source(source), filename, workspace)
            return contract_table(facts)
    except (SourceError, RecursionError):
        return None
    finally:
        if facts is not None:
            facts.release()
