"""Code actions: apply a finding's fix, silence it with `# noqa`, or fix everything safe.

In: `textDocument/codeAction` (range, context diagnostics, `only` kinds). Out: `CodeAction`s:

- `quickfix` "Fix TLxxx: <message>" for each torchls finding in range that has a fix (unsafe
  fixes say "(unsafe)" and are never preferred; a safe one is preferred only for the finding the
  request is about: one of the diagnostics the client sent, else the one under the cursor),
- `quickfix` "Disable TLxxx for this line" for each torchls finding in range,
- `quickfix` "Show documentation for TLxxx", once per code in range, running the
  `torchls.showRuleDoc` command (`rule_docs`),
- `source.fixAll.torchls`, all SAFE fixes of the document in one edit (re-analysing until no
  more apply, since fixes that overlap wait for the next pass), when the client asks for source
  actions (`only`) or after the actions of a finding in range. Never on its own for a range
  without a finding: clients such as eglot make the first action the default, and a stray Enter
  would apply every fix in the file,
- `torchls.repro` "Run bounded repro" on lines inside a training loop or train step, and
  "Compare with HEAD" beside it, in trusted workspaces only (`repro`, `workflows`),
- `torchls.inspect` "Inspect checkpoint PATH" on a `torch.load`/`torch.save` whose literal path
  names an existing file, in trusted workspaces only (`workflows`).

Edits are computed from a fresh analysis of the current document version, never from a
diagnostic's stored data, so they always match the text they will be applied to.
"""

from __future__ import annotations

import asyncio
import logging

import attrs
from lsprotocol import types
from pygls.capabilities import get_capability

from torchls.analysis import Finding
from torchls.analysis.fix_engine import fix_until_stable, is_safe
from torchls.analysis.noqa import add_code_to_line
from torchls.lsp.cells import NotebookText
from torchls.lsp.commands import INSPECT_KIND, REPRO_KIND, SHOW_RULE_DOC
from torchls.lsp.convert import SOURCE, to_diagnostics
from torchls.lsp.documents import Outcome, Snapshot, selection_for
from torchls.lsp.positions import LineIndex
from torchls.lsp.repro import announces_progress
from torchls.lsp.server import TorchLanguageServer
from torchls.lsp.settings import Settings
from torchls.notebook import split_cells

logger = logging.getLogger(__name__)

FIX_ALL_KIND = f"{types.CodeActionKind.SourceFixAll.value}.{SOURCE}"


def _wanted(kind: str, only: list[str] | None) -> bool:
    """Whether `kind` is requested: kinds are hierarchical, `source` covers `source.fixAll.x`."""
    if not only:
        return True
    return any(kind == wanted or kind.startswith(f"{wanted}.") for wanted in only)


def _overlaps(a: types.Range, b: types.Range) -> bool:
    def key(position: types.Position) -> tuple[int, int]:
        return position.line, position.character

    return key(a.start) <= key(b.end) and key(b.start) <= key(a.end)


def _workspace_edit(
    server: TorchLanguageServer, snapshot: Snapshot, edits: list[types.TextEdit]
) -> types.WorkspaceEdit:
    """Versioned document changes when the client takes them (so a stale edit is refused),
    else the plain `changes` map every client understands."""
    if get_capability(
        server.client_capabilities, "workspace.workspace_edit.document_changes", False
    ):
        document = types.OptionalVersionedTextDocumentIdentifier(
            uri=snapshot.uri, version=snapshot.version
        )
        return types.WorkspaceEdit(
            document_changes=[types.TextDocumentEdit(text_document=document, edits=edits)]
        )
    return types.WorkspaceEdit(changes={snapshot.uri: edits})


def _matching_diagnostic(
    finding_diagnostic: types.Diagnostic, context: list[types.Diagnostic]
) -> types.Diagnostic:
    """The client's own diagnostic for this finding when it sent one (clients match actions to
    diagnostics by identity), else ours."""
    for diagnostic in context:
        if (
            diagnostic.source == SOURCE
            and diagnostic.code == finding_diagnostic.code
            and _overlaps(diagnostic.range, finding_diagnostic.range)
        ):
            return diagnostic
    return finding_diagnostic


def _contains(outer: types.Range, inner: types.Range) -> bool:
    def key(position: types.Position) -> tuple[int, int]:
        return position.line, position.character

    return key(outer.start) <= key(inner.start) and key(inner.end) <= key(outer.end)


def _fix_action(
    server: TorchLanguageServer,
    finding: Finding,
    diagnostic: types.Diagnostic,
    index: LineIndex,
    snapshot: Snapshot,
    own: bool,
) -> types.CodeAction | None:
    fix = finding.fix
    if fix is None:
        return None
    unsafe = not is_safe(finding)
    title = f"Fix {finding.code}: {fix.message}" + (" (unsafe)" if unsafe else "")
    edits = [types.TextEdit(range=index.range(e.span), new_text=e.content) for e in fix.edits]
    return types.CodeAction(
        title=title,
        kind=types.CodeActionKind.QuickFix,
        diagnostics=[diagnostic],
        is_preferred=True if own and not unsafe else None,
        edit=_workspace_edit(server, snapshot, edits),
    )


def _noqa_action(
    server: TorchLanguageServer,
    finding: Finding,
    diagnostic: types.Diagnostic,
    index: LineIndex,
    snapshot: Snapshot,
) -> types.CodeAction | None:
    row = finding.span.start.row
    line = index.line(row)
    if line.rstrip().endswith("\\"):
        return None  # a comment after a line continuation would break the code
    new_line = add_code_to_line(line, finding.code)
    if new_line == line:
        return None  # already silenced, by a bare noqa comment say
    edit = types.TextEdit(
        range=types.Range(index.position(row, 0), index.position(row, len(line))),
        new_text=new_line,
    )
    return types.CodeAction(
        title=f"Disable {finding.code} for this line",
        kind=types.CodeActionKind.QuickFix,
        diagnostics=[diagnostic],
        edit=_workspace_edit(server, snapshot, [edit]),
    )


def _doc_action(finding: Finding, diagnostic: types.Diagnostic) -> types.CodeAction:
    title = f"Show documentation for {finding.code}"
    return types.CodeAction(
        title=title,
        kind=types.CodeActionKind.QuickFix,
        diagnostics=[diagnostic],
        command=types.Command(title=title, command=SHOW_RULE_DOC, arguments=[finding.code]),
    )


def fix_all_text(
    text: str, path: str | None, config_start: str | None, settings: Settings, uri: str
) -> str:
    """Run on the worker thread: `text` with every safe fix applied by the engine `--fix`
    uses (a text that does not parse comes back unchanged)."""
    selection, relative, _ = selection_for(path, config_start, settings)
    outcome = fix_until_stable(
        text, path or uri, lambda code: selection.enabled(code, relative), unsafe=False
    )
    return outcome.text


def minimal_edit(index: LineIndex, new_text: str) -> types.TextEdit:
    """One edit turning `index.text` into `new_text`, covering only the part that differs."""
    old = index.text
    limit = min(len(old), len(new_text))
    prefix = 0
    while prefix < limit and old[prefix] == new_text[prefix]:
        prefix += 1
    # Never split a \r\n: a position between the two is not a valid LSP position.
    if 0 < prefix < len(old) and old[prefix - 1] == "\r" and old[prefix] == "\n":
        prefix -= 1
    suffix = 0
    while (
        suffix < limit - prefix
        and old[len(old) - 1 - suffix] == new_text[len(new_text) - 1 - suffix]
    ):
        suffix += 1
    end = len(old) - suffix
    if 0 < end < len(old) and old[end - 1] == "\r" and old[end] == "\n":
        end += 1  # take the \n into the replaced part (it is in the suffix, so suffix >= 1)
        suffix -= 1
    return types.TextEdit(
        range=types.Range(index.position_at_offset(prefix), index.position_at_offset(end)),
        new_text=new_text[prefix : len(new_text) - suffix],
    )


async def _fix_all_action(
    server: TorchLanguageServer, snapshot: Snapshot, outcome: Outcome
) -> types.CodeAction | None:
    if not any(is_safe(f) for f in outcome.findings):
        return None
    loop = asyncio.get_running_loop()
    new_text = await loop.run_in_executor(
        server.docs.analysis_pool,
        fix_all_text,
        snapshot.source,
        *server.docs.paths_of(snapshot.uri),
        server.settings,
        snapshot.uri,
    )
    if new_text == snapshot.source:
        return None
    if snapshot.notebook is not None:
        edit = _fix_all_cells(server, snapshot.notebook, new_text)
        if edit is None:
            return None
    else:
        text_edit = minimal_edit(server.line_index(snapshot.source), new_text)
        edit = _workspace_edit(server, snapshot, [text_edit])
    return types.CodeAction(
        title="Fix all safely fixable torchls problems", kind=FIX_ALL_KIND, edit=edit
    )


def _fix_all_cells(
    server: TorchLanguageServer, cells: NotebookText, new_text: str
) -> types.WorkspaceEdit | None:
    """The fixed module as one edit per cell that changes (IPython lines put back); None
    when the fixes moved code across cells."""
    sources = split_cells(cells.source, new_text)
    if sources is None:
        return None
    per_cell: dict[str, list[types.TextEdit]] = {}
    for uri, cell, source in zip(cells.uris, cells.source.cells, sources, strict=True):
        if source != cell.source:
            per_cell[uri] = [minimal_edit(server.line_index(cell.source), source)]
    return _cell_workspace_edit(server, cells, per_cell) if per_cell else None


def _cell_workspace_edit(
    server: TorchLanguageServer, cells: NotebookText, per_cell: dict[str, list[types.TextEdit]]
) -> types.WorkspaceEdit:
    """Edits of several cells in the shape the client takes (see `_workspace_edit`)."""
    if not get_capability(
        server.client_capabilities, "workspace.workspace_edit.document_changes", False
    ):
        return types.WorkspaceEdit(changes=per_cell)
    versions = dict(zip(cells.uris, cells.versions, strict=True))
    return types.WorkspaceEdit(
        document_changes=[
            types.TextDocumentEdit(
                text_document=types.OptionalVersionedTextDocumentIdentifier(
                    uri=uri, version=versions.get(uri)
                ),
                edits=list(edits),
            )
            for uri, edits in per_cell.items()
        ]
    )


async def _cell_actions(
    server: TorchLanguageServer, params: types.CodeActionParams, notebook_uri: str
) -> list[types.CodeAction] | None:
    """Actions asked for in a notebook cell: those of the notebook's module at the same
    place, their edits addressed to the cells they change. An action whose edits cross from
    one cell into another is left out (no cell edit can make it)."""
    cell_uri = params.text_document.uri
    snapshot = server.docs.snapshot(notebook_uri)
    if snapshot is None or snapshot.notebook is None:
        return None
    cells = snapshot.notebook
    range_ = cells.to_module_range(cell_uri, params.range)
    if range_ is None:
        return None
    originals: dict[int, types.Diagnostic] = {}
    context = []
    for diagnostic in params.context.diagnostics:
        moved = cells.to_module_range(cell_uri, diagnostic.range)
        if moved is None:
            continue
        translated = attrs.evolve(diagnostic, range=moved)
        originals[id(translated)] = diagnostic
        context.append(translated)
    module_params = attrs.evolve(
        params,
        text_document=types.TextDocumentIdentifier(notebook_uri),
        range=range_,
        context=attrs.evolve(params.context, diagnostics=context),
    )
    actions = await _actions(server, module_params, snapshot)
    if actions is None:
        return None
    mapped = []
    for action in actions:
        moved_action = _action_in_cells(server, cells, notebook_uri, action, originals)
        if moved_action is not None:
            mapped.append(moved_action)
    return mapped or None


def _action_in_cells(
    server: TorchLanguageServer,
    cells: NotebookText,
    notebook_uri: str,
    action: types.CodeAction,
    originals: dict[int, types.Diagnostic],
) -> types.CodeAction | None:
    diagnostics = None
    if action.diagnostics is not None:
        diagnostics = []
        for diagnostic in action.diagnostics:
            if id(diagnostic) in originals:
                diagnostics.append(originals[id(diagnostic)])
            else:
                split = cells.split_diagnostics(notebook_uri, [diagnostic])
                diagnostics.extend(d for found in split.values() for d in found)
    edit = action.edit
    if edit is not None:
        module_edits: list[types.TextEdit] = []
        kept: dict[str, list[types.TextEdit]] = {}
        for change in edit.document_changes or ():
            if isinstance(change, types.TextDocumentEdit):
                target = kept if change.text_document.uri != notebook_uri else None
                if target is None:
                    module_edits.extend(e for e in change.edits if isinstance(e, types.TextEdit))
                else:
                    kept.setdefault(change.text_document.uri, []).extend(
                        e for e in change.edits if isinstance(e, types.TextEdit)
                    )
        for uri, edits in (edit.changes or {}).items():
            if uri == notebook_uri:
                module_edits.extend(edits)
            else:
                kept.setdefault(uri, []).extend(edits)
        for module_edit in module_edits:
            placed = cells.to_cell_edit(module_edit)
            if placed is None:
                return None
            kept.setdefault(placed[0], []).append(placed[1])
        edit = _cell_workspace_edit(server, cells, kept)
    return attrs.evolve(action, diagnostics=diagnostics, edit=edit)


async def code_actions(
    server: TorchLanguageServer, params: types.CodeActionParams
) -> list[types.CodeAction] | None:
    """All torchls actions for the requested range and kinds."""
    uri = params.text_document.uri
    await server.docs.wait_for_settings()
    if (notebook_uri := server.docs.notebook_of(uri)) is not None:
        return await _cell_actions(server, params, notebook_uri)
    snapshot = server.docs.snapshot(uri)
    if snapshot is None:
        return None
    return await _actions(server, params, snapshot)


async def _actions(
    server: TorchLanguageServer, params: types.CodeActionParams, snapshot: Snapshot
) -> list[types.CodeAction] | None:
    """The actions of `code_actions` for one document's snapshot (a notebook's: its module)."""
    if not server.settings.enable:
        return None
    only = [
        str(kind.value if hasattr(kind, "value") else kind) for kind in params.context.only or []
    ]
    outcome = await server.docs.analyse(snapshot)
    if outcome.error is not None:
        return None
    actions: list[types.CodeAction] = []
    if _wanted(types.CodeActionKind.QuickFix.value, only):
        index = server.line_index(snapshot.source)
        requested_codes = {
            d.code for d in params.context.diagnostics if d.source == SOURCE and d.code
        }
        diagnostics = to_diagnostics(server, outcome, related_support=False)
        fixes, silencers, docs = [], [], []
        seen_lines: set[tuple[str, int]] = set()
        seen_codes: set[str] = set()
        for finding, diagnostic in zip(outcome.findings, diagnostics, strict=True):
            if not _overlaps(diagnostic.range, params.range):
                continue
            if requested_codes and finding.code not in requested_codes:
                continue
            ours = diagnostic
            diagnostic = _matching_diagnostic(diagnostic, params.context.diagnostics)
            # The finding the request is about: one the client sent, or, when it sent none,
            # the one whose range holds the cursor (or selection).
            own = diagnostic is not ours or (
                not requested_codes and _contains(ours.range, params.range)
            )
            action = _fix_action(server, finding, diagnostic, index, snapshot, own)
            if action is not None:
                fixes.append(action)
            key = (finding.code, finding.span.start.row)
            if key not in seen_lines:
                seen_lines.add(key)
                action = _noqa_action(server, finding, diagnostic, index, snapshot)
                if action is not None:
                    silencers.append(action)
            if finding.code not in seen_codes:
                seen_codes.add(finding.code)
                docs.append(_doc_action(finding, diagnostic))
        actions.extend(fixes)
        actions.extend(silencers)
        actions.extend(docs)
    asked_for_source = any(
        kind == FIX_ALL_KIND or FIX_ALL_KIND.startswith(f"{kind}.") for kind in only
    )
    if (
        _wanted(FIX_ALL_KIND, only)
        and (asked_for_source or actions)
        and (action := await _fix_all_action(server, snapshot, outcome))
    ):
        actions.append(action)
    if _wanted(REPRO_KIND, only) and server.repro is not None:
        if (action := await server.repro.code_action(snapshot, params.range)) is not None:
            actions.append(action)
            if server.workflows is not None and announces_progress(server):
                # A comparison takes two runs; clients without progress (eglot) would sit on
                # a blocked request meanwhile, so the menu offers it only where it can wait.
                actions.append(server.workflows.compare_action(snapshot.uri))
    if _wanted(INSPECT_KIND, only) and server.workflows is not None:
        actions.extend(await server.workflows.code_actions(snapshot, params.range))
    if not server.docs.is_current(snapshot):
        return None  # the text changed meanwhile; these edits would no longer apply
    return actions or None


def register(server: TorchLanguageServer) -> None:
    """Attach the code action handler to `server`."""

    @server.feature(
        types.TEXT_DOCUMENT_CODE_ACTION,
        types.CodeActionOptions(
            code_action_kinds=[
                types.CodeActionKind.QuickFix,
                FIX_ALL_KIND,
                REPRO_KIND,
                INSPECT_KIND,
            ],
            resolve_provider=False,
        ),
    )
    async def code_action(
        ls: TorchLanguageServer, params: types.CodeActionParams
    ) -> list[types.CodeAction] | None:
        return await code_actions(ls, params)
