"""Checking many files: discovery, configuration per file, analysis and applying fixes.

In: the paths the user named (files, folders or `-` for stdin) and the command-line rule
options. Out: one `FileReport` per file (findings, syntax problems, or why it could not be read)
plus the paths that did not exist. Printing is `torchls.output`'s job; the analysis itself is
`torchls.analysis`'s. This module owns only the plumbing between the two and the disk.

Folders are walked skipping tool folders, the config's `exclude` globs and, inside a git work
tree, whatever git ignores (asked once per work tree with `git ls-files`; without git, or
outside a work tree, nothing is filtered).

Each file is read once; files whose result cache entry (`torchls.cache`) still holds are not
analysed again, and the rest are analysed in this process or, when there are enough of them,
in worker processes (one per core by default): forked from this one where that is safe (Linux,
no other thread running), else a pool of started ones. Either way each file's report is the
same and the reports come back in the order the files were found.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from torchls.analysis import (
    AnalysisResult,
    Finding,
    Position,
    Rule,
    Span,
    SyntaxProblem,
    Workspace,
    all_rules,
    analyze,
    collector_paused,
    get_rule,
)
from torchls.analysis.index import NOT_PROJECT_DIRS
from torchls.analysis.selection import normalise_selectors
from torchls.cache import (
    CachedReport,
    ResultCache,
    cache_folder,
)
from torchls.config import ConfigResolver, ProjectConfig
from torchls.notebook import CellMap, NotebookError, NotebookSource, read_notebook, write_back
from torchls.project import ProjectView, ReadGraph, ReadRecorder
from torchls.records import field, record, replace

if TYPE_CHECKING:
    from multiprocessing.context import BaseContext

# ConfigResolver lives in torchls.config (the service the editor shares); re-exported here.
__all__ = ["CheckOptions", "ConfigResolver", "FileReport", "check_paths", "check_stdin"]

# Folders that hold other people's code or build output; checking them is noise and slow.
SKIPPED_DIRS = NOT_PROJECT_DIRS
STDIN = "-"


@record(frozen=True)
class CheckOptions:
    """What the command line asks for, beyond the paths."""

    select: tuple[str, ...] | None = None
    ignore: tuple[str, ...] = ()
    extend_select: tuple[str, ...] = ()
    fix: bool = False
    unsafe_fixes: bool = False
    # The project root: imported names are followed into the project's files below it
    # (None: each file is analysed on its own).
    root: Path | None = None
    cache: bool = True  # the result cache (`--no-cache` turns it off)
    cache_dir: Path | None = None  # default: `.torchls_cache` beside the nearest pyproject
    config: Path | None = None  # `--config`, which also places the cache
    # Worker processes: None, one per core when there is enough to analyse to pay for them;
    # N, up to N (one per file at most); 1, none.
    jobs: int | None = None


@record
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
    # A notebook's: where its code cells are in the module text the findings' rows count in.
    cells: CellMap | None = None


# The code of a syntax error in the CLI's findings. Not a rule (nothing selects, ignores or
# suppresses it): a file torchls could not fully parse is reported in every output format
# and fails the check, so a CI job never shows a green check for code nobody analysed.
PARSE_FAILURE_CODE = "TL000"
PARSE_FAILURE_NAME = "syntax-error"


def parse_failure_findings(report: FileReport) -> list[Finding]:
    """One error finding per syntax error of the file, at the place Python gave (a notebook's
    rows count in its module text, like every finding's, until the output places them)."""
    rest = (
        "the file could not be parsed, nothing in it was checked"
        if report.nothing_parsed
        else "the rest of the file was still checked"
    )
    return [
        Finding(
            code=PARSE_FAILURE_CODE,
            message=f"syntax error: {problem.message} ({rest})",
            severity="error",
            span=Span(
                Position(problem.row, problem.column), Position(problem.row, problem.column + 1)
            ),
        )
        for problem in report.syntax_errors
    ]


def with_parse_failures(report: FileReport) -> FileReport:
    """The report with its syntax errors among its findings, each before the first finding
    that starts after it (the findings keep their order)."""
    failures = parse_failure_findings(report)
    if not failures:
        return report
    findings = list(report.findings)
    for failure in failures:
        at = failure.span.start
        place = next(
            (
                i
                for i, found in enumerate(findings)
                if (found.span.start.row, found.span.start.column) > (at.row, at.column)
            ),
            len(findings),
        )
        findings.insert(place, failure)
    return replace(report, findings=findings)


@record
class Discovery:
    """The files a check found to analyse, the paths that do not exist, and those it could not
    read."""

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


def closest_rule(wanted: str, rules: Sequence[Rule] | None = None) -> str:
    """'; did you mean TL106 (class-targets-cast-to-float)?' — by spelling, else by number."""
    rules = list(rules if rules is not None else all_rules())
    if not rules:
        return ""
    by_key = {r.code: r for r in rules} | {r.name: r for r in rules}
    import difflib  # only for a misspelt rule name

    close = difflib.get_close_matches(wanted.strip(), list(by_key), n=1, cutoff=0.75)
    if close:
        best = by_key[close[0]]
    else:
        best = min(rules, key=lambda r: _code_distance(wanted.strip().upper(), r.code))
    return f"; did you mean {best.code} ({best.name})? 'torchls rule --all' lists every rule"


def _code_distance(wanted: str, code: str) -> tuple[int, int]:
    """Longer shared prefix first, then the nearest number (TL107 → TL106, TL999 → TL303)."""
    shared = next(
        (i for i, (a, b) in enumerate(zip(wanted, code, strict=False)) if a != b),
        min(len(wanted), len(code)),
    )
    digits = "".join(ch for ch in wanted if ch.isdigit())
    number = int(digits) if digits else 0
    code_number = int("".join(ch for ch in code if ch.isdigit()) or 0)
    return (-shared, abs(number - code_number))


def selector_problem(selector: str, where: str) -> str:
    """Why `selector` (named in `where`: a flag, a configuration key) selects nothing: a
    documented code that is no check (TL000, the TL9xx), or a typo with the nearest rule. The
    CLI refuses with it; a configuration file only warns with it."""
    documented = get_rule(selector)
    if documented is not None:
        # A "did you mean" of some unrelated rule would mislead here.
        return (
            f"{documented.code} ({documented.name}) in {where} is not a rule `torchls check` "
            f"runs, so it cannot be selected or ignored; 'torchls rule {documented.code}' "
            "explains it"
        )
    return f"unknown rule selector {selector!r} in {where}{closest_rule(selector)}"


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
        f"{config.path}: warning: {selector_problem(selector, f'[tool.torchls] {key}')}"
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
    needs); folders are walked for the config's `include` globs (`*.py` and `*.ipynb` by
    default), skipping tool folders, the config's `exclude` globs and git-ignored paths.
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
            if _included(path, resolver) and not _excluded(path, resolver) and not ignored(path):
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
    import subprocess  # here: only a check inside a git work tree starts one

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


def _included(path: Path, resolver: ConfigResolver) -> bool:
    """Whether a file met in a folder walk is one to check (the config's `include` globs)."""
    config = resolver.for_path(path)
    if path.name.endswith(".py") and "*.py" in config.include:
        return True  # the common case, without a path resolution
    relative = config.relative(path)
    return any(_glob_matches(relative, pattern) for pattern in config.include)


def is_notebook(path: Path | str) -> bool:
    """Whether a file is read as a Jupyter notebook (by its suffix, as Jupyter does)."""
    return str(path).endswith(".ipynb")


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
    """Check each file, in parallel when there are enough of them to pay for the workers;
    the reports come back in the order of `files` whatever the number of workers.
    `progress(done, total)` is called after each file when given.

    Each file is read once here: its bytes and the rules in force for it are looked up in the
    result cache (when `options.cache` is set), and only the misses are analysed."""
    # No cyclic collection until the run's picture of the project is released: each one
    # would scan every parse and fact table kept for the files still to come (a tenth of a
    # project check's time, measured), and the analysis leaves almost no cyclic garbage.
    with collector_paused():
        return _check_paths(files, resolver, options, progress)


def _check_paths(
    files: Sequence[Path],
    resolver: ConfigResolver,
    options: CheckOptions,
    progress: Callable[[int, int], None] | None,
) -> list[FileReport]:
    reports: list[FileReport | None] = [None] * len(files)
    done = 0

    def finished(index: int, report: FileReport) -> None:
        nonlocal done
        reports[index] = report
        done += 1
        if progress is not None:
            progress(done, len(files))

    cache = _open_cache(files, options)
    jobs: list[_Job] = []
    for index, path in enumerate(files):
        report = FileReport(_display(path), _absolute(path))
        try:
            data = path.read_bytes()
        except OSError as error:
            report.error = _os_message(error)
            finished(index, report)
            continue
        enabled = _enabled_codes(resolver.for_path(path), path, options)
        cached = cache.lookup(path, data, enabled) if cache is not None else None
        if cached is not None and not (options.fix and _fixable(cached, options.unsafe_fixes)):
            _fill(report, cached)
            if is_notebook(path) and report.error is None:
                _read_cells(report, data)
            finished(index, report)
            continue
        jobs.append(_Job(index, path, data, enabled))
    outcomes = _run_jobs(jobs, options, lambda job, outcome: finished(job.index, outcome.report))
    _Session.finish(options)
    for job, outcome in zip(jobs, outcomes, strict=True):
        if cache is not None and outcome.content is not None:
            cache.store(
                job.path, outcome.content, job.enabled, outcome.dependencies, outcome.cached()
            )
    if cache is not None:
        cache.flush()
    return [report for report in reports if report is not None]


def check_file(path: Path, resolver: ConfigResolver, options: CheckOptions) -> FileReport:
    """One file, in this process and without the cache."""
    return check_paths([path], resolver, replace(options, cache=False, jobs=1))[0]


def check_stdin(
    data: bytes, filename: str | None, resolver: ConfigResolver, options: CheckOptions
) -> FileReport:
    """Check source read from stdin (never cached); with --fix the fixed text is kept for
    printing."""
    named = Path(filename) if filename else None
    report = FileReport(_display(named) if named else STDIN, _absolute(named) if named else STDIN)
    config = resolver.for_path(named if named else Path.cwd())
    enabled = _enabled_codes(config, named, options)
    session = _Session.current(options)
    if named is not None and is_notebook(named):
        fixed = session.analyse_notebook(report, data, filename or "<stdin>", enabled)
        if options.fix and report.error is None:
            report.fixed_text = (fixed if fixed is not None else data).decode("utf-8-sig")
        return report
    new_text = session.analyse_into(report, data, filename or "<stdin>", enabled)
    if options.fix and report.error is None:
        report.fixed_text = new_text if new_text is not None else _decoded(data)
    return report


def _enabled_codes(
    config: ProjectConfig, path: Path | None, options: CheckOptions
) -> tuple[str, ...]:
    """The codes of the rules in force for `path`: the effective configuration, which is also
    what a cache entry is valid for."""
    selection = config.selection(options.select, options.ignore, options.extend_select)
    # Where the file lies only matters to per-file ignores (and finding out costs a
    # resolution of its path).
    relative = config.relative(path) if path is not None and selection.per_file_ignores else None
    return selection.enabled_codes(tuple(rule.code for rule in all_rules()), relative)


def _fixable(cached: CachedReport, unsafe: bool) -> bool:
    """Whether `--fix` has something to apply to a file whose findings came from the cache."""
    from torchls.analysis.fixes import fixes_to_apply  # --fix only, as below

    return cached.error is None and bool(fixes_to_apply(cached.findings, unsafe=unsafe))


def _fill(report: FileReport, cached: CachedReport) -> None:
    report.findings = list(cached.findings)
    report.syntax_errors = list(cached.syntax_errors)
    report.nothing_parsed = cached.nothing_parsed
    report.error = cached.error


def _open_cache(files: Sequence[Path], options: CheckOptions) -> ResultCache | None:
    if not options.cache or not files:
        return None
    folder = options.cache_dir or cache_folder(files, options.config)
    return ResultCache.open(folder, options.root)


# --- analysing, in this process or in workers ---------------------------------------------------

# A started worker (spawn) costs an interpreter start and an import of torchls, and each
# worker builds its own picture of the project's other files (and asks jedi again, for the
# imports the index cannot place): below this much source per worker (about 15,000 lines, a
# second or two of analysis) one process is faster.
MIN_BYTES_PER_WORKER = 512 * 1024
MIN_FILES_PER_WORKER = 4
# A forked worker starts at once, as the parent: only its picture of the project is built
# again, so it pays for itself on much less (measured: `bench/check_vs_ast.py --whole`).
MIN_BYTES_PER_FORK = 48 * 1024
MIN_FILES_PER_FORK = 2


@record(frozen=True)
class _Job:
    """One file to analyse: its place in the output, its bytes as read, the rules in force."""

    index: int
    path: Path
    data: bytes
    enabled: tuple[str, ...]


@record
class _Done:
    """What analysing a `_Job` produced, and what its cache entry needs."""

    report: FileReport
    content: bytes | None = None  # what the report is the analysis of; None: do not cache
    dependencies: dict[str, str] = field(default_factory=dict)

    def cached(self) -> CachedReport:
        report = self.report
        return CachedReport(
            list(report.findings), list(report.syntax_errors), report.nothing_parsed, report.error
        )


class _Session:
    """What one process keeps while it checks files: the project as the analysis sees it
    (other files' facts, cached per content) and a record of which of them it read."""

    _current: _Session | None = None

    def __init__(self, options: CheckOptions) -> None:
        self.options = options
        self.recorder = ReadRecorder()
        self.workspace: Workspace | None = None
        self.view: ProjectView | None = None
        if options.root is not None:
            self.workspace = Workspace(options.root, overlay=self.recorder, share_parses=True)
            self.view = ProjectView(self.workspace)

    @classmethod
    def current(cls, options: CheckOptions) -> _Session:
        """This process's session for `options` (one per run; a new run gets a new one)."""
        if cls._current is None or cls._current.options is not options:
            cls._current = cls(options)
        return cls._current

    @classmethod
    def finish(cls, options: CheckOptions) -> None:
        """The run with `options` is over: its picture of the project is released now (the
        facts of other files hold cycles; left to the collector, a caller that checks
        project after project would pay for scanning them all)."""
        session = cls._current
        if session is None or session.options is not options:
            return
        cls._current = None
        if session.workspace is not None:
            with session.workspace.analysing():
                session.workspace.invalidate()

    def run(self, job: _Job) -> _Done:
        report = FileReport(_display(job.path), _absolute(job.path))
        content: bytes | None = job.data
        if is_notebook(job.path):
            fixed = self.analyse_notebook(report, job.data, str(job.path), job.enabled)
            if fixed is not None and report.error is None:
                try:
                    job.path.write_bytes(fixed)
                    content = fixed
                except OSError as error:
                    report.error = f"cannot write the fixed file: {error}"
                    content = None
            return _Done(report, content)
        new_text = self.analyse_into(report, job.data, str(job.path), job.enabled)
        if new_text is not None:
            try:
                content = _encode_like(job.data, new_text)
                job.path.write_bytes(content)
            except (OSError, UnicodeEncodeError, LookupError) as error:
                report.error = f"cannot write the fixed file: {error}"
                content = None
        return _Done(report, content)

    def analyse_notebook(
        self, report: FileReport, data: bytes, filename: str, enabled: tuple[str, ...]
    ) -> bytes | None:
        """Fill `report` from the analysis of a notebook's code cells (rows count in the
        module text; `report.cells` places them in cells); returns the notebook's fixed bytes
        when --fix changed anything."""
        notebook = _read_cells(report, data)
        if notebook is None or not notebook.cells:
            return None
        new_text = self.analyse_into(report, notebook.text.encode("utf-8"), filename, enabled)
        if new_text is None or report.error is not None:
            return None
        fixed = write_back(data, notebook, new_text)
        if fixed is None:
            report.notes.append("the fixes moved code across cells; the notebook was not changed")
            report.fixed = 0
            return None
        report.cells = read_notebook(fixed).map  # the fixed findings' rows count in the new text
        return fixed

    def run_batch(
        self, jobs: Sequence[_Job], each: Callable[[_Job, _Done], None] | None = None
    ) -> list[_Done]:
        """Check `jobs` in order, then say which project files each one's result depends on
        (one look at the workspace for the whole batch)."""
        outcomes = []
        for job in jobs:
            outcome = _guarded(self, job)
            outcomes.append(outcome)
            if each is not None:
                each(job, outcome)
        if self.workspace is not None:
            graph = ReadGraph(self.workspace, self.recorder)
            for job, outcome in zip(jobs, outcomes, strict=True):
                if outcome.content is not None:
                    outcome.dependencies = graph.dependencies(job.path)
        return outcomes

    def analyse_into(
        self, report: FileReport, data: bytes, filename: str, enabled: tuple[str, ...]
    ) -> str | None:
        """Fill `report` from the analysis; returns the fixed text when --fix changed
        anything."""
        options = self.options
        codes = frozenset(enabled)
        is_enabled = codes.__contains__
        result = analyze(data, filename, is_enabled, workspace=self.view)
        if result.error is not None:
            report.error = result.error
            return None
        _record_syntax(report, result)
        if not options.fix:
            report.findings = result.findings
            return None
        original = result.parsed.text if result.parsed is not None else ""
        from torchls.analysis.fix_engine import fix_until_stable  # --fix only

        outcome = fix_until_stable(
            original,
            filename,
            is_enabled,
            unsafe=options.unsafe_fixes,
            workspace=self.view,  # type: ignore[arg-type]  # a view answers like a workspace
            result=result,
        )
        report.findings = outcome.result.findings
        if outcome.refused is not None:
            return None  # a file that does not parse is reported, never rewritten
        report.fixed = outcome.fixed
        if outcome.broken:
            report.notes.append(
                "a fix would have produced invalid code; those fixes were not applied "
                "(please report)"
            )
        return outcome.text if outcome.text != original else None


def _run_jobs(
    jobs: list[_Job], options: CheckOptions, each: Callable[[_Job, _Done], None]
) -> list[_Done]:
    """The outcome of each job, in order: in this process, or across workers (forked from
    this process where that is safe, else a pool of started ones); `each(job, outcome)` as
    each one is known."""
    forking = _can_fork()
    if options.jobs is not None:
        workers = min(options.jobs, len(jobs))  # asked for: as many as there are files
    else:
        size_of_work = sum(len(job.data) for job in jobs)
        files, size = (
            (MIN_FILES_PER_FORK, MIN_BYTES_PER_FORK)
            if forking
            else (MIN_FILES_PER_WORKER, MIN_BYTES_PER_WORKER)
        )
        workers = min(os.cpu_count() or 1, len(jobs) // files, size_of_work // size)
    if workers <= 1:
        return _Session.current(options).run_batch(jobs, each)
    if forking:
        return _run_forked(jobs, options, each, workers)
    return _run_pool(jobs, options, each, workers)


def _can_fork() -> bool:
    """Whether workers can be forked from this process: on Linux, with no other thread
    running (the CLI, which has analysed nothing yet). A process that has used jedi holds its
    helper subprocess and reader threads, and a forked child would wait forever on their
    locks; other systems do not fork safely under all their libraries."""
    import threading

    return (
        sys.platform.startswith("linux") and hasattr(os, "fork") and threading.active_count() == 1
    )


def _shares(jobs: list[_Job], parts: int) -> list[list[_Job]]:
    """`jobs` cut into `parts` runs of neighbours (which share imports: each process builds
    its picture of their modules once) of about the same number of bytes."""
    total = sum(len(job.data) for job in jobs)
    shares: list[list[_Job]] = [[]]
    done = 0
    for job in jobs:
        # Close the current share once it holds its part of the bytes, keeping at least one
        # job for each share still to come.
        if shares[-1] and len(shares) < parts and done >= total * len(shares) / parts:
            shares.append([])
        shares[-1].append(job)
        done += len(job.data)
    return shares


def _run_forked(
    jobs: list[_Job], options: CheckOptions, each: Callable[[_Job, _Done], None], workers: int
) -> list[_Done]:
    """The first share of the jobs analysed here, each other one in a forked child that hands
    its outcomes back through a pipe. A child that dies or hands back nothing usable has its
    share analysed here instead: nothing is lost."""
    import pickle

    shares = _shares(jobs, workers)
    children: list[tuple[int, int, list[_Job]]] = []
    try:
        for share in shares[1:]:
            reading, writing = os.pipe()
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child; its outcomes are what the parent sees
                _child(share, options, reading, writing)
            os.close(writing)
            children.append((pid, reading, share))
        outcomes = _Session.current(options).run_batch(shares[0], each)
        while children:
            pid, reading, share = children[0]
            with os.fdopen(reading, "rb") as stream:
                data = stream.read()
            _, status = os.waitpid(pid, 0)
            children.pop(0)
            done: list[_Done] | None = None
            if status == 0:
                try:
                    done = pickle.loads(data)
                except Exception:  # a truncated or garbled hand-back: analyse the share here
                    done = None
            if not isinstance(done, list) or len(done) != len(share):
                outcomes.extend(_Session.current(options).run_batch(share, each))
                continue
            for job, outcome in zip(share, done, strict=True):
                each(job, outcome)
            outcomes.extend(done)
        return outcomes
    finally:
        for pid, reading, _ in children:  # only when stopped early (Ctrl-C, an error)
            with contextlib.suppress(OSError):
                os.close(reading)  # (already closed if the stop came while reading it)
            _stop(pid)


def _child(share: list[_Job], options: CheckOptions, reading: int, writing: int) -> None:
    """A forked worker: analyse `share`, write the pickled outcomes to `writing`, and leave
    without running anything of the parent's (exit handlers, buffered output)."""
    status = 1
    try:
        import pickle
        import signal

        os.close(reading)
        # Ctrl-C is the parent's to handle (it stops the children); no tracebacks from here.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        outcomes = _Session(options).run_batch(share)
        with os.fdopen(writing, "wb") as stream:
            stream.write(pickle.dumps(outcomes, protocol=pickle.HIGHEST_PROTOCOL))
        status = 0
    except BaseException:  # the parent analyses this share itself
        pass
    finally:
        os._exit(status)


def _stop(pid: int) -> None:
    import signal

    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _run_pool(
    jobs: list[_Job], options: CheckOptions, each: Callable[[_Job, _Done], None], workers: int
) -> list[_Done]:
    """Across a pool of started workers, where forking is not safe."""
    # A few batches per worker: neighbours share imports (kept together, each worker builds
    # its picture of their modules once) and a slow batch does not hold up the others.
    size = max(1, -(-len(jobs) // (workers * 4)))
    batches = [jobs[start : start + size] for start in range(0, len(jobs), size)]
    # Imported here: a serial check (most runs, and every small one) never pays for them.
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    outcomes: list[_Done] = []
    try:
        with ProcessPoolExecutor(
            workers, mp_context=_pool_context(), initializer=_start_worker, initargs=(options,)
        ) as pool:
            for batch, done in zip(batches, pool.map(_work, batches), strict=True):
                for job, outcome in zip(batch, done, strict=True):
                    outcomes.append(outcome)
                    each(job, outcome)
    except BrokenProcessPool:
        # A worker died (killed, out of memory): finish the rest here rather than lose them.
        outcomes.extend(_Session.current(options).run_batch(jobs[len(outcomes) :], each))
    return outcomes


def _guarded(session: _Session, job: _Job) -> _Done:
    try:
        return session.run(job)
    except Exception as error:  # one file's analysis bug must not cost the others
        report = FileReport(_display(job.path), _absolute(job.path))
        report.error = f"internal error: {type(error).__name__}: {error}"
        return _Done(report)


def _pool_context() -> BaseContext:
    """Pool workers are started fresh (spawn), never forked (see `_can_fork`). Starting costs
    one import of torchls per worker (tens of milliseconds)."""
    import multiprocessing

    return multiprocessing.get_context("spawn")


def _start_worker(options: CheckOptions) -> None:
    import signal

    # Ctrl-C is the parent's to handle: it stops the pool; workers must not print tracebacks.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _Session._current = _Session(options)


def _work(batch: list[_Job]) -> list[_Done]:
    session = _Session._current
    assert session is not None, "the worker initialiser always runs first"
    with collector_paused():  # as in `check_paths`; a worker's picture lasts until it exits
        return session.run_batch(batch)


def _read_cells(report: FileReport, data: bytes) -> NotebookSource | None:
    """The notebook in `data`, its cell map put on `report`; None (and `report.error`, or a
    note for a notebook in another language) when there is nothing to analyse."""
    try:
        notebook = read_notebook(data)
    except NotebookError as error:
        report.error = f"cannot read the notebook: {error}"
        return None
    report.cells = notebook.map
    if notebook.language != "python":
        report.notes.append(f"not a Python notebook (kernel language {notebook.language!r})")
        return None
    return notebook


def _record_syntax(report: FileReport, result: AnalysisResult) -> None:
    report.syntax_errors = list(result.syntax_errors)
    parsed = result.parsed
    if result.syntax_errors and parsed is not None:
        report.nothing_parsed = not parsed.tree.body and bool(parsed.text.strip())


# --- helpers ---------------------------------------------------------------------------------


def _encode_like(original: bytes, text: str) -> bytes:
    """Encode fixed text the way the original file was encoded (BOM, coding cookie)."""
    import io
    import tokenize

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
