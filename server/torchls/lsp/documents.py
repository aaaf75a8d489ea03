"""Open documents: text sync, versions, snapshots, the analysis and its cache, and their events.

Why one module: the path from an edit to its diagnostics used to go back and forth between
the server object (which owned the cache and the analysis runner) and the diagnostics feature
(which owned document sync). Here it runs one way: a `didOpen`/`didChange`/`didSave` (or a
request to re-check: settings, a repro, another file) is turned into a numbered snapshot, the
newest request per document claims it and cancels older work, the analysis runs on one worker
thread (cached per version, settings generation and state of the other files), and the result
goes to the subscribers (`on_results`: the diagnostics feature converts and publishes it). No
subscriber is called back for anything; what they need travels in the `Results` they get.

A notebook (LSP 3.17 notebook sync) is one document here, keyed by its URI: its snapshot is
its Python code cells as one module (`cells.notebook_text`), versioned by the notebook, so a
cell edit re-checks it like an edit of one top-level statement of a file.

In: LSP text- and notebook-sync notifications, `refresh`/`refresh_all` requests from features. Out:
`Results` events, `Snapshot`s and `Outcome`s on request (code actions, hover, pull
diagnostics), and `pull_refresh` events when the client pulls diagnostics.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import re
import sys
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import unquote

from lsprotocol import types
from pygls.uris import to_fs_path
from pygls.workspace import TextDocument, Workspace

from torchls.analysis import Finding, all_rules, analyze, forget_caches
from torchls.analysis import Workspace as ProjectWorkspace
from torchls.analysis.contracts import ContractTable
from torchls.analysis.selection import RuleSelection
from torchls.analysis.source import ParsedSource
from torchls.config import config_or_defaults
from torchls.lsp.cells import NotebookText, notebook_text
from torchls.lsp.positions import UTF16
from torchls.lsp.settings import Settings
from torchls.project import ProjectView
from torchls.records import field, record

if TYPE_CHECKING:
    from torchls.lsp.server import TorchLanguageServer

logger = logging.getLogger(__name__)

SETTINGS_WAIT_S = 5.0
"""How long document work waits for the client's configuration before using what it has."""

ANALYSIS_BUDGET_S = float(os.environ.get("TORCHLS_ANALYSIS_BUDGET_S", "3.0"))
"""Rules not started within this many seconds are skipped (and the user is told): a
pathological file must not stall diagnostics. The variable exists for tests and slow machines."""

TRIM_DELAY_S = 1.0
"""After the last of a burst of didClose, how long to wait before handing freed memory back."""

KEEP_PARSED = 8
"""Parse trees (and complete findings) kept for the most recently analysed documents: an edit
re-parses only the statements it touched and re-analyses only what they reach. Another
document's next edit is analysed whole once. Eight, not more: with 200 real files open the
kept trees were most of the server's memory (bench/memory_soak.py: 32 kept, 154 MiB)."""

MAX_DOCUMENT_CHARS = 5_000_000
"""Documents larger than this are not analysed (no training script is this long)."""

Trigger = Literal["open", "change", "save", "settings", "dependency", "repro"]

_LSP_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


class LspTextDocument(TextDocument):
    """A pygls `TextDocument` whose lines break only where LSP (and Python) break them.

    pygls splits with `str.splitlines()`, which also breaks at \f, \v, \x1c-\x1e, \x85,
    \u2028 and \u2029: an incremental change below such a character would be applied to the
    wrong line and the server's text would silently diverge from the editor's.
    """

    @property
    def lines(self) -> tuple[str, ...]:
        return tuple(_LSP_LINE.findall(self.source))


class LspWorkspace(Workspace):
    """A pygls `Workspace` that creates `LspTextDocument`s."""

    def _create_text_document(
        self,
        doc_uri: str,
        source: str | None = None,
        version: int | None = None,
        language_id: str | None = None,
    ) -> TextDocument:
        return LspTextDocument(
            doc_uri,
            source=source,
            version=version,
            language_id=language_id,
            sync_kind=self._sync_kind,
            position_codec=self.position_codec,
        )


@record(frozen=True)
class Snapshot:
    """The text of one document version, taken when a request for diagnostics arrived. A
    notebook's is its code cells as one module (`source`), with the cells in `notebook`."""

    uri: str
    version: int | None
    source: str
    notebook: NotebookText | None = None


@record(frozen=True)
class Prior:
    """A document's last complete findings (nothing left for the cross-file pass, no rule
    skipped), with the parse they belong to and what they were computed under: the next
    edit's analysis keeps those of the statements it cannot affect (`analyze`'s
    `previous_findings`) when the parse it re-parses from and that context are the same."""

    tree: object
    context: tuple[object, ...]
    findings: tuple[Finding, ...]


@record(frozen=True)
class Outcome:
    """What one analysis produced, ready for every feature that needs findings.

    `cross_file` says whether other project files were consulted; `needs_cross_file` that
    this in-file result could still grow once they are (the file imports project names)."""

    snapshot: Snapshot
    findings: tuple[Finding, ...] = ()
    error: str | None = None
    config_error: str | None = None
    cross_file: bool = False
    needs_cross_file: bool = False
    stopped_early: str | None = None  # the analysis ran out of its time budget
    reanalysed: tuple[int, int] | None = None  # see `AnalysisResult.reanalysed`


@record
class DocumentState:
    """Per open document: who may publish next, the last saved snapshot and a result cache."""

    sequence: int = 0  # incremented for every diagnostics request
    claimed: int = 0  # the newest request that decided it will publish
    task: asyncio.Task[None] | None = None  # the request holding the claim
    pending: set[asyncio.Task[None]] = field(default_factory=set)  # every live request
    saved: Snapshot | None = None  # text at didOpen / didSave (what run=onSave checks)
    cache: dict[tuple[int | None, int, str, int, bool], Outcome] = field(default_factory=dict)
    closed: bool = False  # set at didClose (and when a repeated didOpen replaces it)
    # Hover's loss contracts of one text (keyed by the text and the dependency generation):
    # built at the first hover of a version, a look-up for every hover after it.
    contracts: tuple[tuple[str, int], ContractTable | None] | None = None
    # A notebook's: the cells diagnostics were last published to (cleared when it closes).
    published_cells: tuple[str, ...] = ()

    def keep(self, task: asyncio.Task[None]) -> None:
        """Hold a reference until the task ends (the event loop only keeps weak ones)."""
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    def cancel_all(self) -> None:
        for task in list(self.pending):
            task.cancel()


@record(frozen=True)
class Results:
    """An analysis for subscribers to publish: everything they need, so none calls back.

    Still wanted (a subscriber checks after its own awaits) while `state` is open and still
    claimed by `sequence`, and, when `on_type`, while the document still has this text."""

    snapshot: Snapshot
    outcome: Outcome
    trigger: Trigger
    state: DocumentState
    sequence: int
    on_type: bool
    encoding: str


ResultsListener = Callable[[Results], Awaitable[None]]


class Documents:
    """The open documents of one server and everything derived from their text."""

    def __init__(self, server: TorchLanguageServer) -> None:
        self.server = server
        self.states: dict[str, DocumentState] = {}
        # Subscribers: the diagnostics feature publishes `Results`; in pull mode nothing is
        # pushed and `pull_refresh` listeners ask the client to pull again instead.
        self.result_listeners: list[ResultsListener] = []
        self.pull_refresh_listeners: list[Callable[[], None]] = []
        self.push = True  # False once the client pulls diagnostics (no results are pushed)
        # One worker: the analysis is pure Python (the GIL makes more threads no faster), and a
        # FIFO queue keeps results in request order.
        self.analysis_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torchls")
        # Cross-file resolution (jedi) over the project, seeing open documents' unsaved text.
        self._project: ProjectWorkspace | None = None
        # Bumped whenever another file may have changed, so cross-file results are recomputed.
        self.dependency_generation = 0
        # Last parse per document, touched only on the analysis thread (incremental re-parse
        # reuses and shifts its unchanged statements, so it must never be shared).
        self.parsed_by_uri: dict[str, ParsedSource] = {}
        # The last complete in-file findings per document, for the next edit to keep those of
        # the statements it cannot affect (same thread, same lifetime as `parsed_by_uri`).
        self.prior_by_uri: dict[str, Prior] = {}
        self._trim: asyncio.TimerHandle | None = None  # a pending `release_memory` after closes
        self._project_view: ProjectView | None = None

    # -- text sync ------------------------------------------------------------------------------

    def register(self) -> None:
        """Attach the text-sync handlers (pygls has applied each change to its workspace
        before they run)."""
        server = self.server

        @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
        def did_open(ls: TorchLanguageServer, params: types.DidOpenTextDocumentParams) -> None:
            self.opened(params.text_document.uri)

        @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
        def did_change(ls: TorchLanguageServer, params: types.DidChangeTextDocumentParams) -> None:
            self.changed(params.text_document.uri)

        @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
        def did_save(ls: TorchLanguageServer, params: types.DidSaveTextDocumentParams) -> None:
            self.saved(params.text_document.uri)

        @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
        def did_close(ls: TorchLanguageServer, params: types.DidCloseTextDocumentParams) -> None:
            self.closed(params.text_document.uri)

        # A notebook is one document here, keyed by its URI: its code cells are one module.
        @server.feature(types.NOTEBOOK_DOCUMENT_DID_OPEN)
        def notebook_open(
            ls: TorchLanguageServer, params: types.DidOpenNotebookDocumentParams
        ) -> None:
            self.opened(params.notebook_document.uri)

        @server.feature(types.NOTEBOOK_DOCUMENT_DID_CHANGE)
        def notebook_change(
            ls: TorchLanguageServer, params: types.DidChangeNotebookDocumentParams
        ) -> None:
            self.changed(params.notebook_document.uri)
            if not self.push:
                # A pull client re-pulls only the cell it edited, but an edit in one cell
                # changes what the others report (a loss defined here, used there).
                for listener in self.pull_refresh_listeners:
                    listener()

        @server.feature(types.NOTEBOOK_DOCUMENT_DID_SAVE)
        def notebook_save(
            ls: TorchLanguageServer, params: types.DidSaveNotebookDocumentParams
        ) -> None:
            self.saved(params.notebook_document.uri)

        @server.feature(types.NOTEBOOK_DOCUMENT_DID_CLOSE)
        def notebook_close(
            ls: TorchLanguageServer, params: types.DidCloseNotebookDocumentParams
        ) -> None:
            self.closed(params.notebook_document.uri)

    def opened(self, uri: str) -> None:
        if (old := self.states.get(uri)) is not None:
            old.closed = True
            old.cancel_all()  # a repeated didOpen replaces the document
        state = self.states[uri] = DocumentState()
        state.saved = self.snapshot(uri)
        self.refresh(uri, "open")

    def changed(self, uri: str) -> None:
        self.refresh(uri, "change")
        self._refresh_dependents(uri)

    def saved(self, uri: str) -> None:
        if (state := self.states.get(uri)) is not None:
            state.saved = self.snapshot(uri)
        self.forget_results(uri)  # saving is when users expect pyproject.toml edits to count
        self.refresh(uri, "save")

    def closed(self, uri: str) -> None:
        state = self.states.pop(uri, None)
        if state is not None:
            state.closed = True
            state.cancel_all()
            self._forget_document(uri)
        if self.push:
            cleared = state.published_cells if state is not None else ()
            for target in cleared or (uri,):
                self.server.text_document_publish_diagnostics(
                    types.PublishDiagnosticsParams(uri=target, diagnostics=[])
                )

    def _forget_document(self, uri: str) -> None:
        """A closed document keeps nothing: its parse tree (reused only by the next edit's
        re-parse) goes on the analysis thread, after any analysis of it still queued there;
        what the project knew of its unsaved text goes too (other files now read it from
        disk). The memory is handed back to the system once closing stops for a moment."""
        with contextlib.suppress(RuntimeError):  # the pool is shut down: nothing to free
            self.analysis_pool.submit(self.parsed_by_uri.pop, uri, None)
            self.analysis_pool.submit(self.prior_by_uri.pop, uri, None)
        path = to_fs_path(uri)
        if not self.states:
            # Nothing open: what the project learnt of other files (their facts, jedi's
            # scripts) is rebuilt from disk when the next document needs it.
            self._project = None
            self._project_view = None
        elif self._project is not None and path is not None and "\x00" not in path:
            with contextlib.suppress(OSError):
                self._project.invalidate(path)
                # Open files whose findings came through its unsaved text: check them again.
                self._refresh_dependents(uri)
        if self._trim is not None:
            self._trim.cancel()
        with contextlib.suppress(RuntimeError):  # no running loop (tests drive this directly)
            loop = asyncio.get_running_loop()
            self._trim = loop.call_later(TRIM_DELAY_S, self._release_memory)

    def _release_memory(self) -> None:
        self._trim = None
        with contextlib.suppress(RuntimeError):
            self.analysis_pool.submit(release_memory, not self.states)

    # -- snapshots ------------------------------------------------------------------------------

    def is_open(self, uri: str) -> bool:
        return uri in self.states

    def snapshot(self, uri: str) -> Snapshot | None:
        """The current text of an open document, or None when it is not open."""
        if uri not in self.states:
            return None
        workspace = self.server.workspace
        notebook = workspace.get_notebook_document(notebook_uri=uri)
        if notebook is not None:
            cells = notebook_text(notebook, self._cell_text)
            return Snapshot(uri, notebook.version, cells.text, cells)
        document = workspace.get_text_document(uri)
        return Snapshot(uri, document.version, document.source)

    def _cell_text(self, uri: str) -> tuple[str, int | None, str | None] | None:
        document = self.server.workspace.text_documents.get(unquote(uri))
        if document is None:
            return None
        return document.source, document.version, document.language_id

    def is_current(self, snapshot: Snapshot) -> bool:
        """Whether `snapshot` still is the document's text."""
        current = self.snapshot(snapshot.uri)
        return (
            current is not None
            and current.version == snapshot.version
            and current.source == snapshot.source
        )

    def notebook_of(self, uri: str) -> str | None:
        """The URI of the open notebook whose cell `uri` is, or None (not a cell)."""
        notebook = self.server.workspace.get_notebook_document(cell_uri=uri)
        if notebook is None or notebook.uri not in self.states:
            return None
        return notebook.uri

    def paths_of(self, uri: str) -> tuple[str | None, str | None]:
        """(the document's file path, where to look for `pyproject.toml` from). Documents
        without a path, such as unsaved buffers, use the workspace root's configuration."""
        path = to_fs_path(uri)
        if path is not None and "\x00" in path:
            path = None  # no file system call accepts it; analyse the text like a buffer
        start = path
        if start is None and self.server.workspace.root_uri:
            start = to_fs_path(self.server.workspace.root_uri)
        return path, start

    def forget_results(self, uri: str | None = None) -> None:
        """Drop cached analyses (of one document, or all) so the next request re-reads
        pyproject.toml, which the cache key does not cover."""
        for key, state in self.states.items():
            if uri is None or key == uri:
                state.cache.clear()

    # -- other files ----------------------------------------------------------------------------

    @property
    def project(self) -> ProjectWorkspace:
        """The analysis workspace: the client's root folder, with open documents as overlay."""
        if self._project is None:
            root_uri = self.server.workspace.root_uri
            root = to_fs_path(root_uri) if root_uri else None
            self._project = ProjectWorkspace(root, overlay=self._open_text)
        return self._project

    @property
    def project_view(self) -> ProjectView:
        """The project as the cross-file pass asks it: jedi only for imports that could name
        a project file (the same gate `torchls check` uses)."""
        if self._project_view is None:
            self._project_view = ProjectView(self.project)
        return self._project_view

    def layout_changed(self) -> None:
        """A Python file appeared or vanished: the names the project defines may differ."""
        self._project_view = None

    @property
    def has_project(self) -> bool:
        """Whether other files were consulted yet (nothing to invalidate before)."""
        return self._project is not None

    def _open_text(self, path: Path) -> str | None:
        """The editor's text of an open document at `path` (unsaved edits included)."""
        for uri in list(self.states):
            own = to_fs_path(uri)
            if own is not None and Path(own).resolve() == path:
                with contextlib.suppress(Exception):
                    return self.server.workspace.get_text_document(uri).source
        return None

    def dependencies_changed(self, paths: list[Path] | None = None) -> None:
        """Another file changed (an open document was edited, or a watched file on disk):
        cross-file results must be recomputed."""
        self.dependency_generation += 1
        if self._project is not None:
            if paths is None:
                self._project.invalidate()
            for path in paths or ():
                self._project.invalidate(path)

    def _refresh_dependents(self, uri: str) -> None:
        """`uri` changed: re-check the open documents whose findings came through it (a model
        class's forward, a factory) so they never show results for its old text."""
        path = to_fs_path(uri)
        if path is None or self._project is None:
            return
        dependents = self._project.dependents_of(path)
        if not dependents:
            return
        self.dependencies_changed()
        for other in list(self.states):
            own = to_fs_path(other)
            if other != uri and own is not None and Path(own).resolve() in dependents:
                self.refresh(other, "dependency")

    # -- requests to re-check -------------------------------------------------------------------

    def refresh(self, uri: str, trigger: Trigger) -> None:
        """Schedule fresh results for `uri` after `trigger`; newer requests supersede older
        ones. Pull clients are asked to pull again instead (only for what they cannot see
        coming: settings and repro results)."""
        state = self.states.get(uri)
        if state is None:
            return
        if not self.push:
            return
        snapshot = self.snapshot(uri)
        if snapshot is None:
            return
        state.sequence += 1
        state.keep(asyncio.ensure_future(self._run(state, state.sequence, trigger, snapshot)))

    def refresh_all(self, trigger: Trigger) -> None:
        """After a settings change or a repro: fresh results for every open document."""
        if not self.push:
            for listener in self.pull_refresh_listeners:
                listener()
            return
        for uri in list(self.states):
            self.refresh(uri, trigger)

    async def _run(
        self, state: DocumentState, sequence: int, trigger: Trigger, snapshot: Snapshot
    ) -> None:
        try:
            await self.wait_for_settings()
            settings = self.server.settings
            on_type = settings.run == "onType"
            if not on_type:
                if trigger in ("change", "dependency"):
                    return  # typing does not publish; the diagnostics of the last save stay
                if trigger in ("settings", "repro") and state.saved is not None:
                    snapshot = state.saved
            if sequence < state.claimed:
                return  # a newer request already owns this document's next publish
            state.claimed = sequence
            current = asyncio.current_task()
            if state.task is not None and state.task is not current and not state.task.done():
                state.task.cancel()  # drops its queued analysis too
            state.task = current
            encoding = self.position_encoding
            if not settings.enable:
                outcome = Outcome(snapshot)
                await self._emit(
                    Results(snapshot, outcome, trigger, state, sequence, on_type, encoding)
                )
                return
            outcome = await self.analyse(snapshot)
            await self._emit(
                Results(snapshot, outcome, trigger, state, sequence, on_type, encoding)
            )
            if not outcome.needs_cross_file or not self._wanted(state, sequence, snapshot, on_type):
                return
            # In-file findings are out; now follow imports into other project files (jedi),
            # off the typing path, and hand them on only if that found something different.
            full = await self.analyse(snapshot, cross_file=True)
            if full.findings != outcome.findings and self._wanted(
                state, sequence, snapshot, on_type
            ):
                await self._emit(
                    Results(snapshot, full, trigger, state, sequence, on_type, encoding)
                )
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("checking %s failed", snapshot.uri)

    def _wanted(
        self, state: DocumentState, sequence: int, snapshot: Snapshot, on_type: bool
    ) -> bool:
        if state.closed or state.claimed != sequence:
            return False  # closed, reopened or superseded while we worked
        return not on_type or self.is_current(snapshot)

    async def _emit(self, results: Results) -> None:
        if not self._wanted(results.state, results.sequence, results.snapshot, results.on_type):
            return
        for listener in self.result_listeners:
            await listener(results)

    @property
    def position_encoding(self) -> str:
        # Worked out here rather than through a helper elsewhere: on the path from an edit to
        # its diagnostics, this module calls no other server module but the subscribers.
        encoding = self.server.workspace.position_encoding
        return str(encoding.value if hasattr(encoding, "value") else encoding or UTF16)

    # -- analysis -------------------------------------------------------------------------------

    async def wait_for_settings(self) -> None:
        """Wait until the client's configuration is in force (or the wait times out)."""
        ready = self.server.settings_ready
        if ready.is_set():
            return
        try:
            await asyncio.wait_for(ready.wait(), SETTINGS_WAIT_S)
        except asyncio.TimeoutError:
            logger.warning(
                "no configuration from the client after %ss; using defaults", SETTINGS_WAIT_S
            )

    async def analyse(self, snapshot: Snapshot, cross_file: bool = False) -> Outcome:
        """Findings for `snapshot` under the current settings (cached per version, settings
        and state of the other files). Names imported from other project files are followed
        as far as earlier resolutions know them; with `cross_file`, unknown ones are resolved
        too (jedi: slow the first time, so editors run it after publishing the fast pass)."""
        state = self.states.get(snapshot.uri)
        key = (
            snapshot.version,
            self.server.settings_generation,
            snapshot.source,
            self.dependency_generation,
            cross_file,
        )
        if state is not None and (cached := state.cache.get(key)) is not None:
            return cached
        settings = self.server.settings
        loop = asyncio.get_running_loop()
        outcome = await loop.run_in_executor(
            self.analysis_pool,
            analyse_snapshot,
            snapshot,
            *self.paths_of(snapshot.uri),
            settings,
            self.project_view if cross_file else self.project,
            cross_file,
            self.parsed_by_uri,
            (self.prior_by_uri, key[1], key[3]),
        )
        if outcome.config_error:
            self.server.warn_once(f"torchls: {outcome.config_error} (using default rule selection)")
        if outcome.error:
            self.server.window_log_message(
                types.LogMessageParams(
                    type=types.MessageType.Log,
                    message=f"torchls: {snapshot.uri} not analysed: {outcome.error}",
                )
            )
        if state is not None and self.states.get(snapshot.uri) is state:
            # Keep only the newest entries (in-file and cross-file): older versions are never
            # asked for again.
            state.cache = {k: v for k, v in state.cache.items() if k[:4] == key[:4]}
            state.cache[key] = outcome
        return outcome

    def shutdown(self) -> None:
        for state in self.states.values():
            state.cancel_all()
        self.analysis_pool.shutdown(wait=False, cancel_futures=True)


def release_memory(nothing_open: bool = False) -> None:
    """Collect the cycles closed documents left and hand free heap pages back to the system
    (glibc keeps them otherwise, and the server's RSS would stay at its high-water mark).
    parso's parse cache (jedi's, filled by cross-file resolution) goes too: it keeps the tree
    of every module jedi ever read, and jedi reads it back from parso's disk cache on demand.
    With `nothing_open`, the analysis's own process-wide caches go as well."""
    parso_cache = sys.modules.get("parso.cache")
    with contextlib.suppress(Exception):
        parso_cache.parser_cache.clear()  # type: ignore[union-attr]
    if nothing_open:
        forget_caches()
    gc.collect()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)


def selection_for(
    path: str | None, config_start: str | None, settings: Settings
) -> tuple[RuleSelection, str | None, str | None]:
    """(rule selection, filename relative to the project, config error) for one document, by
    the configuration service the CLI uses (`torchls.config`)."""
    config, error = config_or_defaults(config_start)
    relative = config.relative(path) if path else None
    selection = config.selection(select=settings.select, ignore=settings.ignore)
    return selection, relative, error


def analyse_snapshot(
    snapshot: Snapshot,
    path: str | None,
    config_start: str | None,
    settings: Settings,
    project: ProjectWorkspace | ProjectView | None = None,
    cross_file: bool = False,
    parsed_by_uri: dict[str, ParsedSource] | None = None,
    priors: tuple[dict[str, Prior], int, int] | None = None,
) -> Outcome:
    """Run on the worker thread: the pure analysis of one snapshot, never raising. Without
    `cross_file`, other files are consulted only as far as earlier resolutions know them;
    with it, `project` (the workspace, or a view of it that filters what jedi is asked)
    answers everything. `priors` (the documents' last complete findings, the settings and
    dependency generations) lets an in-file pass re-analyse only what an edit can affect."""
    if len(snapshot.source) > MAX_DOCUMENT_CHARS:
        return Outcome(snapshot, error=f"larger than {MAX_DOCUMENT_CHARS} characters")
    previous = parsed_by_uri.pop(snapshot.uri, None) if parsed_by_uri is not None else None
    try:
        selection, relative, config_error = selection_for(path, config_start, settings)
        filename = path or snapshot.uri
        workspace = project.workspace if isinstance(project, ProjectView) else project
        view = workspace.cached_view() if workspace is not None and not cross_file else None
        enabled = frozenset(selection.enabled_codes(tuple(r.code for r in all_rules()), relative))
        context = (priors[1:] if priors is not None else (), enabled)
        prior = priors[0].pop(snapshot.uri, None) if priors is not None else None
        reusable = (
            prior is not None
            and not cross_file  # the cross-file pass exists to find what the last one did not
            and previous is not None
            and prior.tree is previous.tree
            and prior.context == context
        )
        result = analyze(
            snapshot.source,
            filename,
            enabled=enabled.__contains__,
            workspace=(view or project) if path is not None else None,
            previous=previous,
            budget_s=ANALYSIS_BUDGET_S,
            previous_findings=prior.findings if reusable and prior is not None else None,
        )
    except Exception as error:  # the server must outlive any analysis bug
        logger.exception("analysis failed for %s", snapshot.uri)
        return Outcome(snapshot, error=f"internal error: {error}")
    if parsed_by_uri is not None and result.parsed is not None:
        parsed_by_uri[snapshot.uri] = result.parsed  # popped above: now the most recent
        while len(parsed_by_uri) > KEEP_PARSED:
            parsed_by_uri.pop(next(iter(parsed_by_uri)))
    if result.error is not None:
        return Outcome(snapshot, error=result.error, config_error=config_error)
    complete = not result.stopped_early and not (view is not None and view.missed)
    if priors is not None and complete and result.parsed is not None:
        findings = tuple(result.findings)
        priors[0][snapshot.uri] = Prior(result.parsed.tree, context, findings)
        while len(priors[0]) > KEEP_PARSED:
            priors[0].pop(next(iter(priors[0])))
    return Outcome(
        snapshot,
        tuple(result.findings),
        None,
        config_error,
        cross_file=cross_file,
        needs_cross_file=view is not None and view.missed and path is not None,
        stopped_early=result.stopped_early,
        reanalysed=result.reanalysed,
    )
