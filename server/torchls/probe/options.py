"""What a repro run may do: the options the CLI and the language server pass to `run_repro`.

In: user choices (flags, settings, a spec). Out: a frozen `ReproOptions`; `resolve_options`
merges it with a spec (explicit options win over the spec, the spec over the defaults) and
checks the values, raising `ReproUsageError` with a message fit for a person.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# Defined once in the configuration service, which the CLI, the server and the probe share.
from torchls.config import (
    DEFAULT_DEVICE,
    DEFAULT_MEMORY_MB,
    DEFAULT_STEPS,
    DEFAULT_TIMEOUT_S,
    DEVICE_CHOICES,
    DEVICE_PATTERN,
)
from torchls.probe.spec import ReproSpec
from torchls.records import record, replace

__all__ = [
    "DEFAULT_MEMORY_MB",
    "DEFAULT_STEPS",
    "DEFAULT_TIMEOUT_S",
    "DEVICE_PATTERN",
    "ReproOptions",
    "ReproUsageError",
    "resolve_options",
    "with_project",
]

MAX_NPROC = 64
LOOPBACK = re.compile(r"^(localhost|127\.\d+\.\d+\.\d+|\[?::1\]?)$", re.IGNORECASE)


class ReproUsageError(ValueError):
    """The request cannot be run as given (bad option, missing file, bad spec, no python)."""


@record(frozen=True)
class ReproOptions:
    """None means "not given": the spec's value, else the default, is used."""

    device: str | None = None
    steps: int | None = None
    batches: int | None = None
    timeout_s: float | None = None
    memory_mb: int | None = None
    python: str | None = None
    spec: str | None = None
    allow_fallback: bool | None = None
    seed: int | None = None
    deterministic: bool | None = None
    root: str | None = None
    argv: tuple[str, ...] = ()
    # Where the script runs (None: the project root); seen through the project's copy.
    cwd: str | None = None
    # More folders the run may write, seen through a copy like the project (`--writable`).
    writable: tuple[str, ...] = ()
    # The run may reach the network (`--network`; never from a project file).
    network: bool = False
    # Copy what the run wrote into this folder afterwards (`--keep-outputs`).
    keep_outputs: str | None = None
    # "auto": bubblewrap when it works here; "bwrap": require it; "none": rlimits and friends only.
    sandbox: str = "auto"
    output_cap_bytes: int = 1 << 20
    report_cap_bytes: int = 512 << 10
    file_size_mb: int = 256
    max_processes: int = 256
    # Extra environment variable names to pass through (secret-looking names are still refused).
    pass_env: tuple[str, ...] = ()
    # What the report's failing-boundary record shows as the command.
    command: str | None = None
    # Under torchrun on this many ranks (`--nproc`); None: one plain process.
    nproc: int | None = None
    # Passed to torchrun for a run across machines (instead of --standalone).
    nnodes: str | None = None
    rdzv_endpoint: str | None = None
    # How long a rank may wait in a collective that not every rank reached (TL908).
    collective_timeout_s: float | None = None


@record(frozen=True)
class Resolved:
    """Options with every default filled in."""

    device: str
    steps: int
    batches: int | None
    timeout_s: float
    memory_mb: int
    allow_fallback: bool
    seed: int
    deterministic: bool
    options: ReproOptions


def resolve_options(options: ReproOptions, spec: ReproSpec | None) -> Resolved:
    def pick(name: str, spec_name: str, default: object) -> object:
        value = getattr(options, name)
        if value is None and spec is not None:
            value = getattr(spec, spec_name)
        return default if value is None else value

    resolved = Resolved(
        device=str(pick("device", "device", DEFAULT_DEVICE)),
        steps=int(pick("steps", "steps", DEFAULT_STEPS)),  # type: ignore[arg-type]
        batches=pick("batches", "batches", None),  # type: ignore[arg-type]
        timeout_s=float(pick("timeout_s", "timeout", DEFAULT_TIMEOUT_S)),  # type: ignore[arg-type]
        memory_mb=int(pick("memory_mb", "memory", DEFAULT_MEMORY_MB)),  # type: ignore[arg-type]
        allow_fallback=bool(pick("allow_fallback", "allow_fallback", False)),
        seed=int(pick("seed", "seed", 0)),  # type: ignore[arg-type]
        deterministic=bool(pick("deterministic", "deterministic", False)),
        options=options,
    )
    _check(resolved)
    return resolved


def _check(resolved: Resolved) -> None:
    if not DEVICE_PATTERN.match(resolved.device):
        raise ReproUsageError(f"unknown device {resolved.device!r}: use {DEVICE_CHOICES}")
    if resolved.steps < 1:
        raise ReproUsageError("--steps must be at least 1")
    if resolved.batches is not None and resolved.batches < 1:
        raise ReproUsageError("--batches must be at least 1")
    if resolved.timeout_s <= 0:
        raise ReproUsageError("--timeout must be positive")
    if resolved.memory_mb < 64:
        raise ReproUsageError("--memory must be at least 64 MB")
    if resolved.options.sandbox not in ("auto", "bwrap", "none"):
        raise ReproUsageError("sandbox must be auto, bwrap or none")
    check_distributed(resolved.options, resolved.device)


def check_distributed(options: Any, device: str) -> None:
    """Refuse what a distributed run cannot do (ReproUsageError, a message for a person)."""
    nproc = options.nproc
    if nproc is None:
        if options.nnodes is not None or options.rdzv_endpoint is not None:
            raise ReproUsageError("--nnodes and --rdzv-endpoint go with --nproc N")
        return
    if not 1 <= nproc <= MAX_NPROC:
        raise ReproUsageError(f"--nproc must be between 1 and {MAX_NPROC}")
    if device.startswith("cuda:"):
        raise ReproUsageError(
            "--nproc runs one rank per GPU from the first: use --device cuda (or auto), and "
            "CUDA_VISIBLE_DEVICES to choose the GPUs"
        )
    if options.spec:
        raise ReproUsageError("--nproc runs a script under torchrun; a --spec is not supported")
    if options.collective_timeout_s is not None and options.collective_timeout_s <= 0:
        raise ReproUsageError("--collective-timeout must be positive")
    endpoint = options.rdzv_endpoint
    if endpoint is not None:
        host = endpoint.rsplit(":", 1)[0] if ":" in endpoint.strip("[]") else endpoint
        if not LOOPBACK.match(host) and not options.network:
            raise ReproUsageError(
                f"--rdzv-endpoint {endpoint}: a rendezvous with other machines needs --network "
                "(the sandbox's network has only its own loopback)"
            )


def with_defaults(options: ReproOptions | None) -> ReproOptions:
    return options if options is not None else ReproOptions()


# `[tool.torchls.probe]` key -> `ReproOptions` field.
PROJECT_FIELDS = {
    "device": "device",
    "steps": "steps",
    "timeout": "timeout_s",
    "memory": "memory_mb",
    "python": "python",
    "args": "argv",
    "spec": "spec",
    "cwd": "cwd",
    "writable": "writable",
    "nproc": "nproc",
}


def with_project(options: ReproOptions, probe: Mapping[str, Any]) -> ReproOptions:
    """`options` with what the user did not give filled from `[tool.torchls.probe]` (already
    checked by `torchls.config`); flags and editor settings win over the project file. Both
    `torchls repro` and the editor's repro call this, so the file means the same to both."""
    given = {
        field: probe[key]
        for key, field in PROJECT_FIELDS.items()
        if key in probe and getattr(options, field) in (None, ())
    }
    return replace(options, **given) if given else options
