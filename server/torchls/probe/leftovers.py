"""Temporary folders of torchls processes that are gone: name them by owner, find them, remove them.

A repro's `RunFolder` (and the rule pages of `torchls.showRuleDoc`) live in the temporary folder
and are removed by the process that made them, when it closes them or exits. A process that is
killed first leaves them behind: eglot kills its server right after `exit`, a user runs
`kill -9`, the server's parent watch ends it with `os._exit`. Nothing else would ever remove
them, so:

- `owned_prefix(kind)` is the `mkdtemp` prefix for a new folder: `torchls-repro-` becomes
  `torchls-repro-<pid>-<pid namespace>-`, so the owner can be told from the name alone;
- `sweep()` (the server calls it at start-up) removes the folders whose owner is dead. It only
  judges folders of this user, in this PID namespace (a pid means nothing in another one), whose
  name it fully parses; a live owner, a reused pid or a folder without an owner in its name is
  left alone, so a live process never loses its folder;
- `watch_this_process()` starts a small helper (`python -m torchls.probe.leftovers --owner ...`)
  that blocks on a pipe only this process can write to, and on end of file (this process died,
  however it died) removes this process's folders. A clean exit has removed them already.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

REPRO = "torchls-repro-"
RULES = "torchls-rules-"
KINDS = (REPRO, RULES)
# mkdtemp's random part is drawn from lowercase letters, digits and "_".
_NAME = re.compile(r"(torchls-(?:repro|rules)-)(\d+)-(\d+)-[a-z0-9_]+")

_watch_lock = threading.Lock()
_watch_pipe: int | None = None  # the write end; held, never written, closed only by death


def pid_namespace() -> int:
    """This process's PID namespace (its inode number), 0 where there is no such thing."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def owned_prefix(kind: str) -> str:
    """The `tempfile.mkdtemp` prefix for a new folder of `kind` owned by this process."""
    if kind not in KINDS:
        raise ValueError(f"unknown folder kind {kind!r}")
    return f"{kind}{os.getpid()}-{pid_namespace()}-"


def owner_of(name: str) -> tuple[int, int] | None:
    """(pid, PID namespace) of the process that made the folder called `name`, if it says."""
    match = _NAME.fullmatch(name)
    return (int(match[2]), int(match[3])) if match else None


def is_alive(pid: int) -> bool:
    """Whether `pid` is a running process (a zombie has finished: it only waits to be reaped)."""
    if pid <= 0:
        return True  # not a real owner: never treat it as gone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def sweep(temp: str | Path | None = None, owner: tuple[int, int] | None = None) -> list[Path]:
    """Remove the leftover folders in `temp` (default: the temporary folder) and return them.

    Without `owner`: every folder whose owner is dead. With `owner` (pid, namespace): that
    owner's folders, without asking whether it lives (the watcher knows it died, and it may
    still be a zombie waiting for its parent)."""
    here = pid_namespace()
    base = Path(temp if temp is not None else tempfile.gettempdir())
    removed: list[Path] = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    for entry in entries:
        found = owner_of(entry.name)
        if found is None or found[1] != here:
            continue
        if owner is not None and found != owner:
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not entry.is_dir(follow_symlinks=False) or info.st_uid != os.getuid():
            continue
        if owner is None and is_alive(found[0]):
            continue
        path = Path(entry.path)
        with contextlib.suppress(OSError):
            remove_folder(path)  # never follows a link, copes with locked folders
        if not path.exists():
            removed.append(path)
    return removed


def remove_folder(folder: Path) -> None:
    """Remove `folder` and everything in it, never following a link; folders the code (or
    the read-only staging) made unwritable are made writable first."""
    root = str(folder)

    def retry(function: Any, path: str, _error: Any) -> None:
        parent = os.path.dirname(path)
        # Only ever a folder of this run: never the temp folder that holds it.
        if not (parent == root or parent.startswith(root + os.sep)) or os.path.islink(parent):
            return
        with contextlib.suppress(OSError):
            os.chmod(parent, 0o700)  # removing an entry needs its folder writable
        if function in (os.unlink, os.remove, os.rmdir):
            with contextlib.suppress(OSError):
                function(path)
            return
        # Opening or listing failed (`os.open`, `os.scandir`...: a folder the code locked,
        # mode 000): unlock that folder and remove it whole. Never call `function` here,
        # its arguments are not ours to guess; and recurse only once it is unlocked.
        if os.path.islink(path):
            return
        try:
            os.chmod(path, 0o700)
        except OSError:
            return
        shutil.rmtree(path, onerror=retry)

    if folder.is_symlink() or not folder.is_dir():
        return
    shutil.rmtree(folder, onerror=retry)


def watch_this_process() -> None:
    """Start, once per process, the helper that removes this process's folders after it dies.

    The helper runs in its own session (a signal to our process group does not reach it) and
    reads a pipe whose write end only this process holds: the descriptor is not inheritable
    and every subprocess torchls starts closes the others, so end of file means we are gone."""
    global _watch_pipe
    with _watch_lock:
        if _watch_pipe is not None:
            return
        read_end, write_end = os.pipe()
        try:
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "torchls.probe.leftovers",
                    "--owner",
                    str(os.getpid()),
                    str(pid_namespace()),
                    "--temp",
                    tempfile.gettempdir(),
                ],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )
        except OSError:
            os.close(write_end)
            return  # without the helper, the next server's start-up sweep still cleans up
        finally:
            os.close(read_end)
        _watch_pipe = write_end


def main(argv: list[str] | None = None) -> int:
    """The helper: wait for end of file on stdin, then remove the owner's folders."""
    parser = argparse.ArgumentParser(prog="python -m torchls.probe.leftovers")
    parser.add_argument("--owner", nargs=2, type=int, metavar=("PID", "NAMESPACE"))
    parser.add_argument("--temp", default=None)
    args = parser.parse_args(argv)
    if args.owner is None:
        sweep(args.temp)
        return 0
    with contextlib.suppress(OSError):
        while os.read(sys.stdin.fileno(), 1 << 16):
            pass  # nobody writes; this only returns at end of file
    sweep(args.temp, owner=(args.owner[0], args.owner[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
