"""Checking many files: discovery, configuration per file, analysis and applying fixes.

In: the paths the user named (files, folders or `-` for stdin) and the command-line rule
options. Out: one `FileReport` per file (findings, syntax problems, or why it could not be read)
plus the paths that did not exist. Printing is `torchls.output`'s job; the analysis itself is
`torchls.analysis`'s. This module owns only the plumbing between the two and the disk.

Folders are walked skipping tool folders, the config's `exclude` globs and, inside a git work
tree, whatever git ignores (asked once per work tree with `git ls-files`; without git, or
outside a work tree, nothing is filtered).
"""

from __future__ import annotations

import fnmatch
import io
import os
import subprocess
import tokenize
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from torchls.analysis import (
    AnalysisResult,
    Finding,
    SyntaxProblem,
    Workspace,
    all_rules,
    analyze,
)
from torchls.analysis.fix_engine import fix_until_stable
from torchls.analysis.selection import normalise_selectors
from torchls.config import ConfigResolver, ProjectConfig

# ConfigResolver lives in torchls.config (the service the editor shares); re-exported here.
__all__ = ["CheckOptions", "ConfigResolver", "FileReport", "check_paths", "check_stdin"]

# Folders that hold other people's code or build output; checking them is noise and slow.
SKIPPED_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        ".venv",
        "venv",
        ".tox",
        ".nox",
        ".eggs",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        "node_modules",
        "__pycache__",
        "build",
        "dist",
        "site-packages",
    }
)
STDIN = "-"


@dataclass(frozen=True)
class CheckOptions:
    """What the command line asks for, beyond the paths."""

    select: tuple[str, ...] | None = None
    ignore: tuple[str, ...] = ()
    extend_select: tuple[str, ...] = ()
    fix: bool = False
    unsafe_fixes: bool = False
    # Follows imported names into other project files; one per run so files are read once.
    workspace: Workspace | None = None


@dataclass
class FileReport:
    """The outcome for one file. `error` set means it could not be analysed at all."""

    display: str  # the path as shown to the user (relative, as they spelled it)
    filename: str  # the absolute path (or "-" for unnamed stdin), for machine output
    findings: list[Finding] = field(default_factory=list)
    syntax_errors: list[SyntaxProblem] = field(default_factory=list)
    nothing_parsed: bool = False  # the syntax errors hid the whole file
    error: str | None = None
    fixed: int = 0
    fixed_text: str | None = None  # the fixed source when it was not written back (stdin)
    notes: list[str] = field(default_factory=list)  # non-fatal problems worth a stderr line


@dataclass
class Discovery:
    files: list[Path] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unreadable: list[FileReport] = field(default_factory=list)


def unknown_selectors(selectors: Iterable[str]) -> list[str]:
    """Selectors that match no registered rule (a typo would silently select nothing)."""
    codes = [rule.code for rule in all_rules()]
    unknown = []
    for raw in selectors:
        normal = normalise_selectors([raw])
        if normal and normal[0] and not any(code.startswith(normal[0]) for code in codes):
            unknown.append(raw.strip())
    return unknown


def config_warnings(config: ProjectConfig) -> list[str]:
    """Unknown codes in a config file: reported, not fatal, so a newer config still works."""
    if config.path is None:
        return []
    lists = {
        "select": config.select or (),
        "ignore": config.ignore,
        "extend-select": config.extend_select,
    }
    for pattern, codes in config.per_file_ignores.items():
        lists[f"per-file-ignores {pattern!r}"] = codes
    return [
        f"{config.path}: warning: unknown rule selector {selector!r} in [tool.torchls] {key}"
        for key, selectors in lists.items()
        for selector in unknown_selectors(list(selectors))
    ]


# --- discovery -------------------------------------------------------------------------------


def discover(
    paths: Sequence[str], resolver: ConfigResolver, force_exclude: bool = False
) -> Discovery:
    """Every Python file under `paths`, in a stable order, each once.

    A file named explicitly is checked even without a .py suffix, and even when excluded or
    git-ignored unless `force_exclude` (what pre-commit, which names every staged file,
    needs); folders are walked for `*.py`, skipping tool folders, the config's `exclude` globs
    and git-ignored paths.
    """
    found = Discovery()
    seen: set[Path] = set()
    ignored = GitIgnored()
    for raw in paths:
        path = Path(raw)
        if path.is_file():
            if force_exclude and (_excluded_or_in_excluded(path, resolver) or ignored(path)):
                continue
            candidates: Iterable[Path] = [path]
        elif path.is_dir():
            # A folder the user names is checked even when git ignores it as a whole.
            walk_ignored = _nothing_ignored if ignored(path) else ignored
            candidates = _walk(path, resolver, found, walk_ignored)
        else:
            found.missing.append(raw)
            continue
        for candidate in candidates:
            try:
                key = candidate.resolve(strict=True)
            except (OSError, RuntimeError):  # a symlink loop or a dangling link
                found.unreadable.append(
                    FileReport(
                        _display(candidate),
                        _absolute(candidate),
                        error="cannot resolve the path (a symlink loop or a dangling link)",
                    )
                )
                continue
            if not key.is_file():
                # A FIFO or a device named like a module would block or never end.
                found.unreadable.append(
                    FileReport(
                        _display(candidate), _absolute(candidate), error="not a regular file"
                    )
                )
                continue
            if key not in seen:
                seen.add(key)
                found.files.append(Path(os.path.normpath(candidate)))
    return found


def _walk(
    root: Path, resolver: ConfigResolver, found: Discovery, ignored: Callable[[Path], bool]
) -> Iterator[Path]:
    def on_error(error: OSError) -> None:
        name = error.filename or str(root)
        found.unreadable.append(
            FileReport(_display(Path(name)), _absolute(Path(name)), error=_os_message(error))
        )

    for folder, dirs, files in os.walk(root, onerror=on_error):
        here = Path(folder)
        dirs[:] = sorted(d for d in dirs if not _skip_dir(here / d, resolver, ignored))
        for name in sorted(files):
            path = here / name
            if name.endswith(".py") and not _excluded(path, resolver) and not ignored(path):
                yield path  # discover() rejects links that loop and files that are not regular


def _skip_dir(path: Path, resolver: ConfigResolver, ignored: Callable[[Path], bool]) -> bool:
    if path.name in SKIPPED_DIRS or (path / "pyvenv.cfg").is_file():
        return True
    return _excluded(path, resolver) or ignored(path)


def _nothing_ignored(path: Path) -> bool:
    return False


class GitIgnored:
    """Whether git ignores a path, asked once per work tree (a subprocess per tree, not per file).

    `git ls-files --others --ignored --exclude-standard --directory` lists every untracked
    path that .gitignore, .git/info/exclude or the user's excludes file ignores (a wholly
    ignored folder as one entry), so a walk can prune ignored folders without a question per
    file. Tracked files are never ignored, as in git. No git, or not a work tree: nothing is.
    """

    def __init__(self) -> None:
        self._tree_of: dict[Path, Path | None] = {}
        self._ignored: dict[Path, frozenset[Path]] = {}

    def __call__(self, path: Path) -> bool:
        absolute = Path(os.path.abspath(path))
        folder = absolute if absolute.is_dir() else absolute.parent
        tree = self._work_tree(folder)
        if tree is None or absolute == tree:
            return False
        ignored = self._ignored_in(tree)
        return any(candidate in ignored for candidate in (absolute, *absolute.parents))

    def _work_tree(self, folder: Path) -> Path | None:
        """The nearest folder holding `.git` (a folder, or a file for worktrees/submodules)."""
        if folder not in self._tree_of:
            if (folder / ".git").exists():
                self._tree_of[folder] = folder
            elif folder.parent == folder:
                self._tree_of[folder] = None
            else:
                self._tree_of[folder] = self._work_tree(folder.parent)
        return self._tree_of[folder]

    def _ignored_in(self, tree: Path) -> frozenset[Path]:
        if tree not in self._ignored:
            listing = _git(
                tree, "ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--directory"
            )
            entries = (listing or "").split("\0")
            self._ignored[tree] = frozenset(
                Path(os.path.abspath(tree / entry.rstrip("/"))) for entry in entries if entry
            )
        return self._ignored[tree]


def _git(folder: Path, *args: str) -> str | None:
    """git's stdout, or None when git is missing or fails (not a work tree, say)."""
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), *args],
            capture_output=True,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except OSError:
        return None
    if done.returncode != 0:
        return None
    return done.stdout.decode("utf-8", "surrogateescape")


def _excluded(path: Path, resolver: ConfigResolver) -> bool:
    config = resolver.for_path(path)
    if not config.exclude:
        return False
    relative = config.relative(path)
    return any(_glob_matches(relative, pattern) for pattern in config.exclude)


def _excluded_or_in_excluded(path: Path, resolver: ConfigResolver) -> bool:
    """Like `_excluded`, for a file not reached by walking: its folders count too."""
    config = resolver.for_path(path)
    if not config.exclude:
        return False
    relative = PurePosixPath(config.relative(path))
    candidates = [relative, *relative.parents[:-1]]  # the file, then its folders up to the root
    return any(
        _glob_matches(candidate.as_posix(), pattern)
        for candidate in candidates
        for pattern in config.exclude
    )


def _glob_matches(relative: str, pattern: str) -> bool:
    """Ruff-like exclude matching: the pattern may name the path, its last part, or a folder."""
    pattern = pattern.rstrip("/")
    if pattern.startswith("./"):
        pattern = pattern[2:]
    name = PurePosixPath(relative).name
    return (
        fnmatch.fnmatch(relative, pattern)
        or fnmatch.fnmatch(name, pattern)
        or fnmatch.fnmatch(relative, f"*/{pattern}")
    )


# --- checking --------------------------------------------------------------------------------


def check_paths(
    files: Sequence[Path],
    resolver: ConfigResolver,
    options: CheckOptions,
    progress: Callable[[int, int], None] | None = None,
) -> list[FileReport]:
    """Check each file; `progress(done, total)` is called after each one when given."""
    reports = []
    for path in files:
        reports.append(check_file(path, resolver, options))
        if progress is not None:
            progress(len(reports), len(files))
    return reports


def check_file(path: Path, resolver: ConfigResolver, options: CheckOptions) -> FileReport:
    report = FileReport(_display(path), _absolute(path))
    try:
        data = path.read_bytes()
    except OSError as error:
        report.error = _os_message(error)
        return report
    config = resolver.for_path(path)
    new_text = _analyse_into(report, data, str(path), _enabled(config, path, options), options)
    if new_text is not None:
        try:
            path.write_bytes(_encode_like(data, new_text))
        except (OSError, UnicodeEncodeError, LookupError) as error:
            report.error = f"cannot write the fixed file: {error}"
    return report


def check_stdin(
    data: bytes, filename: str | None, resolver: ConfigResolver, options: CheckOptions
) -> FileReport:
    """Check source read from stdin; with --fix the fixed text is kept for printing."""
    named = Path(filename) if filename else None
    report = FileReport(_display(named) if named else STDIN, _absolute(named) if named else STDIN)
    config = resolver.for_path(named if named else Path.cwd())
    enabled = _enabled(config, named, options)
    new_text = _analyse_into(report, data, filename or "<stdin>", enabled, options)
    if options.fix and report.error is None:
        report.fixed_text = new_text if new_text is not None else _decoded(data)
    return report


def _enabled(
    config: ProjectConfig, path: Path | None, options: CheckOptions
) -> Callable[[str], bool]:
    selection = config.selection(options.select, options.ignore, options.extend_select)
    relative = config.relative(path) if path is not None else None
    return lambda code: selection.enabled(code, relative)


def _analyse_into(
    report: FileReport,
    data: bytes,
    filename: str,
    enabled: Callable[[str], bool],
    options: CheckOptions,
) -> str | None:
    """Fill `report` from the analysis; returns the fixed text when --fix changed anything."""
    result = analyze(data, filename, enabled, workspace=options.workspace)
    if result.error is not None:
        report.error = result.error
        return None
    _record_syntax(report, result)
    if not options.fix:
        report.findings = result.findings
        return None
    original = result.parsed.text if result.parsed is not None else ""
    outcome = fix_until_stable(
        original,
        filename,
        enabled,
        unsafe=options.unsafe_fixes,
        workspace=options.workspace,
        result=result,
    )
    report.findings = outcome.result.findings
    if outcome.refused is not None:
        return None  # a file that does not parse is reported, never rewritten
    report.fixed = outcome.fixed
    if outcome.broken:
        report.notes.append(
            "a fix would have produced invalid code; those fixes were not applied (please report)"
        )
    return outcome.text if outcome.text != original else None


def _record_syntax(report: FileReport, result: AnalysisResult) -> None:
    report.syntax_errors = list(result.syntax_errors)
    parsed = result.parsed
    if result.syntax_errors and parsed is not None:
        report.nothing_parsed = not parsed.tree.body and bool(parsed.text.strip())


# --- helpers ---------------------------------------------------------------------------------


def _encode_like(original: bytes, text: str) -> bytes:
    """Encode fixed text the way the original file was encoded (BOM, coding cookie)."""
    encoding, _ = tokenize.detect_encoding(io.BytesIO(original).readline)
    return text.encode(encoding)


def _decoded(data: bytes) -> str:
    from torchls.analysis.source import decode_source

    return decode_source(data)


def _display(path: Path) -> str:
    """The path as the user would type it: relative to the working folder when inside it."""
    try:
        return Path(os.path.abspath(path)).relative_to(Path.cwd()).as_posix()
    except ValueError:
        return os.path.normpath(path)


def _absolute(path: Path) -> str:
    return os.path.abspath(path)


def _os_message(error: OSError) -> str:
    reason = error.strerror or str(error)
    return f"cannot read: {reason}"
