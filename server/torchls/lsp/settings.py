"""Editor settings for the language server: what they are, where they come from, how they merge.

In: `initializationOptions` (either `{"settings": {...}}` or the flat settings dict, optionally
nested under `"torchls"`), `workspace/configuration` answers for section `torchls`, and
`workspace/didChangeConfiguration` payloads. Out: one frozen `Settings` value.

Layers, later wins key by key: defaults < initializationOptions < workspace/configuration (the
live value the editor holds). A `null` or missing key leaves the lower layer in force. Values of
the wrong type are dropped with a problem message rather than guessed at.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

SECTION = "torchls"
RunMode = Literal["onType", "onSave"]


@dataclass(frozen=True)
class Settings:
    """Effective settings. `select` None means "whatever pyproject.toml selects"."""

    enable: bool = True
    select: tuple[str, ...] | None = None
    ignore: tuple[str, ...] = ()
    run: RunMode = "onType"


def _code_list(value: Any) -> tuple[str, ...] | None:
    if isinstance(value, str):
        value = [part for part in value.replace(",", " ").split() if part]
    if isinstance(value, list | tuple) and all(isinstance(item, str) for item in value):
        return tuple(value)
    return None


def apply_settings(base: Settings, raw: Any) -> tuple[Settings, list[str]]:
    """Overlay the keys present in `raw` on `base`; returns the result and problems found."""
    if raw is None:
        return base, []
    if not isinstance(raw, Mapping):
        return base, [f"torchls settings must be an object, got {type(raw).__name__}"]
    problems: list[str] = []
    changes: dict[str, Any] = {}
    if (enable := raw.get("enable")) is not None:
        if isinstance(enable, bool):
            changes["enable"] = enable
        else:
            problems.append("torchls.enable must be true or false")
    for key in ("select", "ignore"):
        if (value := raw.get(key)) is None:
            continue
        codes = _code_list(value)
        if codes is None:
            problems.append(f"torchls.{key} must be a list of rule codes or prefixes")
        else:
            changes[key] = codes
    if (run := raw.get("run")) is not None:
        normalised = {"ontype": "onType", "onsave": "onSave"}.get(str(run).lower())
        if normalised is None:
            problems.append(f'torchls.run must be "onType" or "onSave", got {run!r}')
        else:
            changes["run"] = normalised
    return replace(base, **changes), problems


def unwrap_section(raw: Any) -> Any:
    """The torchls settings inside a payload that may wrap them as `{"torchls": {...}}` or
    `{"settings": {...}}` (what Helix pushes from `config.settings`), or both."""
    for _ in range(2):
        if isinstance(raw, Mapping) and isinstance(raw.get(SECTION), Mapping):
            raw = raw[SECTION]
        elif isinstance(raw, Mapping) and set(raw) == {"settings"}:
            raw = raw["settings"]
    return raw


def split_initialization_options(options: Any) -> tuple[Any, bool]:
    """(settings payload, trusted) from `initializationOptions`.

    Accepts `{"settings": {...}, "trusted": true}` (the shape a VS Code client or Helix's
    `config.settings` sends) and the flat dict (`init_options` in Neovim, `config` in Helix).
    `trusted` says whether the workspace may run code (the bounded repro); it defaults to False.
    """
    if not isinstance(options, Mapping):
        return None, False
    trusted = options.get("trusted") is True
    settings = options.get("settings", options)
    settings = unwrap_section(settings)
    if isinstance(settings, Mapping) and settings.get("trusted") is True:
        trusted = True
    return settings, trusted
