"""The warm worker: same report as a cold run, a fresh child per run, contained the same way."""

from __future__ import annotations

import socket
import sys
import threading
import time

import pytest

from tests.probe import cases
from tests.probe.support import layer, leftovers
from torchls.probe import ReproCancelled, ReproOptions, run_repro

if not sys.platform.startswith("linux"):
    pytest.skip("the warm worker forks: Linux only", allow_module_level=True)


def test_warm_run_matches_a_cold_run(warm_repro):
    warm, path = warm_repro(cases.NAN_LOG, name="compare.py")
    again, _ = warm_repro(cases.NAN_LOG, name="compare.py")
    cold = run_repro(path, ReproOptions(python=sys.executable, timeout_s=30.0))
    assert cold.data["timing"]["runner"] == "cold"
    assert warm.data["findings"] == cold.data["findings"]
    assert warm.data["lines"] == cold.data["lines"]
    assert warm.data["environment"] == cold.data["environment"]
    assert warm.without_timing() == again.without_timing()


def test_progress_stages(warm_session, warm_repro):
    _, path = warm_repro(cases.CLEAN, name="stages.py")
    events = []
    options = ReproOptions(python=sys.executable, timeout_s=30.0)
    warm_session.run(path, options, on_progress=events.append)
    stages = [event.stage for event in events]
    assert stages[0] == "start" and stages[-1] == "done"
    steps = [(e.message, e.step, e.total) for e in events if e.stage == "step"]
    assert steps == [("step 1 of 2", 1, 2), ("step 2 of 2", 2, 2)]


def test_warm_child_sees_edits_to_the_file(warm_repro):
    first, _ = warm_repro(cases.CLEAN, name="edited.py")
    second, _ = warm_repro(cases.EXCEPTION, name="edited.py")
    assert first.findings == []
    assert [f.code for f in second.findings] == ["TL905"]


def test_warm_child_has_no_network(warm_repro):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    try:
        report, _ = warm_repro(cases.NETWORK, argv=(str(listener.getsockname()[1]),))
        if not layer(report, "network")["held"]:
            pytest.skip("no network isolation here")
        assert "BLOCKED" in report.data["output"]["head"]
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()


def test_warm_fork_bomb_leaves_only_the_worker(warm_repro):
    warm_repro("x = 1\n", name="before_bomb.py")  # the worker exists before we count
    before = set(leftovers("torchls_probe.worker"))
    report, _ = warm_repro(cases.FORK_BOMB, timeout_s=3.0)
    assert report.status == "timeout"
    assert layer(report, "pid_namespace")["held"]
    assert set(leftovers("torchls_probe.worker")) == before


def test_warm_cancel_kills_the_child_and_keeps_the_worker(warm_session, warm_repro):
    _, path = warm_repro("x = 1\n", name="cancelled.py")
    path.write_text(cases.HANG)
    cancel = threading.Event()

    def on_progress(event):
        if event.stage == "run":
            cancel.set()

    options = ReproOptions(python=sys.executable, timeout_s=30.0)
    with pytest.raises(ReproCancelled):
        warm_session.run(path, options, on_progress=on_progress, cancel_event=cancel)
    report, _ = warm_repro(cases.CLEAN, name="after_cancel.py")
    assert report.findings == []


def test_closing_a_session_while_its_worker_starts_leaves_nothing(tmp_path, monkeypatch):
    """The editor can shut down while the first repro's warm worker is still importing torch;
    the worker (its folder and processes) used to be left behind, unseen by close()."""
    import tempfile

    from torchls.probe import ReproSession
    from torchls.probe.prepare import prepare

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "train.py").write_text(cases.CLEAN)
    session = ReproSession()
    session.prewarm_prepared(prepare(tmp_path / "train.py", ReproOptions(python=sys.executable)))
    for _ in range(600):  # a safety net of 30 s, not a timing assertion
        if list(tmp_path.glob("torchls-repro-*")):
            break  # the worker exists and is starting
        time.sleep(0.05)
    session.close()
    assert not list(tmp_path.glob("torchls-repro-*"))
    assert leftovers(str(tmp_path)) == []


def printed(report) -> str:
    return report.data["output"]["head"] + report.data["output"]["tail"]


DEEP = ["d"] * 70  # deeper than the worker clears
PLANT_DEEP = f"""\
import os

for base in ("/tmp", "/dev/shm"):
    folder = os.path.join(base, *{DEEP!r})
    os.makedirs(folder)
    open(os.path.join(folder, "PLANTED"), "w").close()
"""
FIND_DEEP = """\
import os

left = [base for base in ("/tmp", "/dev/shm") if os.path.lexists(os.path.join(base, "d"))]
print("LEFT", left)
"""


def test_a_tree_too_deep_to_clear_never_reaches_the_next_run(warm_repro):
    """The worker empties the shared folders after each run, down to a depth; an empty file
    70 folders down took no bytes, so the worker thought itself clean and the next run found
    it. Now inodes count too: the worker is replaced."""
    warm_repro(PLANT_DEEP, name="plant_deep.py")
    report, _ = warm_repro(FIND_DEEP, name="find_deep.py")
    assert "LEFT []" in printed(report), printed(report)


SHM_KEY = 0x70C4  # IPC_CREAT is 0o1000
PLANT_SHM = f"""\
import ctypes

libc = ctypes.CDLL(None, use_errno=True)
print("PLANTED", libc.shmget({SHM_KEY}, 1 << 20, 0o1600))
"""
FIND_SHM = f"""\
import ctypes

libc = ctypes.CDLL(None, use_errno=True)
print("SEEN", libc.shmget({SHM_KEY}, 0, 0))
"""


def test_sysv_shared_memory_does_not_outlive_a_warm_run(warm_repro):
    """Warm runs shared the worker's IPC namespace: a SysV segment one run created stayed
    allocated (host memory, outside every limit) and readable by every later run."""
    planted, _ = warm_repro(PLANT_SHM, name="plant_shm.py")
    assert "PLANTED -1" not in printed(planted) and "PLANTED" in printed(planted)
    report, _ = warm_repro(FIND_SHM, name="find_shm.py")
    assert "SEEN -1" in printed(report), printed(report)


def test_worker_lines_are_split_across_reads_and_overlong_ones_dropped():
    from torchls.probe.warm import LineSplitter

    lines = LineSplitter(limit=10)
    assert lines.feed(b'{"a"') == []
    assert lines.feed(b': 1}\n{"b": 2}\nxx') == [b'{"a": 1}', b'{"b": 2}']
    assert lines.feed(b"y" * 20) == []  # past the limit: dropped up to its end
    assert lines.feed(b"zz\n{}\n") == [b"{}"]
    assert lines.feed(b"0123456789\n") == [b"0123456789"]


FILLS_THE_PROJECT = """\
import os
import time

# Files under the file-size limit each, more than it in all, in the project's copy.
for index in range(8):
    with open(f"part{index}.bin", "wb") as handle:
        handle.write(b"x" * (1 << 20))
time.sleep(20)
"""


def test_a_warm_run_that_fills_the_projects_copy_is_stopped_for_disk(warm_repro):
    # Unwatched, the run would sleep its 20 s out and end normally (stopped_by "end").
    report, path = warm_repro(FILLS_THE_PROJECT, file_size_mb=2, timeout_s=30.0)
    assert report.data["stopped_by"] == "disk", report.data
    [stop] = [f for f in report.findings if f.code == "TL906"]
    assert "file-size limit of 2 MB" in stop.message
    assert report.data["timing"]["runner"] == "warm"
    assert not list(path.parent.glob("part*.bin"))  # nothing reached the real folder
