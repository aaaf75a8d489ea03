"""The torchls language server object: settings, messages, hooks and the features' shared state.

Feature modules (`diagnostics`, `code_actions`, `hover`, `settings` handlers in `configuration`,
`repro`, ...) register their handlers on one `TorchLanguageServer`; this module owns what they
share, typed:

- the effective `Settings`, an event set once the client's configuration is known, and the
  settings-changed listeners (features subscribe instead of importing each other),
- `docs`, the open documents (`documents.Documents`: text sync, versions, snapshots, the
  analysis and its cache, and the events features subscribe to),
- the repro's results (`repro_store`), the layers that add them to diagnostics, and the repro
  feature's controller once registered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.workspace import Workspace

from torchls import __version__
from torchls.analysis.source import ParsedSource
from torchls.lsp.documents import (
    MAX_DOCUMENT_CHARS,
    Documents,
    DocumentState,
    LspTextDocument,
    LspWorkspace,
    Outcome,
    Snapshot,
)
from torchls.lsp.positions import LineIndex
from torchls.lsp.repro_state import ReproStore
from torchls.lsp.settings import Settings
from torchls.lsp.transport import TorchProtocol

if TYPE_CHECKING:
    from torchls.lsp.repro import ReproController
    from torchls.lsp.workflows import Workflows

# Re-exported: features and tests have always found these here.
__all__ = [
    "MAX_DOCUMENT_CHARS",
    "LspTextDocument",
    "Outcome",
    "Snapshot",
    "TorchLanguageServer",
]

logger = logging.getLogger(__name__)

DiagnosticLayer = Callable[
    [Snapshot, list[types.Diagnostic], bool], Awaitable[list[types.Diagnostic]]
]
SettingsListener = Callable[[], None]
HoverLayer = Callable[[Snapshot, int, int], Awaitable[str | None]]


NOTEBOOK_SYNC = types.NotebookDocumentSyncOptions(
    notebook_selector=[
        types.NotebookDocumentFilterWithNotebook(
            notebook=kind, cells=[types.NotebookCellLanguage(language="python")]
        )
        for kind in ("jupyter-notebook", "interactive")
    ],
    save=True,
)
"""Jupyter notebooks and VS Code's interactive window, their Python cells: announced only to
clients that say they sync notebooks. Named, not left open: a selector without `notebook` is
valid LSP but lsprotocol (so every pygls-based client) cannot read it back."""


class TorchLanguageServer(LanguageServer):
    """A `LanguageServer` that knows torchls settings and keeps per-document state."""

    def __init__(self) -> None:
        super().__init__(
            "torchls",
            __version__,
            protocol_cls=TorchProtocol,
            notebook_document_sync=NOTEBOOK_SYNC,
        )
        self.settings = Settings()
        self.settings_generation = 0
        self.settings_ready = asyncio.Event()
        # Features that must react to new settings (re-checking documents, say) subscribe here.
        self.settings_listeners: list[SettingsListener] = []
        # Whether the workspace may run code (the repro); only `trusted: false` says no.
        self.trusted = True
        self.initialize_hooks: list[Callable[[types.InitializeParams], None]] = []
        self.initialized_hooks: list[Callable[[], Awaitable[None]]] = []
        self.shutdown_hooks: list[Callable[[], None]] = []
        # Layers over the static diagnostics of a snapshot (the repro's TL9xx findings): each
        # gets the snapshot, the static diagnostics and whether related information is wanted,
        # and returns the full list to publish (or answer a pull with).
        self.diagnostic_layers: list[DiagnosticLayer] = []
        # Hover text other features add at a (row, code-point column) of a snapshot.
        self.hover_layers: list[HoverLayer] = []
        # What the repro runs found, per file (filled by the repro feature, read by the
        # diagnostics layer and the hover); `repro` is that feature's controller once registered.
        self.repro_store = ReproStore()
        self.repro: ReproController | None = None
        # The checkpoint, compare and report commands (`workflows`) once registered.
        self.workflows: Workflows | None = None
        # `webviewReports: true` in initializationOptions: the client (the VS Code extension)
        # shows repro reports itself, so the server never asks it to open them.
        self.webview_reports = False
        self._reported: set[str] = set()
        self.docs = Documents(self)

    # Shorthands for the documents' state that the repro's modules read.
    @property
    def documents(self) -> dict[str, DocumentState]:
        return self.docs.states

    @property
    def analysis_pool(self) -> ThreadPoolExecutor:
        return self.docs.analysis_pool

    @property
    def parsed_by_uri(self) -> dict[str, ParsedSource]:
        return self.docs.parsed_by_uri

    @property
    def pull_diagnostics(self) -> bool:
        """Whether the client pulls diagnostics (then nothing is pushed to it)."""
        return not self.docs.push

    # -- capabilities ---------------------------------------------------------------------------

    def adopt_workspace(self) -> None:
        """Make the workspace pygls created during `initialize` an `LspWorkspace` (it adds no
        state, only the document factory), before any document arrives."""
        if type(self.workspace) is Workspace:
            self.workspace.__class__ = LspWorkspace

    @property
    def position_encoding(self) -> str:
        return self.docs.position_encoding

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

    def settings_changed(self) -> None:
        """Tell every subscribed feature that the settings (or the project files they read)
        changed: cached results are dropped first, so what they re-check sees the change."""
        self.docs.forget_results()
        for listener in self.settings_listeners:
            listener()

    async def wait_for_settings(self) -> None:
        """Wait until the client's configuration is in force (or the wait times out)."""
        await self.docs.wait_for_settings()
