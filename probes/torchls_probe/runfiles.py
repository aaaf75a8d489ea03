"""The warm worker's side of a run's files: read back what a forked run left, then clear it.

In: the run's folder (its HOME, where the child wrote `report.json` and `output.txt`) and the
folders runs share inside the worker's sandbox (the scratch root, and under bubblewrap the
private `/tmp`, `/var/tmp`, `/dev/shm`). Out: the report text or why it was refused, the head and
tail of the output, and after `clear` whether anything a run left could not be removed (the
server then retires the worker rather than let one run weigh on the next).

The run's code could write these folders, so reads never follow a link (O_NOFOLLOW), never block
on a FIFO (O_NONBLOCK), accept only regular files and are bounded. Clearing never follows a link
and never enters another mount (the interpreter, the project and the probe are bound into
`/tmp`), and makes folders the code locked (mode 000) removable first. Stdlib only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from typing import Any

_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_DEPTH = 64  # deeper trees are left, and the worker reported as dirty


class Refused(OSError):
    pass


def _open_regular(path: str) -> int:
    name = os.path.basename(path)
    try:
        fd = os.open(path, _READ)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENXIO):
            raise Refused(error.errno, f"{name} is not a regular file") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Refused(errno.EINVAL, f"{name} is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


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


def read_report(path: str, limit: int) -> tuple[str | None, str | None]:
    """(the report's text, None), (None, why it was refused) or (None, None) when missing."""
    try:
        fd = _open_regular(path)
    except Refused as error:
        return None, error.strerror
    except OSError:
        return None, None
    try:
        if os.fstat(fd).st_size > limit:
            return None, f"report.json is larger than {limit >> 20} MB"
        data = _read_at(fd, 0, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        return None, f"report.json is larger than {limit >> 20} MB"
    return data.decode("utf-8", "replace"), None


def read_output(path: str, head: int, tail: int) -> dict[str, Any]:
    """The user's output as the server reports it: size, head and tail text."""
    empty: dict[str, Any] = {"bytes": 0, "head": "", "tail": "", "truncated": False}
    try:
        fd = _open_regular(path)
    except Refused as error:
        return {**empty, "note": error.strerror}
    except OSError:
        return empty
    try:
        size = os.fstat(fd).st_size
        first = _read_at(fd, 0, head)
        last = _read_at(fd, max(head, size - tail), tail) if size > head else b""
    finally:
        os.close(fd)
    return {
        "bytes": size,
        "head": first.decode("utf-8", "replace"),
        "tail": last.decode("utf-8", "replace"),
        "truncated": size > head + tail,
    }


class Shared:
    """A folder every run of the worker can write; `clear()` empties it and says whether it is
    back to how it was when the worker started."""

    def __init__(self, path: str) -> None:
        self.path = path
        status = os.stat(path)
        self.mode = stat.S_IMODE(status.st_mode)
        parent = os.stat(os.path.dirname(path.rstrip("/")) or "/")
        self.mount = status.st_dev != parent.st_dev  # a tmpfs of its own: compare its usage
        self.used = _used(path) if self.mount else (0, 0)

    def clear(self) -> bool:
        """Remove what runs left; True when nothing that takes space is left."""
        with contextlib.suppress(OSError):
            os.chmod(self.path, self.mode)  # a run may have locked the folder itself
        remove_contents(self.path)
        try:
            if self.mount:
                # Bytes and inodes: empty files, links and folders left (a tree too deep to
                # clear) take no bytes but would still greet the next run.
                bytes_used, inodes_used = _used(self.path)
                return bytes_used <= self.used[0] and inodes_used <= self.used[1]
            return not os.listdir(self.path)
        except OSError:
            return False


def _used(path: str) -> tuple[int, int]:
    """(bytes, inodes) in use on the file system of `path`."""
    status = os.statvfs(path)
    return (status.f_blocks - status.f_bfree) * status.f_frsize, status.f_files - status.f_ffree


def remove_contents(folder: str) -> None:
    """Empty `folder` on its own file system; never follows links or enters other mounts."""
    try:
        fd = os.open(folder, _DIRECTORY)
    except OSError:
        return
    try:
        _clear(fd, os.fstat(fd).st_dev, MAX_DEPTH)
    finally:
        os.close(fd)


def remove_tree(path: str) -> None:
    """Remove the folder `path` (a run's own) and everything in it."""
    remove_contents(path)
    with contextlib.suppress(OSError):
        os.rmdir(path)


def _clear(fd: int, device: int, depth: int) -> None:
    try:
        names = os.listdir(fd)
    except OSError:
        return
    for name in names:
        try:
            status = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            continue
        if status.st_dev != device:
            continue  # a mount point: bound in from the host, never ours to remove
        if not stat.S_ISDIR(status.st_mode):
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=fd)
            continue
        if depth <= 0:
            continue
        with contextlib.suppress(OSError):
            os.chmod(name, 0o700, dir_fd=fd)  # nothing else runs now: no swap for a link
        try:
            inner = os.open(name, _DIRECTORY, dir_fd=fd)
        except OSError:
            continue
        try:
            _clear(inner, device, depth - 1)
        finally:
            os.close(inner)
        with contextlib.suppress(OSError):
            os.rmdir(name, dir_fd=fd)
