"""The project around a checked file, as `torchls check` and the editor's cross-file pass use it.

Why: the analysis follows imported names into other project files through its `Workspace`,
whose project index names project modules from the file system (jedi, at tens of milliseconds
a question, only where the index cannot walk the project). This module gives `analyze()` that
full view, and records which project files an analysis read.

In: the analysis `Workspace` and its root folder. Out:
- `ProjectView`, the workspace as a full pass of `analyze()` should see it;
- `ReadRecorder`, the workspace's overlay that reads (and hashes) every other file the
  analysis opens, and `ReadGraph`, the files each file's findings may depend on (what the
  result cache checks before it trusts an entry).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

from torchls.analysis import Workspace
from torchls.analysis.resolver import CachedView, Definition, Stamp, file_stamp
from torchls.analysis.source import SourceError, decode_source
from torchls.cache import MISSING, digest

if TYPE_CHECKING:
    from torchls.analysis.facts import Facts

# Texts of other project files a recorder keeps (most recently read first out last).
TEXTS_KEPT = 256


class ProjectView(CachedView):
    """The workspace for a full (not keystroke) pass: the project index names every project
    module by its file path; jedi is asked only where the index could not walk the project
    (no root folder, or a tree past its size limit)."""

    complete = True

    def resolve(self, facts: Facts, local_name: str) -> Definition | None:
        return self.workspace.resolve(facts, local_name)


class ReadRecorder:
    """A `Workspace` overlay: reads other project files itself and remembers their hashes.

    One check asks for the same imported module thousands of times: a file whose size, inode
    and modification time (in nanoseconds) are those of its last read is answered with the
    text of that read (the same string object, so the workspace knows its facts are current)
    instead of being read, hashed and decoded again."""

    def __init__(self) -> None:
        self.digests: dict[str, str] = {}  # resolved path → digest of the bytes read
        self._lock = threading.Lock()
        self._texts: OrderedDict[str, tuple[Stamp, str | None]] = OrderedDict()

    def __call__(self, path: Path) -> str | None:
        key = str(path)
        stamp = file_stamp(path)
        if stamp is not None:
            with self._lock:
                known = self._texts.get(key)
                if known is not None and known[0] == stamp and key in self.digests:
                    self._texts.move_to_end(key)
                    return known[1]
        try:
            data = path.read_bytes()
        except OSError:
            with self._lock:
                self.digests[key] = MISSING
                self._texts.pop(key, None)
            return None
        try:
            text: str | None = decode_source(data)
        except SourceError:
            text = None  # the workspace finds it unreadable too
        with self._lock:
            self.digests[key] = digest(data)
            if stamp is not None:
                self._texts[key] = (stamp, text)
                self._texts.move_to_end(key)
                while len(self._texts) > TEXTS_KEPT:
                    self._texts.popitem(last=False)
        return text


class ReadGraph:
    """Which project files each analysed file may depend on, from one look at the workspace.

    The workspace records an edge importer → file each time it follows a name into a file; a
    file's findings depend on every file reachable from it along those edges (its imports'
    imports too, even when their facts were built for an earlier file of the same run). Built
    once per batch of files rather than per file: edges only accumulate, so a later look
    can only add dependencies (a cache entry then expires a little more often, never too
    rarely)."""

    def __init__(self, workspace: Workspace, recorder: ReadRecorder) -> None:
        with recorder._lock:
            self.read = dict(recorder.digests)
        self.imports: dict[str, set[str]] = {}
        for target in self.read:
            for importer in workspace.dependents_of(target):
                self.imports.setdefault(str(importer), set()).add(target)

    def dependencies(self, path: Path) -> dict[str, str]:
        """The project files (and the hashes of the bytes read) `path`'s analysis may use."""
        start = str(path.resolve())
        found: dict[str, str] = {}
        stack = [start]
        while stack:
            for target in self.imports.get(stack.pop(), ()):
                if target not in found and target != start:
                    found[target] = self.read[target]
                    stack.append(target)
        return found
