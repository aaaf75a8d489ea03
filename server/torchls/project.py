"""The project around a checked file, as `torchls check` and the editor's cross-file pass use it.

Why: the analysis follows imported names into other project files through its `Workspace`:
the project index names plain imports from the file system, and jedi is asked for the rest.
A jedi question costs tens of milliseconds (it parses the importing file and the files it
walks), and most of the names the index cannot place are installed packages or the standard
library (`einops`, `copy`, `deepspeed`), which jedi can never answer with a project file.
This module keeps those away from jedi, and records which project files an analysis read.

In: the analysis `Workspace` and its root folder. Out:
- `ProjectView`, the workspace as `analyze()` should see it: an import whose top-level name
  no file or folder of the project carries is answered from the index alone (no jedi);
  relative imports and names the project does define may still be asked of jedi;
- `ReadRecorder`, the workspace's overlay that reads (and hashes) every other file the
  analysis opens, and `ReadGraph`, the files each file's findings may depend on (what the
  result cache checks before it trusts an entry).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from torchls.analysis import Workspace
from torchls.analysis.resolver import CachedView, Definition
from torchls.analysis.source import SourceError, decode_source
from torchls.cache import MISSING, digest

if TYPE_CHECKING:
    from torchls.analysis.facts import Facts

NAMES_LIMIT = 200_000  # directory entries; a larger tree is not walked and jedi is never gated
_SKIPPED = frozenset(
    {".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv", "venv", "site-packages"}
)


def module_names(root: Path | None) -> frozenset[str] | None:
    """Every name a top-level import could find in the project: the stem of each `.py` file
    and the name of each folder under `root` (a module added to `sys.path` by hand is still
    one of them). None when there is no root or the tree is too large to walk."""
    if root is None:
        return None
    names: set[str] = set()
    seen = 0
    for _folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in _SKIPPED]
        seen += len(dirs) + len(files)
        if seen > NAMES_LIMIT:
            return None
        names.update(dirs)
        names.update(name[:-3] for name in files if name.endswith(".py"))
    return frozenset(names)


class ProjectView(CachedView):
    """The workspace asking jedi only about imports that could name a project file."""

    def __init__(self, workspace: Workspace) -> None:
        super().__init__(workspace)
        self._names: frozenset[str] | None = None
        self._walked = False
        self._lock = threading.Lock()

    def could_be_project(self, imported: str) -> bool:
        """Whether jedi could resolve `imported` (`Facts.imports` spelling) to a project file."""
        if imported.startswith("."):
            return True  # relative: inside the project by definition
        with self._lock:
            if not self._walked:
                self._names = module_names(self.workspace.root)  # walked on the first question
                self._walked = True
        return self._names is None or imported.split(".")[0] in self._names

    def resolve(self, facts: Facts, local_name: str) -> Definition | None:
        imported = facts.imports.get(local_name)
        if imported is not None and self.could_be_project(imported):
            return self.workspace.resolve(facts, local_name)
        return self.workspace.resolve(facts, local_name, view=self)


class ReadRecorder:
    """A `Workspace` overlay: reads other project files itself and remembers their hashes."""

    def __init__(self) -> None:
        self.digests: dict[str, str] = {}  # resolved path → digest of the bytes read
        self._lock = threading.Lock()

    def __call__(self, path: Path) -> str | None:
        key = str(path)
        try:
            data = path.read_bytes()
        except OSError:
            with self._lock:
                self.digests[key] = MISSING
            return None
        with self._lock:
            self.digests[key] = digest(data)
        try:
            return decode_source(data)
        except SourceError:
            return None  # the workspace finds it unreadable too


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
