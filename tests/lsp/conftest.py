"""Fixtures for the language-server tests.

`client` is one server per editor flavour ("visual_studio_code": push diagnostics and versioned
document edits; "neovim": pull diagnostics, UTF-8 positions, plain `changes` edits), shared by
the whole session; tests open their own documents under `tmp_path`, so they never see each
other's state. Tests needing other settings start their own server with `support.session`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import pytest_lsp
from pytest_asyncio import is_async_test
from pytest_lsp import ClientServerConfig

from .support import SERVER_COMMAND, RecordingClient, end_session, initialize, make_client

CLIENTS = ["visual_studio_code", "neovim"]
HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # One event loop for the session, so session-scoped servers can serve every test; and any
    # LSP spec violation the client notices fails the test.
    session_loop = pytest.mark.asyncio(loop_scope="session")
    strict_spec = pytest.mark.filterwarnings("error::pytest_lsp.LspSpecificationWarning")
    for item in items:
        if HERE not in item.path.parents:
            continue
        item.add_marker(strict_spec)
        if is_async_test(item):
            item.add_marker(session_loop, append=False)


@pytest_lsp.fixture(
    config=ClientServerConfig(server_command=SERVER_COMMAND, client_factory=make_client),
    scope="session",
    params=CLIENTS,
)
async def client(request: pytest.FixtureRequest, lsp_client: RecordingClient):
    await initialize(lsp_client, request.param)
    yield
    await end_session(lsp_client)
