"""Removing a run's folder on the host, as the user the server runs as (not root).

Without bubblewrap a run's code writes its folder with the server's rights and can lock a
subfolder (mode 000) before it ends; root ignores the mode, so the removal is checked in a
forked child that becomes an unprivileged user when the tests run as root.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from torchls.probe.locate import probe_package
from torchls.probe.scratch import RunFolder

NOBODY = 65534

if not sys.platform.startswith("linux"):
    pytest.skip("the probe's folders are tested on Linux", allow_module_level=True)


def _as_unprivileged(tree: Path, action) -> int:
    """Run `action()` in a child that owns `tree` and is not root; its exit status."""
    child = os.fork()
    if child == 0:  # pragma: no cover - the child only reports through its status
        status = 1
        try:
            if os.geteuid() == 0:
                for folder, names, files in os.walk(tree):
                    for name in [folder, *(os.path.join(folder, n) for n in names + files)]:
                        os.lchown(name, NOBODY, NOBODY)
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            action()
            status = 0
        finally:
            os._exit(status)
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_folder_locked_by_the_run_is_removed_with_the_rest(monkeypatch) -> None:
    """`rmtree`'s error handler was given `os.open` for a locked folder and called it without
    flags: TypeError out of the run's clean-up, and the folder stayed in the temp folder."""
    base = Path(tempfile.mkdtemp(prefix="torchls-scratch-test-"))
    base.chmod(0o777)
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    try:
        folder = RunFolder.create(probe_package(), cold=True)
        locked = folder.home / "locked" / "inner"
        locked.mkdir(parents=True)
        (locked / "weights.bin").write_bytes(b"x" * 100)
        (folder.home / "locked" / "note.txt").write_text("left by the run")

        def lock_and_remove() -> None:
            os.chmod(folder.home / "locked", 0)
            folder.remove()

        assert _as_unprivileged(folder.root, lock_and_remove) == 0
        assert not folder.root.exists()
    finally:
        for path, names, _ in os.walk(base):
            for name in names:
                os.chmod(os.path.join(path, name), 0o700)
        shutil.rmtree(base, ignore_errors=True)
