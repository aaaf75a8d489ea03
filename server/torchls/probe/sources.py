"""Source lines for what a run reported, without letting the report choose which host file is read.

A run's report names files and lines (where a NaN was born, where the code raised). The run
executes the user's code in the user's interpreter, so it can forge those names: a location of
`~/.ssh/id_rsa`, `/proc/self/environ` or `/dev/zero` must never make the CLI print a secret or
the server read without end. In: the project root the host chose (never one from the report),
texts the host already holds (an open editor buffer, the file it started), and report paths.
Out: a file's lines, or None. A file is read only if it is

- a text the host already holds, or
- a regular file inside the project root, reached without a symbolic link anywhere on its path,
  not under /proc, /dev or /sys, at most `MAX_FILE_BYTES`, and among the first `MAX_FILES`
  distinct files asked for.

A notebook's lines are those of its code cells read as one module, the rows its run reports.
Each file is read once per `ProjectSources` (one per run) and kept, so a refresh never goes back
to the disk. Everything else is shown without source lines.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from torchls.analysis.source import split_lines
from torchls.notebook import CellMap, NotebookError, read_notebook
from torchls.probe.scratch import Unreadable, read_regular

MAX_FILE_BYTES = 2 << 20
MAX_FILES = 64
_SYSTEM = ("/proc", "/dev", "/sys")


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


class ProjectSources:
    """The lines of the files a report may show, read safely and at most once each."""

    def __init__(
        self,
        root: str | os.PathLike[str] | None,
        held: dict[str, str] | None = None,
        allow: tuple[str, ...] | list[str] = (),
    ) -> None:
        self.root = os.path.realpath(os.fspath(root)) if root is not None else None
        self._held = {os.path.realpath(path): text for path, text in (held or {}).items()}
        # Files the host itself named (the target), readable even outside the root.
        self._allow = {os.path.realpath(path) for path in allow}
        self._cache: dict[str, list[str] | None] = {}
        self._cells: dict[str, CellMap | None] = {}

    def allowed(self, filename: object) -> str | None:
        """The normalised path of `filename` if it may be read at all, else None."""
        if not isinstance(filename, str) or not filename or "\x00" in filename:
            return None
        if not os.path.isabs(filename) or len(filename) > 4096:
            return None
        normal = os.path.normpath(filename)
        if normal in self._held:
            return normal
        if normal in self._allow:
            return normal
        if self.root is None or any(_inside(normal, system) for system in _SYSTEM):
            return None
        # realpath differs from the plain normalised path exactly when a link is on the way.
        if os.path.realpath(normal) != normal or not _inside(normal, self.root):
            return None
        return normal

    def lines(self, filename: object) -> list[str] | None:
        """The lines of `filename` (no line ends), or None when it may not or cannot be read."""
        path = self.allowed(filename)
        if path is None:
            return None
        if path in self._cache:
            return self._cache[path]
        if path in self._held:
            found: list[str] | None = split_lines(self._held[path])
        elif len(self._cache) >= MAX_FILES:
            return None
        else:
            found = _read(path)
        self._cache[path] = found
        return found

    def cells(self, filename: object) -> CellMap | None:
        """A notebook's cell map (its rows → cell and line), under the same rules as `lines`;
        None for any other file."""
        path = self.allowed(filename)
        if path is None or not path.endswith(".ipynb"):
            return None
        if path not in self._cells:
            found = None
            with contextlib.suppress(Unreadable, OSError, NotebookError):
                found = read_notebook(read_regular(Path(path), MAX_FILE_BYTES)).map
            self._cells[path] = found
        return self._cells[path]

    def line(self, filename: object, row: object) -> str:
        """Line `row` (1-based) of `filename`, or "" when unknown."""
        if isinstance(row, bool) or not isinstance(row, int):
            return ""
        found = self.lines(filename)
        return found[row - 1] if found is not None and 1 <= row <= len(found) else ""


def _read(path: str) -> list[str] | None:
    try:
        data = read_regular(Path(path), MAX_FILE_BYTES)
    except (Unreadable, OSError):
        return None
    return source_lines(path, data)


def source_lines(path: str, data: bytes) -> list[str] | None:
    """The lines a report's rows count in: a file's text, or, for a notebook, its code cells
    as the one module the run executed (`torchls.notebook`); None when undecodable."""
    if path.endswith(".ipynb"):
        try:
            return split_lines(read_notebook(data).text)
        except NotebookError:
            return None
    try:
        return split_lines(data.decode("utf-8"))
    except UnicodeDecodeError:
        return None
