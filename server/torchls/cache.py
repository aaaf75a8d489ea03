"""The result cache of `torchls check`: unchanged files are not analysed again.

Why: a re-check of an unchanged project should cost little more than reading its files. In:
a checked file's path and bytes, the rule codes in force for it, and (when storing) its
report and the other project files its analysis read. Out: the cached report, or None.

Where: `.torchls_cache/` in the folder of the nearest `pyproject.toml` above the checked paths
(else in the current folder), with a `.gitignore` holding `*` so it is never committed.
One entry per checked file (named by a hash of its absolute path, so an edited file
replaces its entry instead of adding one), written atomically (a temporary file renamed
into place).

What an entry is valid for, all of it checked on every lookup:
- the file's absolute path and the hash of its bytes,
- the enabled rule codes for that file (the effective configuration, per-file ignores
  included),
- torchls itself: its version, the size and modification time of every module of the
  package (so a development checkout never serves results of older rules) and the Python
  version (the parser differs between versions),
- the project's module layout (which `.py` files exist: a new module can change where an
  import resolves),
- the hash of every other project file the analysis read (the modules it followed imported
  names into, and theirs): editing `models.py` invalidates the files that import from it.

Entries are plain JSON with a checksum; anything that does not parse, does not check out or
has the wrong shape is ignored (a miss, never an error, and never trusted: nothing in an
entry is executed or unpickled). A cache folder that cannot be created or written is ignored
quietly: the check runs as if `--no-cache` had been given.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torchls
from torchls.analysis import Edit, Finding, Fix, Related, Span, SyntaxProblem
from torchls.analysis.hashing import content_digest
from torchls.analysis.index import NOT_PROJECT_DIRS
from torchls.records import field, record

CACHE_DIR_NAME = ".torchls_cache"  # one of NOT_PROJECT_DIRS: never walked, never a module
SCHEMA = 1
MISSING = "missing"  # the digest recorded for a dependency that could not be read

LAYOUT_LIMIT = 100_000  # files; past this the layout is not walked (and nothing is cached)


def digest(data: bytes) -> str:
    return content_digest(data)


def file_digest(path: Path) -> str:
    """The hash of a file's bytes, or `MISSING` when it cannot be read."""
    try:
        return digest(path.read_bytes())
    except OSError:
        return MISSING


# --- where, and valid for what -------------------------------------------------------------


def cache_folder(paths: Sequence[str | Path], config: Path | None = None) -> Path:
    """`.torchls_cache` beside `--config`, else beside the nearest `pyproject.toml` above the
    common folder of `paths`, else in the current folder (as ruff does): a folder that is
    not a project is checked, never written to."""
    if config is not None:
        return Path(config).resolve().parent / CACHE_DIR_NAME
    common = common_folder(paths)
    for folder in (common, *common.parents):
        if (folder / "pyproject.toml").is_file():
            return folder / CACHE_DIR_NAME
    return Path.cwd() / CACHE_DIR_NAME


def common_folder(paths: Sequence[str | Path]) -> Path:
    """The deepest folder holding every one of `paths` (files count by their folder)."""
    folders = []
    for raw in paths or (".",):
        path = Path(os.path.abspath(raw))
        folders.append(path if path.is_dir() else path.parent)
    return Path(os.path.commonpath([str(f) for f in folders]))


def code_fingerprint() -> str:
    """torchls as it is installed: version, Python version and every module's size and mtime."""
    package = Path(torchls.__file__).resolve().parent
    parts = [torchls.__version__, sys.version]
    for folder, dirs, files in os.walk(package):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = Path(folder) / name
                try:
                    info = path.stat()
                except OSError:
                    continue
                parts.append(f"{path.relative_to(package)}:{info.st_size}:{info.st_mtime_ns}")
    return digest("\n".join(parts).encode("utf-8", "surrogateescape"))


def layout_digest(root: Path | None) -> str | None:
    """A hash of which `.py` files exist under the project root (not their content); None for
    a tree too large to walk on every run (then nothing is cached)."""
    if root is None:
        return "no-root"
    names: list[str] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(
            d
            for d in dirs
            if d not in NOT_PROJECT_DIRS
            and not d.startswith(".")
            and not (Path(folder) / d / "pyvenv.cfg").is_file()
        )
        relative = os.path.relpath(folder, root)
        names.extend(f"{relative}/{name}" for name in sorted(files) if name.endswith(".py"))
        if len(names) > LAYOUT_LIMIT:
            return None
    return digest("\n".join(names).encode("utf-8", "surrogateescape"))


# --- entries --------------------------------------------------------------------------------


@record
class CachedReport:
    """What a cache entry gives back: the analysis part of a `FileReport`."""

    findings: list[Finding] = field(default_factory=list)
    syntax_errors: list[SyntaxProblem] = field(default_factory=list)
    nothing_parsed: bool = False
    error: str | None = None


class ResultCache:
    """One run's view of the cache folder: lookups, and entries to write at `flush()`."""

    def __init__(self, folder: Path, salt: str) -> None:
        self.folder = folder
        self.salt = salt  # torchls fingerprint and project layout, shared by every entry
        self.usable = True  # False once the folder turned out not to be writable
        self.hits = 0
        self.misses = 0
        self._digests: dict[str, str] = {}  # dependency path → digest, hashed once per run
        self._pending: dict[Path, str] = {}

    @classmethod
    def open(
        cls, folder: Path, root: Path | None, fingerprint: str | None = None
    ) -> ResultCache | None:
        """The cache for a project rooted at `root`, or None when the layout cannot be hashed."""
        layout = layout_digest(root)
        if layout is None:
            return None
        return cls(folder, f"{fingerprint or code_fingerprint()}:{layout}")

    def key(self, path: Path, data: bytes, enabled: Iterable[str]) -> str:
        text = "\0".join((self.salt, os.path.abspath(path), digest(data), ",".join(enabled)))
        return digest(text.encode("utf-8", "surrogateescape"))

    def _entry_path(self, path: Path) -> Path:
        name = digest(os.path.abspath(path).encode("utf-8", "surrogateescape"))
        return self.folder / name[:2] / f"{name}.json"

    def dependency_digest(self, path: str) -> str:
        if path not in self._digests:
            self._digests[path] = file_digest(Path(path))
        return self._digests[path]

    def lookup(self, path: Path, data: bytes, enabled: Sequence[str]) -> CachedReport | None:
        """The cached analysis of `data` at `path` under `enabled`, if still valid."""
        report = self._lookup(path, data, enabled)
        if report is None:
            self.misses += 1
        else:
            self.hits += 1
        return report

    def _lookup(self, path: Path, data: bytes, enabled: Sequence[str]) -> CachedReport | None:
        try:
            raw = self._entry_path(path).read_bytes()
        except OSError:
            return None
        try:
            entry = json.loads(raw)
            if not isinstance(entry, dict) or entry.get("schema") != SCHEMA:
                return None
            body = entry["body"]
            if not isinstance(body, str) or entry.get("check") != digest(body.encode("utf-8")):
                return None
            content = json.loads(body)
            if content["key"] != self.key(path, data, enabled):
                return None
            dependencies = content["dependencies"]
            if not isinstance(dependencies, dict):
                return None
            for dependency, expected in dependencies.items():
                if self.dependency_digest(str(dependency)) != expected:
                    return None
            return _decode_report(content["report"])
        except (ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError):
            return None  # truncated, corrupted or written by something else: a miss

    def store(
        self,
        path: Path,
        data: bytes,
        enabled: Sequence[str],
        dependencies: Mapping[str, str],
        report: CachedReport,
    ) -> None:
        """Remember `report` as the analysis of `data`; written at `flush()`."""
        if not self.usable:
            return
        body = json.dumps(
            {
                "key": self.key(path, data, enabled),
                "dependencies": dict(sorted(dependencies.items())),
                "report": _encode_report(report),
            },
            ensure_ascii=False,
            separators=(",", ":"),
        )
        entry = {"schema": SCHEMA, "check": digest(body.encode("utf-8")), "body": body}
        self._pending[self._entry_path(path)] = json.dumps(entry, ensure_ascii=False)

    def flush(self) -> None:
        """Write the stored entries; a folder that cannot be written disables the cache."""
        pending, self._pending = self._pending, {}
        if not pending or not self.usable:
            return
        try:
            self._prepare()
            for target, text in pending.items():
                target.parent.mkdir(exist_ok=True)
                _write_atomically(target, text.encode("utf-8", "surrogateescape"))
        except OSError:
            self.usable = False  # read-only checkout, full disk, no permission: run uncached

    def _prepare(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        ignore = self.folder / ".gitignore"
        if not ignore.exists():
            _write_atomically(ignore, b"# Created by torchls: the cache is never committed.\n*\n")
        tag = self.folder / "CACHEDIR.TAG"  # backup tools skip folders that carry this
        if not tag.exists():
            _write_atomically(
                tag,
                b"Signature: 8a477f597d28d172789f06886806bc55\n"
                b"# This file marks the torchls result cache (.torchls_cache).\n",
            )


def _write_atomically(target: Path, data: bytes) -> None:
    # A fresh name beside the target, as `tempfile.mkstemp` would make (not imported: its
    # import costs every process more than the names it makes).
    while True:
        temporary = target.parent / f".tmp-{os.getpid()}-{os.urandom(6).hex()}"
        try:
            handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


# --- (de)serialising reports -----------------------------------------------------------------


def _span(span: Span) -> list[int]:
    return [span.start.row, span.start.column, span.end.row, span.end.column]


def _span_of(raw: Any) -> Span:
    row, column, end_row, end_column = (_int(value) for value in raw)
    return Span.of(row, column, end_row, end_column)


def _int(value: Any) -> int:
    if type(value) is not int:
        raise TypeError("not an integer")
    return value


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("not a string")
    return value


def _encode_report(report: CachedReport) -> dict[str, Any]:
    return {
        "findings": [_encode_finding(finding) for finding in report.findings],
        "syntax_errors": [[p.row, p.column, p.message] for p in report.syntax_errors],
        "nothing_parsed": report.nothing_parsed,
        "error": report.error,
    }


def _encode_finding(finding: Finding) -> dict[str, Any]:
    fix = finding.fix
    return {
        "code": finding.code,
        "message": finding.message,
        "severity": finding.severity,
        "span": _span(finding.span),
        "fix": None
        if fix is None
        else {
            "applicability": fix.applicability,
            "message": fix.message,
            "edits": [[_span(edit.span), edit.content] for edit in fix.edits],
        },
        "related": [[_span(r.span), r.message, r.filename] for r in finding.related],
    }


def _decode_report(raw: Any) -> CachedReport:
    error = raw["error"]
    nothing_parsed = raw["nothing_parsed"]
    if not isinstance(nothing_parsed, bool):
        raise TypeError("not a boolean")
    return CachedReport(
        findings=[_decode_finding(item) for item in raw["findings"]],
        syntax_errors=[
            SyntaxProblem(_int(row), _int(column), _str(message))
            for row, column, message in raw["syntax_errors"]
        ],
        nothing_parsed=nothing_parsed,
        error=None if error is None else _str(error),
    )


def _decode_finding(raw: Any) -> Finding:
    severity = raw["severity"]
    if severity not in ("error", "warning", "information"):
        raise ValueError("unknown severity")
    fix = None
    if raw["fix"] is not None:
        applicability = raw["fix"]["applicability"]
        if applicability not in ("safe", "unsafe"):
            raise ValueError("unknown applicability")
        fix = Fix(
            applicability,
            _str(raw["fix"]["message"]),
            tuple(Edit(_span_of(span), _str(content)) for span, content in raw["fix"]["edits"]),
        )
    related = tuple(
        Related(_span_of(span), _str(message), None if name is None else _str(name))
        for span, message, name in raw["related"]
    )
    return Finding(
        _str(raw["code"]), _str(raw["message"]), severity, _span_of(raw["span"]), fix, related
    )
