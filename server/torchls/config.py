"""Project configuration, the one service the CLI and the editor share.

In: a file or folder path. Out: a `ProjectConfig` (rule selection, per-file ignores, excludes
and the repro's `[tool.torchls.probe]` values) from the nearest `pyproject.toml` with a
`[tool.torchls]` table, walking up from that path. One policy for both front ends: unknown keys,
wrong types and a nearest `pyproject.toml` that is not valid TOML raise `ConfigError` with the
file and key named, so a typo never silently disables checks (`ConfigResolver` caches per
folder for the CLI; `config_or_defaults` is the editor's reading: defaults plus the problem).
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

from torchls.analysis.selection import RuleSelection
from torchls.records import field, record


def _toml() -> Any:
    """The TOML reader, imported when a file is to be read: most checks read none (a
    pyproject.toml that never names torchls cannot configure it), and every `torchls` process
    would pay for the import."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on Python 3.10 only
        import tomli as tomllib
    return tomllib


KNOWN_KEYS = {
    "select",
    "ignore",
    "extend-select",
    "per-file-ignores",
    "include",
    "exclude",
    "probe",
}
# What a folder walk checks unless `include` says otherwise: modules and Jupyter notebooks.
DEFAULT_INCLUDE = ("*.py", "*.ipynb")
PROBE_KEYS = {
    "device",
    "steps",
    "timeout",
    "memory",
    "python",
    "args",
    "spec",
    "cwd",
    "writable",
    "nproc",
}

# The repro's defaults and device pattern, defined once: `torchls repro`, the editor's
# `probe.*` settings and `[tool.torchls.probe]` all read them from here (this module imports
# nothing heavy, so the server's settings can use it without loading the probe).
DEFAULT_DEVICE = "auto"
DEFAULT_STEPS = 2
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MEMORY_MB = 4096
DEVICE_PATTERN = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")
DEVICE_CHOICES = "auto, cpu, cuda, cuda:N or mps"


class ConfigError(Exception):
    """A `[tool.torchls]` table that cannot be used; the message names file and key."""


@record(frozen=True)
class ProjectConfig:
    """The `[tool.torchls]` table of one pyproject.toml (defaults when there is none)."""

    path: Path | None = None  # the pyproject.toml it came from
    select: tuple[str, ...] | None = None
    ignore: tuple[str, ...] = ()
    extend_select: tuple[str, ...] = ()
    per_file_ignores: dict[str, tuple[str, ...]] = field(default_factory=dict)
    include: tuple[str, ...] = DEFAULT_INCLUDE
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
        return _toml().load(handle)


def _has_torchls_table(path: Path) -> bool:
    try:
        raw = path.read_bytes()
        # Whatever spelling a table takes (`[tool.torchls]`, `tool = {torchls = ...}`), it
        # names torchls: a file that does not is no configuration of ours, read or not.
        if b"torchls" not in raw:
            return False
        data = _read_toml(path, path.stat().st_mtime)
    except OSError:
        return False
    except _toml().TOMLDecodeError as error:
        # A broken file that meant to configure us must not silently fall back to defaults.
        if b"[tool.torchls" in raw:
            raise ConfigError(f"{path}: invalid TOML: {error}") from None
        return False
    return isinstance(data.get("tool", {}).get("torchls"), dict)


def _string_list(table: dict[str, Any], key: str, path: Path) -> tuple[str, ...]:
    value = table[key]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigError(f"{path}: [tool.torchls] {key} must be a list of strings")
    return tuple(value)


def load_config(start: str | Path) -> ProjectConfig:
    """The configuration that applies to `start` (a file or folder); defaults if none.

    Raises `ConfigError` when the nearest pyproject.toml is not valid TOML, whether or not
    it mentions torchls: the CLI makes that a usage error, the editor a warning (and then
    uses the defaults), and neither walks on to a file further up."""
    start = Path(start)
    folder = start.resolve()
    if folder.is_file() or not folder.exists():
        folder = folder.parent
    _reject_broken_pyproject(folder)
    path = find_pyproject(start)
    if path is None:
        return ProjectConfig()
    return load_config_file(path)


class ConfigResolver:
    """The `[tool.torchls]` configuration for each file, looked up once per folder.

    An explicit `--config` applies to every file; otherwise the nearest pyproject.toml wins,
    so a monorepo's sub-projects keep their own settings.
    """

    def __init__(self, explicit: Path | None = None) -> None:
        self._explicit = _load_explicit(explicit) if explicit is not None else None
        self._by_folder: dict[Path, ProjectConfig] = {}

    def for_path(self, path: Path) -> ProjectConfig:
        if self._explicit is not None:
            return self._explicit
        folder = path if path.is_dir() else path.parent
        folder = folder.resolve()
        if folder not in self._by_folder:
            self._by_folder[folder] = load_config(folder)
        return self._by_folder[folder]

    def configs(self) -> list[ProjectConfig]:
        """Each distinct configuration file used so far (for reporting problems once)."""
        found = [self._explicit] if self._explicit is not None else self._by_folder.values()
        unique: dict[Path, ProjectConfig] = {}
        for config in found:
            if config.path is not None:
                unique.setdefault(config.path, config)
        return list(unique.values())


def _reject_broken_pyproject(folder: Path) -> None:
    """Raise if the nearest pyproject.toml is not valid TOML (the broken-file policy).

    `find_pyproject` skips files it cannot parse, so a syntax slip in the user's
    `[tool.torchls]` table would silently fall back to the defaults (every rule on).
    """
    for candidate in (folder / "pyproject.toml", *(p / "pyproject.toml" for p in folder.parents)):
        if candidate.is_file():
            toml = _toml()
            try:
                # Read once per version of the file however many folders it governs.
                _read_toml(candidate, candidate.stat().st_mtime)
            except toml.TOMLDecodeError as error:
                raise ConfigError(f"{candidate}: cannot read: invalid TOML: {error}") from None
            except OSError as error:
                raise ConfigError(f"{candidate}: cannot read: {error}") from None
            return


def _load_explicit(path: Path) -> ProjectConfig:
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    _reject_broken_pyproject(path.parent.resolve())
    if path.name != "pyproject.toml":
        # `load_config` finds the file by walking folders, so it can only read pyproject.toml.
        raise ConfigError(f"{path}: --config must name a pyproject.toml")
    if find_pyproject(path) != path.resolve():
        return ProjectConfig(path=path.resolve())  # no [tool.torchls] table: defaults
    return load_config(path)


def config_or_defaults(start: str | None) -> tuple[ProjectConfig, str | None]:
    """The editor's reading of the same policy: (configuration, problem). A broken file or
    unknown key gives the defaults and the problem to show, never a silent fallback."""
    if start is None:
        return ProjectConfig(), None
    try:
        return load_config(start), None
    except ConfigError as problem:
        return ProjectConfig(), str(problem)
    except OSError as problem:  # an unreadable folder on the way up
        return ProjectConfig(), f"cannot read project configuration: {problem}"


def _probe_table(raw: dict[str, Any], path: Path) -> dict[str, Any]:
    """`[tool.torchls.probe]` checked value by value (a wrong type is an error, like a wrong
    key); `python` relative to the pyproject.toml's folder."""
    where = f"{path}: [tool.torchls.probe]"
    probe: dict[str, Any] = {}
    if "device" in raw:
        device = raw["device"]
        if not isinstance(device, str) or not DEVICE_PATTERN.match(device):
            raise ConfigError(f"{where} device must be {DEVICE_CHOICES}, got {device!r}")
        probe["device"] = device
    limits = (("steps", 1, True), ("timeout", 0, False), ("memory", 64, True), ("nproc", 1, True))
    for key, low, whole in limits:
        if key not in raw:
            continue
        value = raw[key]
        # bool is an int in Python, but `true` is never a valid number of steps.
        kinds: tuple[type, ...] = (int,) if whole else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds) or value < low:
            bound = f"at least {low}" if whole else "positive"
            raise ConfigError(f"{where} {key} must be a number {bound}, got {value!r}")
        probe[key] = value
    if "python" in raw:
        python = raw["python"]
        if not isinstance(python, str) or not python.strip():
            raise ConfigError(f"{where} python must be a path to an interpreter")
        candidate = Path(python).expanduser()
        # A bare name (`python3`) is looked up on PATH by the probe; a path is the project's.
        if candidate.is_absolute() or "/" in python:
            candidate = path.parent / candidate
            python = str(candidate)
        probe["python"] = python
    if "args" in raw:
        args = raw["args"]
        if isinstance(args, str):
            try:
                probe["args"] = tuple(shlex.split(args))
            except ValueError as error:
                raise ConfigError(f"{where} args: {error}") from None
        elif isinstance(args, list) and all(isinstance(a, str) for a in args):
            probe["args"] = tuple(args)
        else:
            raise ConfigError(f"{where} args must be a string or a list of strings")
    # Paths a downloaded project names must stay inside it: they decide what the sandbox
    # shows and lets the run write.
    for key in ("spec", "cwd"):
        if key in raw:
            probe[key] = str(_inside(raw[key], path, f"{where} {key}", folder=key == "cwd"))
    if "writable" in raw:
        folders = raw["writable"]
        if not isinstance(folders, list) or not all(isinstance(f, str) for f in folders):
            raise ConfigError(f"{where} writable must be a list of folders")
        probe["writable"] = tuple(
            str(_inside(f, path, f"{where} writable", folder=True)) for f in folders
        )
    if "network" in raw:
        raise ConfigError(
            f"{where} network: a project file cannot open the network for the code it ships; "
            "pass --network (or the editor setting torchls.probe.network) yourself"
        )
    if "sandbox" in raw:
        # Like the network: a downloaded project could switch the sandbox off for its own code.
        raise ConfigError(
            f"{where} sandbox: a project file cannot choose the sandbox for the code it ships; "
            "pass --sandbox auto|bwrap|none (or the editor setting torchls.probe.sandbox) "
            "yourself"
        )
    return probe


def _inside(value: Any, pyproject: Path, where: str, folder: bool) -> Path:
    """`value` resolved against the pyproject.toml's folder, refused outside that folder."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where} must be a path relative to {pyproject.name}")
    base = pyproject.parent.resolve()
    target = (base / Path(value).expanduser()).resolve()
    if target != base and base not in target.parents:
        raise ConfigError(f"{where} {value!r} is outside the project ({base})")
    if folder and not target.is_dir():
        raise ConfigError(f"{where} {value!r} is not a folder")
    return target


def load_config_file(path: str | Path) -> ProjectConfig:
    """The `[tool.torchls]` table of one named pyproject.toml (defaults when it has none)."""
    path = Path(path).resolve()
    try:
        data = _read_toml(path, path.stat().st_mtime)
    except (OSError, _toml().TOMLDecodeError) as error:
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
    unknown_probe = sorted(set(probe) - PROBE_KEYS - {"network", "sandbox"})
    if unknown_probe:
        raise ConfigError(f"{path}: unknown key {unknown_probe[0]!r} in [tool.torchls.probe]")
    probe = _probe_table(probe, path)
    return ProjectConfig(
        path=path,
        select=_string_list(table, "select", path) if "select" in table else None,
        ignore=_string_list(table, "ignore", path) if "ignore" in table else (),
        extend_select=_string_list(table, "extend-select", path)
        if "extend-select" in table
        else (),
        per_file_ignores=per_file,
        include=_string_list(table, "include", path) if "include" in table else DEFAULT_INCLUDE,
        exclude=_string_list(table, "exclude", path) if "exclude" in table else (),
        probe=dict(probe),
    )
