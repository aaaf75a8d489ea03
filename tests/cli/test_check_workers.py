"""`torchls check` across workers: forked children, a pool of started workers, and what
happens when a child dies or hands back nothing usable.

Each check runs in a fresh interpreter (a driver script, below) so that forking happens from
a process with no other thread, as in the CLI, and so a test can replace what a child does
(the fork copies the replacement into it). The driver counts the forks it saw and the shares
the parent analysed, so a test knows which path really ran; it prints the findings as JSON.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torchls.checker import _Job, _shares

REPO = Path(__file__).resolve().parents[2]

DRIVER = r"""
import json, os, sys
from pathlib import Path
from torchls import checker
from torchls.checker import CheckOptions, ConfigResolver, check_paths, discover

root, jobs, mode = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
forks = []
real_fork = os.fork
def counting_fork():
    pid = real_fork()
    if pid:
        forks.append(pid)
    return pid
os.fork = counting_fork
batches = []
real_batch = checker._Session.run_batch
def counting_batch(self, share, each=None):
    batches.append(len(share))
    return real_batch(self, share, each)
checker._Session.run_batch = counting_batch

if mode == "pool":
    checker._can_fork = lambda: False
elif mode == "child-dies":
    checker._child = lambda share, options, reading, writing: os._exit(3)
elif mode == "child-garbles":
    def garbled(share, options, reading, writing):
        os.write(writing, b"not a pickle")
        os._exit(0)
    checker._child = garbled
elif mode == "child-hands-back-too-little":
    def short(share, options, reading, writing):
        import pickle
        os.write(writing, pickle.dumps([]))
        os._exit(0)
    checker._child = short

resolver = ConfigResolver(root / "pyproject.toml")
files = discover([str(root)], resolver).files
options = CheckOptions(root=root, jobs=jobs, cache=False)
rows = [
    [report.filename, f.code, f.span.start.row, f.span.start.column, f.message]
    for report in check_paths(files, resolver, options)
    for f in report.findings
]
json.dump({"findings": rows, "forks": len(forks), "batches": batches, "files": len(files)},
          sys.stdout)
"""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The examples and the rule fixtures, copied (so nothing is written into the repo)."""
    root = tmp_path_factory.mktemp("workers")
    shutil.copytree(REPO / "examples", root / "examples")
    shutil.copytree(
        REPO / "tests" / "rules" / "fixtures",
        root / "fixtures",
        ignore=shutil.ignore_patterns("*.expected"),
    )
    (root / "pyproject.toml").write_text("", encoding="utf-8")
    return root


def check(root: Path, jobs: int, mode: str = "plain") -> dict:
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(root), str(jobs), mode],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def serial(corpus: Path) -> dict:
    result = check(corpus, 1)
    assert result["forks"] == 0
    assert result["files"] > 50 and len(result["findings"]) > 50
    return result


def test_forked_workers_find_exactly_what_one_process_finds(corpus: Path, serial: dict):
    result = check(corpus, 3)
    assert result["forks"] == 2  # two children; the parent analysed the first share
    assert result["batches"] == [result["batches"][0]]
    assert 0 < result["batches"][0] < result["files"]
    assert result["findings"] == serial["findings"]


def test_started_workers_find_exactly_what_one_process_finds(corpus: Path, serial: dict):
    result = check(corpus, 2, "pool")
    assert result["forks"] == 0 and result["batches"] == []  # all of it in the pool's workers
    assert result["findings"] == serial["findings"]


@pytest.mark.parametrize("mode", ["child-dies", "child-garbles", "child-hands-back-too-little"])
def test_a_share_a_child_does_not_hand_back_is_checked_by_the_parent(
    corpus: Path, serial: dict, mode: str
):
    result = check(corpus, 2, mode)
    assert result["forks"] == 1
    # The parent's own share, then the child's share again.
    assert len(result["batches"]) == 2 and sum(result["batches"]) == result["files"]
    assert result["findings"] == serial["findings"]


def job(index: int, size: int) -> _Job:
    return _Job(index, Path(f"f{index}.py"), b"x" * size, ())


def test_shares_are_runs_of_neighbours_of_about_the_same_size():
    jobs = [job(i, size) for i, size in enumerate([10, 10, 10, 10, 40, 5, 5, 5, 5])]
    shares = _shares(jobs, 3)
    assert [j.index for share in shares for j in share] == list(range(9))  # each once, in order
    assert len(shares) == 3 and all(shares)
    sizes = [sum(len(j.data) for j in share) for share in shares]
    assert max(sizes) <= 50 and min(sizes) >= 20
    # Never more shares than jobs, and never an empty one.
    assert [len(s) for s in _shares(jobs[:2], 4)] == [1, 1]
    assert [len(s) for s in _shares([job(0, 100), job(1, 1), job(2, 1)], 2)] == [1, 2]


def test_no_cyclic_collection_runs_while_a_project_is_checked(corpus: Path, monkeypatch):
    """The collector is paused from the first file to the release of the project's picture,
    and as it was afterwards (a collection mid-check would scan every kept parse)."""
    import gc

    from torchls import checker
    from torchls.checker import CheckOptions, ConfigResolver, check_paths, discover

    collections: list[int] = []
    enabled_at_each_file: list[bool] = []
    collections_by_then: list[int] = []
    real_run = checker._Session.run
    real_finish = checker._Session.finish.__func__  # type: ignore[attr-defined]

    def recording(self, job):
        enabled_at_each_file.append(gc.isenabled())
        collections_by_then.append(len(collections))
        return real_run(self, job)

    def finishing(cls, options):
        real_finish(cls, options)
        collections_by_then.append(len(collections))  # the picture released: still none

    monkeypatch.setattr(checker._Session, "run", recording)
    monkeypatch.setattr(checker._Session, "finish", classmethod(finishing))

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            collections.append(info["generation"])

    resolver = ConfigResolver(corpus / "pyproject.toml")
    files = discover([str(corpus / "examples")], resolver).files
    assert gc.isenabled()
    gc.callbacks.append(count)
    try:
        reports = check_paths(files, resolver, CheckOptions(root=corpus, jobs=1, cache=False))
    finally:
        gc.callbacks.remove(count)
    assert len(enabled_at_each_file) == len(files) > 5 and not any(enabled_at_each_file)
    assert collections_by_then == [0] * (len(files) + 1)
    assert gc.isenabled()
    assert sum(len(report.findings) for report in reports) > 5
