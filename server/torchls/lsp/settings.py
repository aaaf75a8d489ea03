"""Editor settings for the language server: what they are, where they come from, how they merge.

In: `initializationOptions` (either `{"settings": {...}}` or the flat settings dict, optionally
nested under `"torchls"`), `workspace/configuration` answers for section `torchls`, and
`workspace/didChangeConfiguration` payloads. Out: one frozen `Settings` value.

The repro's settings live under `probe` (`{"probe": {"steps": 2}}`, or the dotted keys some
clients send flat: `{"probe.steps": 2}`): `device`, `steps`, `timeout` (seconds), `memory` (MB)
`python` (the interpreter that has the user's torch; empty means "not set"), `args` (the
script's arguments: a shell-quoted string or a list), `spec`, `cwd` and `writable` (paths
relative to the workspace), `nproc` (ranks under torchrun), and `network` and `sandbox`
(`auto`, `bwrap` or `none`): the two settings no project file can give, since a downloaded
project must not open the network or switch the sandbox off for the code it ships.

Layers, later wins key by key: defaults < initializationOptions < workspace/configuration (the
live value the editor holds). A `null` or missing key leaves the lower layer in force. Values of
the wrong type are dropped with a problem message rather than guessed at.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from torchls.config import DEVICE_CHOICES, DEVICE_PATTERN
from torchls.records import field, record, replace

SECTION = "torchls"
SANDBOX_MODES = ("auto", "bwrap", "none")
RunMode = Literal["onType", "onSave"]


@record(frozen=True)
class ProbeSettings:
    """The repro's settings; None means "not set": the probe's default (or, for `python`, the
    server's choice of interpreter) applies."""

    device: str | None = None
    steps: int | None = None
    timeout: float | None = None
    memory: int | None = None
    python: str | None = None
    args: tuple[str, ...] | None = None  # the script's arguments
    spec: str | None = None  # a repro spec (relative to the workspace)
    cwd: str | None = None  # where the script runs (relative to the workspace)
    writable: tuple[str, ...] | None = None  # more folders the run may write, through a copy
    network: bool | None = None  # the run may reach the network (trusted workspaces only)
    nproc: int | None = None  # ranks under torchrun (a distributed repro); None: one process
    sandbox: str | None = None  # auto|bwrap|none (the probe's --sandbox); None: auto


@record(frozen=True)
class Settings:
    """Effective settings. `select` None means "whatever pyproject.toml selects"."""

    enable: bool = True
    select: tuple[str, ...] | None = None
    ignore: tuple[str, ...] = ()
    run: RunMode = "onType"
    probe: ProbeSettings = field(default_factory=ProbeSettings)


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
    probe, more = _apply_probe(base.probe, _probe_payload(raw))
    problems.extend(more)
    if probe != base.probe:
        changes["probe"] = probe
    return replace(base, **changes), problems


def _probe_payload(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The `probe` keys, whether nested (`{"probe": {...}}`) or dotted (`{"probe.steps": 2}`)."""
    payload: dict[str, Any] = {}
    nested = raw.get("probe")
    if isinstance(nested, Mapping):
        payload.update(nested)
    for key, value in raw.items():
        if isinstance(key, str) and key.startswith("probe."):
            payload[key.removeprefix("probe.")] = value
    return payload


def _number(value: Any) -> float | None:
    # bool is an int in Python, but `true` is never a valid number of steps.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _apply_probe(base: ProbeSettings, raw: Mapping[str, Any]) -> tuple[ProbeSettings, list[str]]:
    problems: list[str] = []
    changes: dict[str, Any] = {}
    if (device := raw.get("device")) is not None:
        if isinstance(device, str) and DEVICE_PATTERN.match(device.strip()):
            changes["device"] = device.strip()
        else:
            problems.append(f"torchls.probe.device must be {DEVICE_CHOICES}, got {device!r}")
    limits = (("steps", 1, True), ("timeout", 0, False), ("memory", 64, True), ("nproc", 1, True))
    for key, minimum, integer in limits:
        if (value := raw.get(key)) is None:
            continue
        number = _number(value)
        valid = number is not None and (number >= minimum if integer else number > minimum)
        if number is None or not valid or (integer and number != int(number)):
            bound = f"at least {minimum}" if integer else "positive"
            problems.append(f"torchls.probe.{key} must be a {bound} number, got {value!r}")
            continue
        changes[key] = int(number) if integer else number
    if (python := raw.get("python")) is not None:
        if not isinstance(python, str):
            problems.append("torchls.probe.python must be a path to an interpreter")
        elif python.strip():
            changes["python"] = python.strip()
        # An empty string is what clients send for "not set": the lower layer stays.
    if (args := raw.get("args")) is not None:
        parsed = script_arguments(args)
        if parsed is None:
            problems.append("torchls.probe.args must be a string or a list of strings")
        elif parsed or args == []:
            changes["args"] = parsed
    for key in ("spec", "cwd"):
        if (value := raw.get(key)) is None:
            continue
        if not isinstance(value, str):
            problems.append(f"torchls.probe.{key} must be a path")
        elif value.strip():
            changes[key] = value.strip()
    if (writable := raw.get("writable")) is not None:
        if isinstance(writable, list) and all(isinstance(w, str) for w in writable):
            changes["writable"] = tuple(w for w in writable if w.strip())
        else:
            problems.append("torchls.probe.writable must be a list of folders")
    if (network := raw.get("network")) is not None:
        if isinstance(network, bool):
            changes["network"] = network
        else:
            problems.append("torchls.probe.network must be true or false")
    if (sandbox := raw.get("sandbox")) is not None:
        mode = sandbox.strip().lower() if isinstance(sandbox, str) else None
        if mode in SANDBOX_MODES:
            changes["sandbox"] = mode
        elif mode != "":  # an empty string is what clients send for "not set"
            # A typo must not leave the user believing the sandbox is what they asked for.
            problems.append(
                f'torchls.probe.sandbox must be "auto", "bwrap" or "none", got {sandbox!r} '
                "(the repro keeps the sandbox it had)"
            )
    return replace(base, **changes), problems


def script_arguments(value: Any) -> tuple[str, ...] | None:
    """Script arguments as a shell-quoted string or a list of strings; None when invalid."""
    import shlex

    if isinstance(value, str):
        try:
            return tuple(shlex.split(value))
        except ValueError:
            return None
    if isinstance(value, list | tuple) and all(isinstance(item, str) for item in value):
        return tuple(value)
    return None


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
    `trusted` says whether the workspace may run code (the bounded repro, and only when the user
    asks for it). It is True unless the client says `trusted: false`: editors without a notion
    of workspace trust (Neovim, Helix) send nothing, and their users must be able to run a
    repro; the VS Code extension sends false for workspaces in Restricted Mode.
    """
    if not isinstance(options, Mapping):
        return None, True
    trusted = options.get("trusted") is not False
    settings = options.get("settings", options)
    settings = unwrap_section(settings)
    if isinstance(settings, Mapping) and settings.get("trusted") is False:
        trusted = False
    return settings, trusted
