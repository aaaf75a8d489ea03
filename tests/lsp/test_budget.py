"""A file whose analysis runs out of its time budget says so instead of looking clean."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from lsprotocol import types

from .support import SERVER_COMMAND, TRAIN, end_session, initialize, make_client, open_doc


@pytest.mark.asyncio
async def test_budget_exhaustion_is_reported_as_information(tmp_path: Path) -> None:
    client = make_client()
    env = {**os.environ, "TORCHLS_ANALYSIS_BUDGET_S": "0"}
    await client.start_io(*SERVER_COMMAND, env=env)
    try:
        await initialize(client, "visual_studio_code")
        doc = open_doc(client, tmp_path / "train.py", TRAIN)
        params = await client.wait_for_publish(lambda p: p.uri == doc.uri, 0)
        notes = [d for d in params.diagnostics if d.code is None]
        assert len(notes) == 1
        assert notes[0].severity == types.DiagnosticSeverity.Information
        assert "not checked" in notes[0].message and "TL101" in notes[0].message
    finally:
        await end_session(client)
