"""The project as the run sees it: a scratch copy that the run may write, never the real folder.

Why: training scripts write next to themselves (checkpoints, logs, `out_dir`, TensorBoard
runs); a read-only project makes them die of `Read-only file system` before the first step,
and a writable one would let a repro change the user's files. So each folder the run may write
(the project root, the folder it runs from, and the folders given with `--writable`) is copied
into the run's own folder before the start; inside bubblewrap the copy is mounted over the
original path, so paths, imports and tracebacks read as usual. After the run the copy is
compared with what was copied: that is the list of files the run wrote (`changes`), which
`keep` copies out on request.

What is not copied: tool and environment folders (`.git`, virtual environments, caches), files
over `FILE_LIMIT` and whatever lies beyond the `COPY_BUDGET`/`COPY_FILES` budget. Inside
bubblewrap these are bound back read-only at their place (a write there is refused, and the
finding names the option that copies them); without bubblewrap they are symbolic links to the
originals, and the run starts in the copy of its folder: relative writes land in the copy, but
nothing stops a write by absolute path (that layer is then reported as not held).

In: the folders and the run folder to copy into. Out: a `ProjectView` with the bubblewrap
mounts, the copy's path of a folder (no bubblewrap), the run's writes and `keep`. What the run
left in the copy is untrusted: it is walked without following links, with bounded counts, and
copied out with `open_regular`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path

from torchls.probe.options import ReproUsageError
from torchls.probe.scratch import open_regular
from torchls.records import field, record

FILE_LIMIT = 16 << 20  # a larger file is not copied (bound back read-only)
COPY_BUDGET = 256 << 20  # bytes copied per run, all folders together
COPY_FILES = 20_000  # files copied per run
WALK_LIMIT = 100_000  # entries looked at when sizing a folder before copying it
CHANGE_LIMIT = 50_000  # entries of the copy looked at after the run
LISTED = 200  # written files listed in the report
MAX_EXCLUDED = 512  # entries bound back read-only; past this the project is too irregular
# Folders never copied: version control, environments and caches that a run only reads.
SKIPPED_NAMES = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "node_modules",
        ".tox",
        ".nox",
        ".mypy_cache",
        ".ruff_cache",
        ".pytest_cache",
        "__pycache__",
        "site-packages",
        ".ipynb_checkpoints",
    }
)


@record(frozen=True)
class Written:
    path: str  # the original path (where the file would have been written)
    bytes: int
    kind: str = "file"  # file | link

    def to_json(self) -> dict[str, object]:
        return {"path": self.path, "bytes": self.bytes, "kind": self.kind}


@record
class Changes:
    written: list[Written] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    truncated: bool = False
    total_bytes: int = 0


@record
class Source:
    """One folder seen through its copy."""

    original: Path
    copy: Path
    # Relative path -> why it was not copied (bound back read-only, or linked).
    excluded: dict[str, str] = field(default_factory=dict)
    # Relative path -> (size, mtime_ns) of what was copied, to tell the run's writes apart.
    snapshot: dict[str, tuple[int, int]] = field(default_factory=dict)


class _Budget:
    def __init__(self) -> None:
        self.bytes = COPY_BUDGET
        self.files = COPY_FILES


def view_folders(root: Path, cwd: Path, writable: tuple[Path, ...]) -> list[Path]:
    """The outermost of the project root, the run's folder and the extra writable folders."""
    found: list[Path] = []
    for folder in sorted({root, cwd, *writable}, key=lambda p: (len(p.parts), str(p))):
        if not any(folder == f or f in folder.parents for f in found):
            found.append(folder)
    return found


@record
class ProjectView:
    sources: list[Source]
    linked: bool  # excluded entries are links to the originals (no bubblewrap)

    @classmethod
    def create(cls, folders: list[Path], base: Path, *, linked: bool) -> ProjectView:
        base.mkdir(mode=0o700)
        budget = _Budget()
        sources = []
        for index, folder in enumerate(folders):
            source = Source(folder, base / str(index))
            source.copy.mkdir(mode=0o700)
            _copy_tree(source, Path(), budget, linked)
            sources.append(source)
        view = cls(sources, linked)
        if sum(len(s.excluded) for s in sources) > MAX_EXCLUDED:
            raise ReproUsageError(
                f"{folders[0]} holds too many large files or folders to be seen through a copy "
                f"(more than {MAX_EXCLUDED} left out): run from a smaller folder (--cwd, --root)"
            )
        return view

    def copy_of(self, path: Path) -> Path:
        """Where `path` (inside one of the folders) lies in the copy; `path` itself if outside."""
        for source in self.sources:
            if path == source.original or source.original in path.parents:
                return source.copy / path.relative_to(source.original)
        return path

    def covers(self, path: Path) -> bool:
        return any(path == s.original or s.original in path.parents for s in self.sources)

    def excluded_entry(self, path: Path) -> tuple[Path, str] | None:
        """The left-out entry (and why) that holds `path`, if any."""
        for source in self.sources:
            if not (path == source.original or source.original in path.parents):
                continue
            relative = path.relative_to(source.original)
            for parts in range(1, len(relative.parts) + 1):
                key = str(Path(*relative.parts[:parts]))
                if key in source.excluded:
                    return source.original / key, source.excluded[key]
        return None

    def bwrap_mounts(self) -> list[tuple[Path, int, list[str]]]:
        """(path, order, arguments): each copy over its original, then the left-out entries
        bound back read-only at their place (deeper, so mounted after the copy)."""
        mounts: list[tuple[Path, int, list[str]]] = []
        for source in self.sources:
            mounts.append((source.original, 2, ["--bind", str(source.copy), str(source.original)]))
            for relative in source.excluded:
                path = source.original / relative
                mounts.append((path, 3, ["--ro-bind", str(path), str(path)]))
        return mounts

    def reset(self) -> None:
        """Make the copies match the originals again (a warm worker, before each run)."""
        budget = _Budget()
        for index, source in enumerate(self.sources):
            # The copy's folder and the left-out entries' stand-ins stay: a warm worker's
            # sandbox has them mounted (removing a mount point would unmount it there).
            _clear(source.copy, Path(), set(source.excluded))
            fresh = Source(source.original, source.copy)
            _copy_tree(fresh, Path(), budget, self.linked)
            if set(fresh.excluded) != set(source.excluded):
                # The mounts of a warm worker were made for the old set: it must be replaced.
                raise ReproUsageError("the project's large files changed; start a new worker")
            self.sources[index] = fresh

    def usage(self, limit: int) -> int:
        """Bytes in the copies now (stops counting past `limit`)."""
        total = 0
        for source in self.sources:
            for _relative, info in _walk(source.copy, CHANGE_LIMIT):
                if stat.S_ISREG(info.st_mode):
                    total += info.st_blocks * 512 if info.st_blocks else info.st_size
                    if total > limit:
                        return total
        return total

    def changes(self) -> Changes:
        """What the run wrote into the copies (new or changed files and links) and removed."""
        changes = Changes()
        for source in self.sources:
            seen: set[str] = set()
            entries = _walk(source.copy, CHANGE_LIMIT)
            for relative, info in entries:
                key = str(relative)
                seen.add(key)
                if stat.S_ISDIR(info.st_mode) or key in source.excluded:
                    continue
                kind = "link" if stat.S_ISLNK(info.st_mode) else "file"
                if kind == "file" and not stat.S_ISREG(info.st_mode):
                    continue
                before = source.snapshot.get(key)
                if before is not None and before == (info.st_size, info.st_mtime_ns):
                    continue
                size = info.st_size if kind == "file" else 0
                changes.total_bytes += size
                if len(changes.written) < LISTED:
                    changes.written.append(Written(str(source.original / relative), size, kind))
                else:
                    changes.truncated = True
            if len(seen) >= CHANGE_LIMIT:
                changes.truncated = True
                continue
            for key in source.snapshot:
                if key not in seen and len(changes.removed) < LISTED:
                    changes.removed.append(str(source.original / key))
        return changes

    def keep(self, changes: Changes, target: Path) -> list[str]:
        """Copy the written files into `target` (their paths relative to their folder's
        parent, so `out/ckpt.pt` of project `proj` lands at `target/proj/out/ckpt.pt`);
        returns problems. Links are not copied (their target is the run's to choose)."""
        problems: list[str] = []
        for item in changes.written:
            if item.kind != "file":
                continue
            original = Path(item.path)
            source = next(
                (s for s in self.sources if s.original in original.parents),
                None,
            )
            if source is None:
                continue
            relative = original.relative_to(source.original)
            destination = target / source.original.name / relative
            try:
                fd = open_regular(source.copy / relative)
            except OSError as error:
                problems.append(f"{item.path}: {error.strerror or error}")
                continue
            try:
                destination.parent.mkdir(parents=True, exist_ok=True)
                with open(destination, "wb") as out:
                    while chunk := os.read(fd, 1 << 20):
                        out.write(chunk)
            except OSError as error:
                problems.append(f"{destination}: {error.strerror or error}")
            finally:
                os.close(fd)
        return problems


def _copy_tree(source: Source, relative: Path, budget: _Budget, linked: bool) -> None:
    """Copy the folder `relative` of `source`, leaving out what `_left_out` says."""
    original = source.original / relative
    try:
        entries = sorted(os.scandir(original), key=lambda e: e.name)
    except OSError:
        return
    for entry in entries:
        rel = relative / entry.name
        target = source.copy / rel
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISLNK(info.st_mode):
            with contextlib.suppress(OSError):
                os.symlink(os.readlink(entry.path), target)
                source.snapshot[str(rel)] = _stamp(target)
            continue
        why = _left_out(entry, info, budget)
        if why is None and stat.S_ISDIR(info.st_mode) and _holds(entry.path, source.copy):
            # The temporary folder inside the project (TMPDIR=./tmp) holds this very copy:
            # copying it would copy the copy into itself.
            why = "holds the sandbox's own scratch files"
        if why is not None:
            _stand_in(source, rel, target, info, why, linked)
            continue
        if stat.S_ISDIR(info.st_mode):
            with contextlib.suppress(OSError):
                target.mkdir()
                shutil.copystat(entry.path, target, follow_symlinks=False)
            _copy_tree(source, rel, budget, linked)
        elif stat.S_ISREG(info.st_mode):
            try:
                shutil.copy2(entry.path, target, follow_symlinks=False)
            except OSError:
                continue
            budget.bytes -= info.st_size
            budget.files -= 1
            source.snapshot[str(rel)] = _stamp(target)
        # FIFOs, sockets and devices are not part of a project's files: left out.


def _holds(folder: str, inner: Path) -> bool:
    """`inner` is `folder` or lies somewhere below it."""
    try:
        inner.resolve().relative_to(Path(folder).resolve())
    except (OSError, ValueError):
        return False
    return True


def _left_out(entry: os.DirEntry, info: os.stat_result, budget: _Budget) -> str | None:
    """Why an entry is not copied, or None."""
    if stat.S_ISDIR(info.st_mode):
        if entry.name in SKIPPED_NAMES:
            return "a tool or cache folder"
        if os.path.exists(os.path.join(entry.path, "pyvenv.cfg")):
            return "a virtual environment"
        size, files = _folder_size(entry.path)
        if size > budget.bytes or files > budget.files:
            return "too large to copy"
        return None
    if stat.S_ISREG(info.st_mode):
        if info.st_size > FILE_LIMIT:
            return f"larger than {FILE_LIMIT >> 20} MB"
        if info.st_size > budget.bytes or budget.files <= 0:
            return "beyond the copy budget"
    return None


def _stand_in(
    source: Source, rel: Path, target: Path, info: os.stat_result, why: str, linked: bool
) -> None:
    """A left-out entry: a link to the original (no bubblewrap), else an empty placeholder
    that bubblewrap binds the original over, read-only."""
    source.excluded[str(rel)] = why
    with contextlib.suppress(OSError):
        if linked:
            os.symlink(source.original / rel, target)
        elif stat.S_ISDIR(info.st_mode):
            target.mkdir()
        else:
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def _folder_size(path: str) -> tuple[int, int]:
    """(bytes, files) of the copyable files under `path`, huge when past WALK_LIMIT."""
    total, files, looked = 0, 0, 0
    for _root, dirs, names in os.walk(path):
        dirs[:] = [d for d in dirs if d not in SKIPPED_NAMES]
        looked += len(dirs) + len(names)
        if looked > WALK_LIMIT:
            return 1 << 62, 1 << 62
        for name in names:
            with contextlib.suppress(OSError):
                info = os.lstat(os.path.join(_root, name))
                if stat.S_ISREG(info.st_mode) and info.st_size <= FILE_LIMIT:
                    total += info.st_size
                    files += 1
    return total, files


def _stamp(path: Path) -> tuple[int, int]:
    info = os.lstat(path)
    return info.st_size, info.st_mtime_ns


def _walk(folder: Path, limit: int) -> list[tuple[Path, os.stat_result]]:
    """Every entry under `folder` (relative path, lstat), never following a link, at most
    `limit` entries."""
    found: list[tuple[Path, os.stat_result]] = []
    pending = [Path()]
    while pending and len(found) < limit:
        relative = pending.pop()
        try:
            entries = list(os.scandir(folder / relative))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            found.append((relative / entry.name, info))
            if stat.S_ISDIR(info.st_mode):
                pending.append(relative / entry.name)
            if len(found) >= limit:
                break
    return found


def _clear(copy: Path, relative: Path, keep: set[str]) -> None:
    """Remove everything under `copy/relative` but the entries in `keep` and their folders."""
    try:
        entries = list(os.scandir(copy / relative))
    except OSError:
        return
    for entry in entries:
        rel = relative / entry.name
        key = str(rel)
        if key in keep:
            continue
        if any(k.startswith(key + os.sep) for k in keep) and entry.is_dir(follow_symlinks=False):
            _clear(copy, rel, keep)
            continue
        if entry.is_dir(follow_symlinks=False):
            _remove_tree(Path(entry.path))
        else:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)


def _remove_tree(folder: Path) -> None:
    def unlock(function: object, path: str, _error: object) -> None:
        parent = os.path.dirname(path)
        with contextlib.suppress(OSError):
            os.chmod(parent, 0o700)
        with contextlib.suppress(OSError):
            if os.path.isdir(path) and not os.path.islink(path):
                os.chmod(path, 0o700)
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)

    if folder.is_dir() and not folder.is_symlink():
        shutil.rmtree(folder, onerror=unlock)
