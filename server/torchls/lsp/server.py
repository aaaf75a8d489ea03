"""The torchls language server object: settings, per-document state and the analysis runner.

Feature modules (`diagnostics`, `code_actions`, `hover`, `settings` handlers in `lifecycle`)
register their handlers on one `TorchLanguageServer`; this module owns what they share:

- the effective `Settings` and an event that is set once the client's configuration is known,
- one `DocumentState` per open document (the newest diagnostics request and cached results),
- the repro's results (`repro_store`) and the layers that add them to diagnostics,
- `analyse()`, which runs the pure analysis on a single worker thread so the event loop stays
  responsive, and caches the result per (document version, settings generation).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path
from pygls.workspace import TextDocument, Workspace

from torchls import __version__
from torchls.analysis import Finding, analyze
from torchls.analysis import Workspace as ProjectWorkspace
from torchls.analysis.selection import RuleSelection
from torchls.analysis.source import ParsedSource
from torchls.config import ConfigError, ProjectConfig, load_config
from torchls.lsp.positions import UTF16, LineIndex
from torchls.lsp.repro_state import ReproStore
from torchls.lsp.settings import Settings
from torchls.lsp.transport import TorchProtocol

logger = logging.getLogger(__name__)

SETTINGS_WAIT_S = 5.0
"""How long document work waits for the client's configuration before using what it has."""

ANALYSIS_BUDGET_S = float(os.environ.get("TORCHLS_ANALYSIS_BUDGET_S", "3.0"))
"""Rules not started within this many seconds are skipped (and the user is told): a
pathological file must not stall diagnostics. The variable exists for tests and slow machines."""

MAX_DOCUMENT_CHARS = 5_000_000
"""Documents larger than this are not analysed (no training script is this long)."""


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


DiagnosticLayer = Callable[
    ["Snapshot", list[types.Diagnostic], bool], Awaitable[list[types.Diagnostic]]
]


@dataclass(frozen=True)
class Snapshot:
    """The text of one document version, taken when a request for diagnostics arrived."""

    uri: str
    version: int | None
    source: str


@dataclass(frozen=True)
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


@dataclass
class DocumentState:
    """Per open document: who may publish next, the last saved snapshot and a result cache."""

    sequence: int = 0  # incremented for every diagnostics request
    claimed: int = 0  # the newest request that decided it will publish
    task: asyncio.Task[None] | None = None  # the request holding the claim
    pending: set[asyncio.Task[None]] = field(default_factory=set)  # every live request
    saved: Snapshot | None = None  # text at didOpen / didSave (what run=onSave checks)
    cache: dict[tuple[int | None, int, str], Outcome] = field(default_factory=dict)

    def keep(self, task: asyncio.Task[None]) -> None:
        """Hold a reference until the task ends (the event loop only keeps weak ones)."""
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    def cancel_all(self) -> None:
        for task in list(self.pending):
            task.cancel()


class TorchLanguageServer(LanguageServer):
    """A `LanguageServer` that knows torchls settings and keeps per-document state."""

    def __init__(self) -> None:
        super().__init__("torchls", __version__, protocol_cls=TorchProtocol)
        self.settings = Settings()
        self.settings_generation = 0
        self.settings_ready = asyncio.Event()
        # Whether the workspace may run code (the repro); only `trusted: false` says no.
        self.trusted = True
        self.pull_diagnostics = False
        self.documents: dict[str, DocumentState] = {}
        self.initialize_hooks: list[Callable[[types.InitializeParams], None]] = []
        self.initialized_hooks: list[Callable[[], Awaitable[None]]] = []
        self.shutdown_hooks: list[Callable[[], None]] = []
        # Layers over the static diagnostics of a snapshot (the repro's TL9xx findings): each
        # gets the snapshot, the static diagnostics and whether related information is wanted,
        # and returns the full list to publish (or answer a pull with).
        self.diagnostic_layers: list[DiagnosticLayer] = []
        # What the repro runs found, per file (filled by the repro feature, read by the
        # diagnostics layer and the hover); `repro` is that feature's controller once registered.
        self.repro_store = ReproStore()
        self.repro: Any = None
        self._reported: set[str] = set()
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

    # -- capabilities ---------------------------------------------------------------------------

    def adopt_workspace(self) -> None:
        """Make the workspace pygls created during `initialize` an `LspWorkspace` (it adds no
        state, only the document factory), before any document arrives."""
        if type(self.workspace) is Workspace:
            self.workspace.__class__ = LspWorkspace

    @property
    def position_encoding(self) -> str:
        encoding = self.workspace.position_encoding
        return str(encoding.value if hasattr(encoding, "value") else encoding or UTF16)

    def line_index(self, text: str) -> LineIndex:
        return LineIndex(text, self.position_encoding)

    # -- messages -------------------------------------------------------------------------------

    def warn_once(self, message: str) -> None:
        """A `window/showMessage` warning, at most once per distinct message per session."""
        if message in self._reported:
            return
        self._reported.add(message)
        logger.warning("%s", message)
        self.window_show_message(
            types.ShowMessageParams(type=types.MessageType.Warning, message=message)
        )

    def log(self, message: str, kind: types.MessageType = types.MessageType.Log) -> None:
        self.window_log_message(types.LogMessageParams(type=kind, message=message))

    def report_server_error(self, error: Exception, source: object) -> None:
        # A handler bug must not pop up a dialog on every keystroke; log it instead.
        logger.error("torchls internal error (%s): %s", getattr(source, "__name__", source), error)
        with contextlib.suppress(Exception):
            self.log(f"torchls internal error: {error}", types.MessageType.Error)

    # -- settings -------------------------------------------------------------------------------

    def set_settings(self, settings: Settings) -> bool:
        """Install new effective settings; True when they differ from the old ones."""
        if settings == self.settings:
            return False
        self.settings = settings
        self.settings_generation += 1
        return True

    async def wait_for_settings(self) -> None:
        """Wait until the client's configuration is in force (or the wait times out)."""
        if self.settings_ready.is_set():
            return
        try:
            await asyncio.wait_for(self.settings_ready.wait(), SETTINGS_WAIT_S)
        except asyncio.TimeoutError:
            logger.warning(
                "no configuration from the client after %ss; using defaults", SETTINGS_WAIT_S
            )

    async def layered_diagnostics(
        self, snapshot: Snapshot, diagnostics: list[types.Diagnostic], related_support: bool
    ) -> list[types.Diagnostic]:
        """`diagnostics` (the static ones of `snapshot`) with every diagnostic layer applied."""
        for layer in self.diagnostic_layers:
            try:
                diagnostics = await layer(snapshot, diagnostics, related_support)
            except asyncio.CancelledError:
                raise
            except Exception:  # a layer's bug must not cost the user the static findings
                logger.exception("a diagnostic layer failed for %s", snapshot.uri)
        return diagnostics

    # -- documents ------------------------------------------------------------------------------

    def snapshot(self, uri: str) -> Snapshot | None:
        """The current text of an open document, or None when it is not open."""
        if uri not in self.documents:
            return None
        document = self.workspace.get_text_document(uri)
        return Snapshot(uri, document.version, document.source)

    def is_current(self, snapshot: Snapshot) -> bool:
        """Whether `snapshot` still is the document's text."""
        if snapshot.uri not in self.documents:
            return False
        document = self.workspace.get_text_document(snapshot.uri)
        return document.version == snapshot.version and document.source == snapshot.source

    def paths_of(self, uri: str) -> tuple[str | None, str | None]:
        """(the document's file path, where to look for `pyproject.toml` from). Documents
        without a path, such as unsaved buffers, use the workspace root's configuration."""
        path = to_fs_path(uri)
        if path is not None and "\x00" in path:
            path = None  # no file system call accepts it; analyse the text like a buffer
        start = path
        if start is None and self.workspace.root_uri:
            start = to_fs_path(self.workspace.root_uri)
        return path, start

    def forget_results(self, uri: str | None = None) -> None:
        """Drop cached analyses (of one document, or all) so the next request re-reads
        pyproject.toml, which the cache key does not cover."""
        for key, state in self.documents.items():
            if uri is None or key == uri:
                state.cache.clear()

    # -- other files ----------------------------------------------------------------------------

    @property
    def project(self) -> ProjectWorkspace:
        """The analysis workspace: the client's root folder, with open documents as overlay."""
        if self._project is None:
            root = to_fs_path(self.workspace.root_uri) if self.workspace.root_uri else None
            self._project = ProjectWorkspace(root, overlay=self._open_text)
        return self._project

    def _open_text(self, path: Path) -> str | None:
        """The editor's text of an open document at `path` (unsaved edits included)."""
        for uri in list(self.documents):
            own = to_fs_path(uri)
            if own is not None and Path(own).resolve() == path:
                with contextlib.suppress(Exception):
                    return self.workspace.get_text_document(uri).source
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

    # -- analysis -------------------------------------------------------------------------------

    async def analyse(self, snapshot: Snapshot, cross_file: bool = False) -> Outcome:
        """Findings for `snapshot` under the current settings (cached per version, settings
        and state of the other files). Names imported from other project files are followed
        as far as earlier resolutions know them; with `cross_file`, unknown ones are resolved
        too (jedi: slow the first time, so editors run it after publishing the fast pass)."""
        state = self.documents.get(snapshot.uri)
        key = (
            snapshot.version,
            self.settings_generation,
            snapshot.source,
            self.dependency_generation,
            cross_file,
        )
        if state is not None and (cached := state.cache.get(key)) is not None:
            return cached
        settings = self.settings
        loop = asyncio.get_running_loop()
        outcome = await loop.run_in_executor(
            self.analysis_pool,
            analyse_snapshot,
            snapshot,
            *self.paths_of(snapshot.uri),
            settings,
            self.project,
            cross_file,
            self.parsed_by_uri,
        )
        if outcome.config_error:
            self.warn_once(f"torchls: {outcome.config_error} (using default rule selection)")
        if outcome.error:
            self.log(f"torchls: {snapshot.uri} not analysed: {outcome.error}")
        if state is not None and self.documents.get(snapshot.uri) is state:
            # Keep only the newest entries (in-file and cross-file): older versions are never
            # asked for again.
            state.cache = {k: v for k, v in state.cache.items() if k[:4] == key[:4]}
            state.cache[key] = outcome
        return outcome


def selection_for(
    path: str | None, config_start: str | None, settings: Settings
) -> tuple[RuleSelection, str | None, str | None]:
    """(rule selection, filename relative to the project, config error) for one document."""
    config = ProjectConfig()
    error = None
    if config_start is not None:
        try:
            config = load_config(config_start)
        except ConfigError as problem:
            error = str(problem)
        except OSError as problem:  # an unreadable folder on the way up
            error = f"cannot read project configuration: {problem}"
    relative = config.relative(path) if path else None
    selection = config.selection(select=settings.select, ignore=settings.ignore)
    return selection, relative, error


def analyse_snapshot(
    snapshot: Snapshot,
    path: str | None,
    config_start: str | None,
    settings: Settings,
    project: ProjectWorkspace | None = None,
    cross_file: bool = False,
    parsed_by_uri: dict[str, ParsedSource] | None = None,
) -> Outcome:
    """Run on the worker thread: the pure analysis of one snapshot, never raising."""
    if len(snapshot.source) > MAX_DOCUMENT_CHARS:
        return Outcome(snapshot, error=f"larger than {MAX_DOCUMENT_CHARS} characters")
    previous = parsed_by_uri.pop(snapshot.uri, None) if parsed_by_uri is not None else None
    try:
        selection, relative, config_error = selection_for(path, config_start, settings)
        filename = path or snapshot.uri
        view = project.cached_view() if project is not None and not cross_file else None
        result = analyze(
            snapshot.source,
            filename,
            enabled=lambda code: selection.enabled(code, relative),
            workspace=(view or project) if path is not None else None,
            previous=previous,
            budget_s=ANALYSIS_BUDGET_S,
        )
    except Exception as error:  # the server must outlive any analysis bug
        logger.exception("analysis failed for %s", snapshot.uri)
        return Outcome(snapshot, error=f"internal error: {error}")
    if parsed_by_uri is not None and result.parsed is not None:
        parsed_by_uri[snapshot.uri] = result.parsed
    if result.error is not None:
        return Outcome(snapshot, error=result.error, config_error=config_error)
    return Outcome(
        snapshot,
        tuple(result.findings),
        None,
        config_error,
        cross_file=cross_file,
        needs_cross_file=view is not None and view.missed and path is not None,
        stopped_early=result.stopped_early,
    )
