"""The workspace's cache of other files' facts is bounded, and what leaves it is freed.

Why: an editor with hundreds of files open must stay small. The workspace keeps the facts of
at most `FACTS_LIMIT` other project files; a file leaving the cache takes its importers with
it (their memos point into it), and the facts dropped are released (cycles broken) only once
no analysis is running, since one may still be reading them.
"""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest

import torchls.analysis.resolver as resolver
from torchls.analysis import Workspace, analyze, forget_caches, summaries

MODULE = """\
import torch.nn as nn
import torch.nn.functional as F


class Net{n}(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return F.softmax(self.fc(x), dim=1)
"""
SCRIPT = """\
import torch.nn as nn
from m{n} import Net{n}


def train(loader):
    model = Net{n}()
    criterion = nn.CrossEntropyLoss()
    for x, y in loader:
        criterion(model(x), y).backward()
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    for n in range(6):
        (tmp_path / f"m{n}.py").write_text(MODULE.format(n=n))
        (tmp_path / f"train{n}.py").write_text(SCRIPT.format(n=n))
    return tmp_path


def _check(project: Path, workspace: Workspace, n: int) -> list[str]:
    path = project / f"train{n}.py"
    return [f.code for f in analyze(path.read_text(), str(path), workspace=workspace).findings]


def test_at_most_the_limit_is_kept_and_findings_do_not_change(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resolver, "FACTS_LIMIT", 2)
    workspace = Workspace(project)
    first = [_check(project, workspace, n) for n in range(6)]
    assert all("TL101" in codes for codes in first)  # followed into each m<n>.py
    assert len(workspace._facts) <= 2
    # Evicted modules are built again when needed: the same findings on a second round.
    assert [_check(project, workspace, n) for n in range(6)] == first


def test_dropped_facts_are_released_once_no_analysis_runs(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resolver, "FACTS_LIMIT", 1)
    workspace = Workspace(project)
    _check(project, workspace, 0)
    first = weakref.ref(workspace._facts[(project / "m0.py").resolve()][1])
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        with workspace.analysing():
            _check(project, workspace, 1)  # m1 pushes m0 out of the cache...
            assert first() is not None  # ...but an analysis is running: m0 stays whole
            assert first().classes  # type: ignore[union-attr]
        # No analysis left: m0's facts are released, freed by reference counting alone.
        assert first() is None
    finally:
        if was_enabled:
            gc.enable()


def test_an_importer_leaves_the_cache_with_what_it_imports(tmp_path: Path) -> None:
    (tmp_path / "layers.py").write_text(MODULE.format(n=0))
    (tmp_path / "models.py").write_text("from layers import Net0\n")  # a re-export
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(n=0).replace("from m0 import", "from models import"))
    workspace = Workspace(tmp_path)
    codes = [f.code for f in analyze(script.read_text(), str(script), workspace=workspace).findings]
    assert "TL101" in codes  # through models.py into layers.Net0
    models, layers = (tmp_path / "models.py").resolve(), (tmp_path / "layers.py").resolve()
    assert {models, layers} <= set(workspace._facts)
    # layers.py changes: models.py's memos point at its old facts, so both leave the cache.
    workspace.invalidate(tmp_path / "layers.py")
    assert models not in workspace._facts
    assert layers not in workspace._facts


def test_forgetting_the_process_caches_changes_no_finding(project: Path) -> None:
    workspace = Workspace(project)
    before = _check(project, workspace, 0)
    assert summaries._text_cache  # the check summarised functions by their text
    forget_caches()
    assert not summaries._text_cache
    assert _check(project, Workspace(project), 0) == before
