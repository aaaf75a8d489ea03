"""Lifecycle and settings handlers: initialize, initialized, didChangeConfiguration, shutdown.

In: `initializationOptions`, the client's answers to `workspace/configuration` (section
`torchls`, asked only when the client supports it) and `workspace/didChangeConfiguration`. Out:
the server's effective `Settings`, and the `settings_ready` event that document work waits on so
that the first diagnostics of a document already honour the client's settings (lsp-notes §2.2).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Any

from lsprotocol import types
from pygls.capabilities import get_capability

from torchls.lsp.server import TorchLanguageServer
from torchls.lsp.settings import (
    SECTION,
    Settings,
    apply_settings,
    split_initialization_options,
    unwrap_section,
)

logger = logging.getLogger(__name__)


def _supports_configuration(server: TorchLanguageServer) -> bool:
    return bool(get_capability(server.client_capabilities, "workspace.configuration", False))


class SettingsLayers:
    """The raw layers behind the effective settings, so each source can change on its own."""

    def __init__(self) -> None:
        self.initialization: Any = None
        self.workspace: Any = None

    def effective(self, server: TorchLanguageServer) -> Settings:
        settings, problems = apply_settings(Settings(), self.initialization)
        settings, more = apply_settings(settings, self.workspace)
        for problem in (*problems, *more):
            server.warn_once(f"torchls: ignoring an invalid setting: {problem}")
        return settings


async def _fetch_workspace_settings(server: TorchLanguageServer) -> Any:
    """The client's `torchls` section, or None when it has none or the request fails."""
    params = types.ConfigurationParams(items=[types.ConfigurationItem(section=SECTION)])
    try:
        answer = await server.workspace_configuration_async(params)
    except Exception as error:  # a client that errors out must not stop diagnostics
        logger.warning("workspace/configuration failed: %s", error)
        return None
    # pygls hands the result over as a tuple or a list, one value per requested item.
    return answer[0] if isinstance(answer, list | tuple) and answer else None


async def refresh_settings(server: TorchLanguageServer, layers: SettingsLayers) -> bool:
    """Re-read the client's configuration; document work waits while the request is out."""
    server.settings_ready.clear()
    try:
        layers.workspace = await _fetch_workspace_settings(server)
        return server.set_settings(layers.effective(server))
    finally:
        server.settings_ready.set()


async def _register_configuration_notifications(server: TorchLanguageServer) -> None:
    """Ask clients that need it (VS Code) to send didChangeConfiguration for our section."""
    dynamic = get_capability(
        server.client_capabilities, "workspace.did_change_configuration.dynamic_registration", False
    )
    if not dynamic:
        return
    registration = types.Registration(
        id="torchls-configuration",
        method=types.WORKSPACE_DID_CHANGE_CONFIGURATION,
        register_options=types.DidChangeConfigurationRegistrationOptions(section=SECTION),
    )
    with contextlib.suppress(Exception):
        await server.client_register_capability_async(
            types.RegistrationParams(registrations=[registration])
        )


PARENT_POLL_S = 1.0


def watch_parent(pid: int) -> None:
    """LSP: "if the parent process is not alive then the server should exit". A client can
    die while something else (a wrapper, a multiplexer) still holds our stdin, so stdin EOF
    alone is not enough."""

    def poll() -> None:
        while True:
            time.sleep(PARENT_POLL_S)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                logger.warning("the client (pid %s) is gone; exiting", pid)
                os._exit(0)
            except PermissionError:
                pass  # alive, owned by someone else

    threading.Thread(target=poll, name="torchls-parent-watch", daemon=True).start()


def register(server: TorchLanguageServer) -> None:
    """Attach the lifecycle and configuration handlers to `server`."""
    layers = SettingsLayers()

    @server.feature(types.INITIALIZE)
    def initialize(ls: TorchLanguageServer, params: types.InitializeParams) -> None:
        ls.adopt_workspace()
        layers.initialization, ls.trusted = split_initialization_options(
            params.initialization_options
        )
        ls.set_settings(layers.effective(ls))
        if params.process_id is not None:
            watch_parent(params.process_id)
        for hook in ls.initialize_hooks:
            hook(params)
        if not _supports_configuration(ls):
            ls.settings_ready.set()  # nothing more will come; don't make documents wait

    @server.feature(types.INITIALIZED)
    async def initialized(ls: TorchLanguageServer, params: types.InitializedParams) -> None:
        if _supports_configuration(ls) and await refresh_settings(ls, layers):
            # Only matters when a document's wait for settings timed out meanwhile: its
            # request is superseded by this one, so it is never published twice.
            ls.settings_changed()
        await _register_configuration_notifications(ls)
        for hook in ls.initialized_hooks:
            await hook()

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    async def did_change_configuration(
        ls: TorchLanguageServer, params: types.DidChangeConfigurationParams
    ) -> None:
        if _supports_configuration(ls):
            await refresh_settings(ls, layers)
        else:
            # Clients without workspace/configuration (older Neovim) push the values instead.
            layers.workspace = unwrap_section(params.settings)
            ls.set_settings(layers.effective(ls))
        # Re-analyse even when the settings are unchanged: pyproject.toml may have changed too.
        ls.settings_changed()

    @server.feature(types.SHUTDOWN)
    def shutdown(ls: TorchLanguageServer, params: None) -> None:
        for hook in ls.shutdown_hooks:
            try:
                hook()
            except Exception:  # shutting down must always succeed
                logger.exception("a shutdown hook failed")
        ls.docs.shutdown()
