"""A run's folders on the host, and reading back files that the run's code may have tampered with.

In: the probe package to stage, and for a cold run its request. Out: a `RunFolder`, a private
(0700) folder per run or warm worker holding

- `probe/`: a copy of the probe package with read-only files (the child's PYTHONPATH) and, for
  a cold run, `request.json`; bubblewrap mounts it read-only, so no run can change the probe of
  another;
- `home/`: the run's writable scratch (HOME and TMPDIR); inside bubblewrap a size-limited
  tmpfs is mounted over it, so what the code writes there never reaches the host's disk;
- `out/report.json` and `out/output.txt` (cold runs): created empty by the server; bubblewrap
  binds these two files, not their folder, so the code can write them (each bounded by
  RLIMIT_FSIZE) but cannot add a file next to them or swap them for a link or a FIFO;
- `results/` (warm workers): where the worker puts each run's report and output, a tmpfs of its
  own inside bubblewrap so that a run filling its HOME still gets its report; the worker reads
  them back and sends them to the server, which reads nothing there itself;
- `stderr.txt`: the child's stderr, opened by the server; the child only gets the descriptor.

Without bubblewrap the code can write anything the user can, this folder included, so every
file is read back with `read_regular`/`read_tail`/`read_head_tail`: O_NOFOLLOW (a symlink to
/dev/zero is refused), O_NONBLOCK (a FIFO cannot block the open), a regular-file check on the
open descriptor and a bounded read. A refused file raises `Unreadable`, whose message says why.
`RunFolder.remove` never follows a link and copes with folders the code made unreadable.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

from torchls.probe.leftovers import REPRO, owned_prefix, remove_folder
from torchls.records import record

_READ_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
)
_KINDS = {
    stat.S_IFDIR: "a folder",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


class Unreadable(OSError):
    """A file the server refuses to read back (a link, a FIFO, a device, too large)."""


@record(frozen=True)
class RunFolder:
    """One cold run's, or one warm worker's, folder (layout above)."""

    root: Path

    @property
    def probe(self) -> Path:
        return self.root / "probe"

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def results(self) -> Path:
        return self.root / "results"

    @property
    def report(self) -> Path:
        return self.root / "out" / "report.json"

    @property
    def output(self) -> Path:
        return self.root / "out" / "output.txt"

    @property
    def rewrite(self) -> Path:
        """`torchls inspect --rewrite-plain`: the copy the run writes (created only then)."""
        return self.root / "out" / "rewrite.pt"

    @property
    def request_file(self) -> Path:
        return self.probe / "request.json"

    @property
    def stderr(self) -> Path:
        return self.root / "stderr.txt"

    @classmethod
    def create(cls, package: Path, cold: bool) -> RunFolder:
        """A new folder with the probe staged (still writable: `seal` makes it read-only);
        a cold run also gets its empty report and output files."""
        # The owner's pid in the name lets a later server remove it if this process is killed.
        folder = cls(Path(tempfile.mkdtemp(prefix=owned_prefix(REPRO))).resolve())
        try:
            folder.home.mkdir(mode=0o700)
            shutil.copytree(
                package,
                folder.probe / "torchls_probe",
                ignore=shutil.ignore_patterns("__pycache__"),
            )
            if cold:
                folder.report.parent.mkdir(mode=0o700)
                for path in (folder.report, folder.output):
                    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            else:
                folder.results.mkdir(mode=0o700)
        except BaseException:
            folder.remove()
            raise
        return folder

    def seal(self, request: dict[str, Any] | None) -> None:
        """Write a cold run's request next to the probe, then make both read-only."""
        if request is not None:
            self.request_file.write_text(json.dumps(request), encoding="utf-8")
        _read_only(self.probe)

    def remove(self) -> None:
        """Remove everything, never following a link (`leftovers.remove_folder`)."""
        remove_folder(self.root)


def _read_only(folder: Path) -> None:
    # Files only: the folders stay removable by their owner, so that a folder left behind by a
    # server that was killed can still be deleted with a plain `rm -r`. Permissions stop no
    # code running as the same user anyway; bubblewrap's read-only mount is what holds.
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            os.chmod(path, 0o444)


def open_regular(path: Path) -> int:
    """A descriptor on `path` if it is a regular file reached without following a link at its
    last component and without blocking; else `Unreadable` (or OSError: missing)."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise Unreadable(error.errno, f"{path.name} is a symbolic link") from None
        if error.errno == errno.ENXIO:
            raise Unreadable(error.errno, f"{path.name} is a socket") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
            raise Unreadable(errno.EINVAL, f"{path.name} is {kind}, not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: Path, limit: int) -> bytes:
    """The whole of a regular file of at most `limit` bytes."""
    fd = open_regular(path)
    try:
        if os.fstat(fd).st_size > limit:
            raise Unreadable(errno.EFBIG, f"{path.name} is larger than {_size(limit)}")
        data = _read_at(fd, 0, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:  # it grew after the check
        raise Unreadable(errno.EFBIG, f"{path.name} is larger than {_size(limit)}")
    return data


def read_tail(path: Path, limit: int) -> bytes:
    """The last `limit` bytes of a regular file."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        return _read_at(fd, max(0, size - limit), limit)
    finally:
        os.close(fd)


def read_head_tail(path: Path, head: int, tail: int) -> tuple[int, bytes, bytes]:
    """(size, the first `head` bytes, the last `tail` bytes after those) of a regular file."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        first = _read_at(fd, 0, head)
        last = _read_at(fd, max(head, size - tail), tail) if size > head else b""
        return size, first, last
    finally:
        os.close(fd)


def _read_at(fd: int, offset: int, limit: int) -> bytes:
    chunks = []
    while limit > 0:
        chunk = os.pread(fd, min(limit, 1 << 20), offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
        limit -= len(chunk)
    return b"".join(chunks)


def _size(limit: int) -> str:
    return f"{limit >> 20} MB" if limit >= 1 << 20 else f"{limit} bytes"
