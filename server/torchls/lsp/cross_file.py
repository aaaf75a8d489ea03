"""Other files: watch the project's Python files on disk and re-check what depends on them.

In: `workspace/didChangeWatchedFiles` (registered dynamically when the client supports it).
Out: the analysis workspace forgets what it knew about those files, and open documents whose
findings came through them are re-checked. Edits to *open* documents are handled as they
happen (`documents.Documents`); this covers files changed outside the editor. It asks the
documents for a re-check (`refresh`), whose results reach every subscribed feature.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from lsprotocol import types
from pygls.capabilities import get_capability
from pygls.uris import to_fs_path

from torchls.lsp.server import TorchLanguageServer

logger = logging.getLogger(__name__)

WATCHER_ID = "torchls-python-files"


async def _watch_python_files(server: TorchLanguageServer) -> None:
    dynamic = get_capability(
        server.client_capabilities,
        "workspace.did_change_watched_files.dynamic_registration",
        False,
    )
    if not dynamic:
        return
    options = types.DidChangeWatchedFilesRegistrationOptions(
        watchers=[types.FileSystemWatcher(glob_pattern="**/*.py")]
    )
    registration = types.Registration(
        id=WATCHER_ID, method=types.WORKSPACE_DID_CHANGE_WATCHED_FILES, register_options=options
    )
    with contextlib.suppress(Exception):  # a client may refuse; open documents still work
        await server.client_register_capability_async(
            types.RegistrationParams(registrations=[registration])
        )


def files_changed(server: TorchLanguageServer, params: types.DidChangeWatchedFilesParams) -> None:
    paths = [Path(p).resolve() for c in params.changes if (p := to_fs_path(c.uri)) is not None]
    if not paths:
        return
    created_or_deleted = any(c.type != types.FileChangeType.Changed for c in params.changes)
    affected = set()
    if server.docs.has_project and not created_or_deleted:
        for path in paths:
            affected |= server.docs.project.dependents_of(path)
    if created_or_deleted:
        server.docs.layout_changed()
    server.docs.dependencies_changed(paths)
    for uri in list(server.docs.states):
        own = to_fs_path(uri)
        if own is None:
            continue
        # A new or deleted module can change where any import resolves: re-check everything.
        if created_or_deleted or Path(own).resolve() in affected:
            server.docs.refresh(uri, "dependency")


def register(server: TorchLanguageServer) -> None:
    server.initialized_hooks.append(lambda: _watch_python_files(server))

    @server.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)
    def did_change_watched_files(
        ls: TorchLanguageServer, params: types.DidChangeWatchedFilesParams
    ) -> None:
        files_changed(ls, params)
