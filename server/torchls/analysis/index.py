"""The project index: imported project modules resolved to files without jedi.

Why: following `from models import Net` or `utils.save_checkpoint(...)` into another file is
on the keystroke path of every cross-file rule, and asking jedi costs tens of milliseconds per
name. Most project imports are plain: a module next to the script, a package under the
workspace root or under `src/`, a relative import inside a package. Those the index names by
looking at the file system; jedi stays the fallback for what it cannot name (installed
packages, dynamic imports, `sys.path` tricks).

In: the importing file's path, the dotted name it imports (as `Facts.imports` spells it,
relative dots kept) and the workspace root. Out: the `.py` file that defines the module (and
the attribute name to look up in it), or None. Answers are cached per (importing directory,
dotted name); the file system is asked again only after `forget()`.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

# `src/` layouts: the package lives one level below the root.
SOURCE_FOLDERS = ("", "src")

# Folders that hold other people's code, tool caches or build output: never project modules.
# The checker's file discovery and the result cache skip the same set.
NOT_PROJECT_DIRS = frozenset(
    {".git", ".hg", ".svn", ".venv", "venv", ".tox", ".nox", ".eggs", ".mypy_cache"}
    | {".pytest_cache", ".ruff_cache", "node_modules", "__pycache__", "build", "dist"}
    | {"site-packages", ".torchls_cache"}
    # Jupyter's copies of notebooks: autosave checkpoints, and jupyter-lsp's virtual documents
    # (Python text under a `.ipynb` name).
    | {".ipynb_checkpoints", ".virtual_documents"}
)
MODULES_LIMIT = 200_000  # directory entries; a larger tree is not walked for module paths


class ProjectIndex:
    """Maps dotted module names to project files; thread-safe, cached per importing folder."""

    def __init__(self, root: Path | None) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._modules: dict[tuple[Path, str], Path | None] = {}
        self._under: dict[tuple[Path, tuple[str, ...]], Path | None] = {}
        # Last dotted part -> (every dotted part, file) of each project module; walked once.
        self._tails: dict[str, list[tuple[tuple[str, ...], Path]]] | None = None
        self._walked = False
        # Folder -> (names of its files, names of its folders): every import is looked for in
        # the same few folders, most of them for a library module no folder holds.
        self._listings: dict[Path, tuple[frozenset[str], frozenset[str]]] = {}
        self.lookups = 0

    def forget(self) -> None:
        """Drop every cached answer (a file appeared or vanished)."""
        with self._lock:
            self._modules.clear()
            self._under.clear()
            self._listings.clear()
            self._tails = None
            self._walked = False

    def module_paths(self) -> dict[str, list[tuple[tuple[str, ...], Path]]] | None:
        """Every module file under the root by its last dotted part: `a/b/c.py` is
        `("a", "b", "c")` under "c", `a/b/__init__.py` is `("a", "b")` under "b". None with
        no root, or for a tree too large to walk."""
        with self._lock:
            if self._walked:
                return self._tails
        tails = _walk_modules(self.root) if self.root is not None else None
        with self._lock:
            self._tails, self._walked = tails, True
        return tails

    def module_file(self, importer: Path, dotted: str) -> Path | None:
        """The file of module `dotted` (`pkg.losses`, `.utils`, `..models`) as imported from
        the file `importer`; None when no project file has that name."""
        key = (importer.parent, dotted)
        with self._lock:
            if key in self._modules:
                return self._modules[key]
        found = self._find(importer, dotted)
        with self._lock:
            self._modules[key] = found
        return found

    def locate(self, importer: Path, imported: str) -> tuple[Path, str | None] | None:
        """Where an imported name is defined: `imported` is `Facts.imports[name]`, e.g.
        `models.Net` (from-import: module `models`, attribute `Net`) or `utils` (plain
        import: the module itself, attribute None). A from-import of a submodule
        (`from pkg import losses`) names the submodule's file."""
        self.lookups += 1
        whole = self.module_file(importer, imported)
        if whole is not None:
            return whole, None
        if "." not in imported.lstrip("."):
            return None
        head, _, attribute = imported.rpartition(".")
        if not head.strip("."):
            # `from . import helpers`: `head` is only dots, already tried as a module above.
            return None
        module = self.module_file(importer, head)
        return (module, attribute) if module is not None else None

    def _find(self, importer: Path, dotted: str) -> Path | None:
        level = len(dotted) - len(dotted.lstrip("."))
        parts = [p for p in dotted[level:].split(".") if p]
        if level:
            base = importer.parent
            for _ in range(level - 1):
                base = base.parent
            return self._module_at(base, parts) if parts else self._package_init(base)
        if not parts:
            return None
        # A script's own folder is on sys.path when it runs; so are the root and `src/`.
        bases = [importer.parent]
        if self.root is not None:
            bases.extend(self.root / folder if folder else self.root for folder in SOURCE_FOLDERS)
        seen: set[Path] = set()
        for base in bases:
            if base in seen:
                continue
            seen.add(base)
            found = self._module_under(base, tuple(parts))
            if found is not None and self._inside(found):
                return found
        return self._by_dotted_path(importer, tuple(parts))

    def _module_under(self, base: Path, parts: tuple[str, ...]) -> Path | None:
        # Every script of a project asks the root (and `src/`) about the same imports: the
        # file system is asked once per (folder, module), not once per importing folder.
        key = (base, parts)
        with self._lock:
            if key in self._under:
                return self._under[key]
        found = self._module_at(base, list(parts))
        with self._lock:
            self._under[key] = found
        return found

    def _by_dotted_path(self, importer: Path, parts: tuple[str, ...]) -> Path | None:
        """A module found on a folder the script puts on `sys.path` itself (`sys.path.append
        ("../lib")`, a launcher run from another folder): the one project file whose path
        ends in `parts`; among several, the one whose folder is the nearest ancestor of the
        importer (none, or a tie: unknown)."""
        tails = self.module_paths()
        if not tails:
            return None
        found = [
            path for dotted, path in tails.get(parts[-1], ()) if dotted[-len(parts) :] == parts
        ]
        if len(found) <= 1:
            return found[0] if found else None
        importer_folder = importer.resolve().parent
        best: list[tuple[int, Path]] = []
        for path in found:
            folder = path.parent if path.name != "__init__.py" else path.parent.parent
            base = folder.parents[len(parts) - 2] if len(parts) > 1 else folder
            if importer_folder == base or base in importer_folder.parents:
                best.append((len(base.parts), path))
        best.sort(reverse=True)
        if best and (len(best) == 1 or best[0][0] > best[1][0]):
            return best[0][1]
        return None

    def _module_at(self, base: Path, parts: list[str]) -> Path | None:
        """`base/a/b.py` or `base/a/b/__init__.py` for parts `a`, `b` (resolved), if a file."""
        folder = base
        for part in parts[:-1]:
            if part not in self._listing(folder)[1]:
                return None
            folder = folder / part
        files, folders = self._listing(folder)
        last = parts[-1]
        if f"{last}.py" in files:
            return (folder / f"{last}.py").resolve()
        return self._package_init(folder / last) if last in folders else None

    def _package_init(self, folder: Path) -> Path | None:
        return (
            (folder / "__init__.py").resolve()
            if "__init__.py" in self._listing(folder)[0]
            else None
        )

    def _listing(self, folder: Path) -> tuple[frozenset[str], frozenset[str]]:
        """The names of the files and of the folders in `folder` (links followed, as
        `Path.is_file` follows them); nothing for a folder that cannot be listed."""
        with self._lock:
            known = self._listings.get(folder)
        if known is not None:
            return known
        files: set[str] = set()
        folders: set[str] = set()
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    try:
                        if entry.is_file():
                            files.add(entry.name)
                        elif entry.is_dir():
                            folders.add(entry.name)
                    except OSError:
                        continue
        except OSError:
            pass
        listing = (frozenset(files), frozenset(folders))
        with self._lock:
            self._listings[folder] = listing
        return listing

    def _inside(self, path: Path) -> bool:
        """Whether `path` (already resolved, as `_module_at` returns it) is under the root."""
        if self.root is None:
            return True
        try:
            path.relative_to(self.root)
        except ValueError:
            return False
        return True


def _walk_modules(root: Path) -> dict[str, list[tuple[tuple[str, ...], Path]]] | None:
    tails: dict[str, list[tuple[tuple[str, ...], Path]]] = {}
    seen = 0
    resolved = root.resolve()
    for folder, dirs, files in os.walk(resolved):
        dirs[:] = sorted(d for d in dirs if d not in NOT_PROJECT_DIRS and not d.startswith("."))
        seen += len(dirs) + len(files)
        if seen > MODULES_LIMIT:
            return None
        # Only the dotted tail that an import names must be identifiers (`my-scripts/` may
        # be the folder a script puts on `sys.path`).
        relative = Path(folder).relative_to(resolved).parts
        for name in files:
            if not name.endswith(".py"):
                continue
            stem = name[:-3]
            if stem == "__init__":
                if relative:
                    tails.setdefault(relative[-1], []).append((relative, Path(folder) / name))
            elif stem.isidentifier():
                tails.setdefault(stem, []).append(((*relative, stem), Path(folder) / name))
    return tails
