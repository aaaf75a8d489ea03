"""Cross-file diagnostics in the editor: a softmax in models.py reported at the loss call in
train.py (with related information pointing at models.py), updated when models.py changes in
the editor or on disk."""

from __future__ import annotations

from pathlib import Path

import pytest
from lsprotocol import types
from pygls.uris import from_fs_path

from .support import (
    RecordingClient,
    change_doc,
    codes,
    open_doc,
    position_of,
    session,
)

MODELS = """\
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10, 3)

    def forward(self, x):
        return F.softmax(self.fc(x), dim=1)
"""
MODELS_LOGITS = MODELS.replace("F.softmax(self.fc(x), dim=1)", "self.fc(x)")
TRAIN = """\
import torch
import torch.nn as nn
from models import Net


def train(loader):
    model = Net()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters())
    for x, y in loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
"""


async def wait_for_codes(client: RecordingClient, uri: str, expected: list[str], since: int):
    params = await client.wait_for_publish(
        lambda p: p.uri == uri and codes(list(p.diagnostics)) == expected, since
    )
    return list(params.diagnostics)


@pytest.mark.asyncio
async def test_softmax_in_models_py_is_reported_in_train_py_and_cleared_by_an_edit(
    tmp_path: Path,
) -> None:
    (tmp_path / "models.py").write_text(MODELS)
    async with session("visual_studio_code", root=tmp_path) as client:
        train = open_doc(client, tmp_path / "train.py", TRAIN)
        diagnostics = await wait_for_codes(client, train.uri, ["TL101"], 0)
        finding = diagnostics[0]
        assert finding.range.start == position_of(TRAIN, "model(x), y", client.encoding)
        assert "models.py" in finding.message
        related = finding.related_information[0]
        assert related.location.uri == from_fs_path(str((tmp_path / "models.py").resolve()))
        assert related.location.range.start.line == 10  # the softmax line, 0-based

        # Edit models.py in the editor (unsaved) to return logits: train.py is re-checked.
        models = open_doc(client, tmp_path / "models.py", MODELS)
        since = len(client.publishes)
        change_doc(client, models, MODELS_LOGITS)
        await wait_for_codes(client, train.uri, [], since)
        # ...and back.
        since = len(client.publishes)
        change_doc(client, models, MODELS)
        await wait_for_codes(client, train.uri, ["TL101"], since)


@pytest.mark.asyncio
async def test_watched_file_change_on_disk_rechecks_dependents(tmp_path: Path) -> None:
    models_path = tmp_path / "models.py"
    models_path.write_text(MODELS)
    async with session("visual_studio_code", root=tmp_path) as client:
        train = open_doc(client, tmp_path / "train.py", TRAIN)
        await wait_for_codes(client, train.uri, ["TL101"], 0)
        since = len(client.publishes)
        models_path.write_text(MODELS_LOGITS)
        client.workspace_did_change_watched_files(
            types.DidChangeWatchedFilesParams(
                changes=[
                    types.FileEvent(
                        uri=from_fs_path(str(models_path)), type=types.FileChangeType.Changed
                    )
                ]
            )
        )
        await wait_for_codes(client, train.uri, [], since)


@pytest.mark.asyncio
async def test_pull_client_gets_cross_file_findings_in_one_answer(tmp_path: Path) -> None:
    (tmp_path / "models.py").write_text(MODELS)
    async with session("neovim", root=tmp_path) as client:
        assert client.pull
        train = open_doc(client, tmp_path / "train.py", TRAIN)
        report = await client.text_document_diagnostic_async(
            types.DocumentDiagnosticParams(text_document=types.TextDocumentIdentifier(train.uri))
        )
        assert codes(list(report.items)) == ["TL101"]
