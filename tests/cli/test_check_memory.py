"""A `check` run frees every file's facts when it ends, with no help from the collector.

Why: facts hold cycles (their memos point back at them, and at the facts of the files they
followed imports into). A caller that checks project after project (a bench, an editor
plugin, a CI driver in one process) would otherwise leave each run's picture of its project
for the cyclic collector, and pay for scanning it on every later collection. These tests
watch every facts object built during a run through weak references, with the collector off.
"""

from __future__ import annotations

import gc
import shutil
import weakref
from pathlib import Path

import pytest

import torchls.analysis.facts as facts_module
from torchls.checker import CheckOptions, ConfigResolver, check_paths

TWO_FILES = Path(__file__).resolve().parents[2] / "examples" / "two_files"


def test_a_cross_file_check_frees_all_its_facts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "two_files"
    shutil.copytree(TWO_FILES, project)
    built: list[weakref.ref] = []
    real_build = facts_module.build_facts

    def watching(*args, **kwargs):
        facts = real_build(*args, **kwargs)
        built.append(weakref.ref(facts))
        return facts

    monkeypatch.setattr(facts_module, "build_facts", watching)
    options = CheckOptions(root=project, jobs=1, cache=False)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        reports = check_paths([project / "train.py"], ConfigResolver(None), options)
        # train.py's own facts and those of models.py, which its findings come through.
        assert len(built) >= 2
        assert any("models.py" in f.message for r in reports for f in r.findings)
        assert [ref for ref in built if ref() is not None] == []
    finally:
        if was_enabled:
            gc.enable()
