"""Project configuration: `[tool.torchls]` in the nearest `pyproject.toml`.

In: a file or folder path. Out: a `ProjectConfig` (rule selection and probe settings) found by
walking up from that path. Unknown keys and wrong types raise `ConfigError` with the key named,
so a typo never silently disables checks.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from torchls.analysis.selection import RuleSelection

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

KNOWN_KEYS = {"select", "ignore", "extend-select", "per-file-ignores", "exclude", "probe"}
PROBE_KEYS = {"device", "steps", "timeout", "memory", "python"}


class ConfigError(Exception):
    """A `[tool.torchls]` table that cannot be used; the message names file and key."""


@dataclass(frozen=True)
class ProjectConfig:
    path: Path | None = None  # the pyproject.toml it came from
    select: tuple[str, ...] | None = None
    ignore: tuple[str, ...] = ()
    extend_select: tuple[str, ...] = ()
    per_file_ignores: dict[str, tuple[str, ...]] = field(default_factory=dict)
    exclude: tuple[str, ...] = ()
    probe: dict[str, Any] = field(default_factory=dict)

    @property
    def root(self) -> Path | None:
        return self.path.parent if self.path else None

    def selection(
        self,
        select: Iterable[str] | None = None,
        ignore: Iterable[str] | None = None,
        extend_select: Iterable[str] | None = None,
    ) -> RuleSelection:
        """The rule selection, with command-line/editor overrides taking precedence:
        `select` replaces the file's select; `ignore` and `extend_select` add to it."""
        return RuleSelection.from_lists(
            select=list(select) if select is not None else self.select,
            ignore=[*self.ignore, *(ignore or ())],
            extend_select=[*self.extend_select, *(extend_select or ())],
            per_file_ignores=self.per_file_ignores,
        )

    def relative(self, filename: str | Path) -> str:
        """`filename` relative to the config's folder (what per-file-ignores patterns match)."""
        path = Path(filename)
        if self.root is not None:
            try:
                return path.resolve().relative_to(self.root.resolve()).as_posix()
            except ValueError:
                pass
        return path.as_posix()


def find_pyproject(start: Path) -> Path | None:
    """The nearest `pyproject.toml` at or above `start` that has a `[tool.torchls]` table
    (or, failing that, None)."""
    current = start.resolve()
    if current.is_file() or not current.exists():
        current = current.parent
    for folder in (current, *current.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file() and _has_torchls_table(candidate):
            return candidate
    return None


@lru_cache(maxsize=64)
def _read_toml(path: Path, mtime: float) -> dict[str, Any]:
    with path.open("rb") as handle:
        return tomllib.load(handle)


def _has_torchls_table(path: Path) -> bool:
    try:
        data = _read_toml(path, path.stat().st_mtime)
    except OSError:
        return False
    except tomllib.TOMLDecodeError as error:
        # A broken file that meant to configure us must not silently fall back to defaults.
        try:
            mentions_us = b"[tool.torchls" in path.read_bytes()
        except OSError:
            mentions_us = False
        if mentions_us:
            raise ConfigError(f"{path}: invalid TOML: {error}") from None
        return False
    return isinstance(data.get("tool", {}).get("torchls"), dict)


def _string_list(table: dict[str, Any], key: str, path: Path) -> tuple[str, ...]:
    value = table[key]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigError(f"{path}: [tool.torchls] {key} must be a list of strings")
    return tuple(value)


def load_config(start: str | Path) -> ProjectConfig:
    """The configuration that applies to `start` (a file or folder); defaults if none."""
    path = find_pyproject(Path(start))
    if path is None:
        return ProjectConfig()
    return load_config_file(path)


def load_config_file(path: str | Path) -> ProjectConfig:
    """The `[tool.torchls]` table of one named pyproject.toml (defaults when it has none)."""
    path = Path(path).resolve()
    try:
        data = _read_toml(path, path.stat().st_mtime)
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{path}: cannot read: {error}") from None
    table = data.get("tool", {}).get("torchls")
    if table is None:
        return ProjectConfig(path=path)
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.torchls] must be a table")
    unknown = sorted(set(table) - KNOWN_KEYS)
    if unknown:
        raise ConfigError(
            f"{path}: unknown key {unknown[0]!r} in [tool.torchls] "
            f"(known: {', '.join(sorted(KNOWN_KEYS))})"
        )
    per_file: dict[str, tuple[str, ...]] = {}
    if "per-file-ignores" in table:
        raw = table["per-file-ignores"]
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: [tool.torchls] per-file-ignores must be a table")
        for pattern, codes in raw.items():
            if not isinstance(codes, list) or not all(isinstance(c, str) for c in codes):
                raise ConfigError(
                    f"{path}: [tool.torchls.per-file-ignores] {pattern!r} must be a list of codes"
                )
            per_file[pattern] = tuple(codes)
    probe = table.get("probe", {})
    if not isinstance(probe, dict):
        raise ConfigError(f"{path}: [tool.torchls] probe must be a table")
    unknown_probe = sorted(set(probe) - PROBE_KEYS)
    if unknown_probe:
        raise ConfigError(f"{path}: unknown key {unknown_probe[0]!r} in [tool.torchls.probe]")
    return ProjectConfig(
        path=path,
        select=_string_list(table, "select", path) if "select" in table else None,
        ignore=_string_list(table, "ignore", path) if "ignore" in table else (),
        extend_select=_string_list(table, "extend-select", path)
        if "extend-select" in table
        else (),
        per_file_ignores=per_file,
        exclude=_string_list(table, "exclude", path) if "exclude" in table else (),
        probe=dict(probe),
    )
