"""The report document as types: what `ReproReport.data` holds once the schema has passed it.

In: nothing (declarations). Out: TypedDicts, one per object of `torchls_probe/report.schema.json`
that readers walk, required keys in the `_...Keys` base and the others optional, so a reader that
indexes a key the schema does not promise fails the type check instead of a user's run.
`tests/probe/test_report_schema.py` holds each of them to the schema (same keys, same required
ones). Open parts of the schema (`environment`, `distributed`, `written`, the per-parameter
training figures) stay `dict[str, Any]`.
"""

from __future__ import annotations

from typing import Any, TypedDict


class Position(TypedDict):
    filename: str
    line: int
    column: int
    end_line: int
    end_column: int


class _RelatedKeys(Position):
    message: str


class Related(_RelatedKeys, total=False):
    source: str


class _FindingKeys(Position):
    code: str
    severity: str
    message: str


class Finding(_FindingKeys, total=False):
    name: str
    related: list[Related]
    ranks: list[int]


class Counts(TypedDict, total=False):
    nan: int
    posinf: int
    neginf: int
    numel: int


class Summary(TypedDict, total=False):
    """A tensor summary; every key is optional (an empty or uninitialised tensor has few)."""

    shape: list[int]
    dtype: str
    device: str
    requires_grad: bool
    finite: bool
    min: float | None
    max: float | None
    mean: float | None
    uninitialized: bool
    empty: bool
    complex: bool
    nonfinite: Counts


class _EntryKeys(TypedDict):
    op: str
    column: int
    end_column: int


class Entry(_EntryKeys, total=False):
    module: str | None
    phase: str
    count: int
    nonfinite_count: int
    outputs: list[Summary]
    grad: Summary | None
    setup: bool


class RankEntries(TypedDict):
    rank: int
    entries: list[Entry]


class LineRanks(TypedDict):
    differ: bool
    values: list[RankEntries]


class _LineKeys(TypedDict):
    filename: str
    line: int
    entries: list[Entry]


class LineRecord(_LineKeys, total=False):
    source: str
    dropped_entries: int
    ranks: LineRanks


class _EventKeys(Position):
    index: int
    phase: str
    origin: str
    op: str


class Event(_EventKeys, total=False):
    module: str | None
    detail: str | None
    optimizer_steps_before: int | None
    sources: list[int]
    summary: Summary | None


class _NonfiniteKeys(TypedDict):
    events: list[Event]
    chain: list[int]


class Nonfinite(_NonfiniteKeys, total=False):
    dropped: int
    first: int | None


class _FrameKeys(TypedDict):
    filename: str


class Frame(_FrameKeys, total=False):
    line: int | None
    function: str


class _ExceptionKeys(TypedDict):
    kind: str
    type: str
    message: str


class ExceptionInfo(_ExceptionKeys, total=False):
    filename: str
    line: int
    column: int
    end_line: int
    end_column: int
    op: str | None
    traceback: list[Frame]
    sandbox_cause: str
    environment_cause: str
    search_path: list[str]


class _WarningKeys(TypedDict):
    category: str
    message: str


class Warning_(_WarningKeys, total=False):
    filename: str | None
    line: int | None
    column: int | None
    end_line: int | None
    end_column: int | None


class _TargetKeys(TypedDict):
    file: str


class Target(_TargetKeys, total=False):
    root: str | None
    step: str | None
    setup: str | None
    notebook: dict[str, Any]


class Bounds(TypedDict, total=False):
    steps: int | None
    batches: int | None
    timeout_s: float | None
    memory_mb: int | None
    output_cap_bytes: int | None


class Progress(TypedDict):
    optimizer_steps: int | None
    batches: int | None
    backward_calls: int | None


class _DeviceKeys(TypedDict):
    requested: str | None
    resolved: str | None
    observed: list[str]


class Device(_DeviceKeys, total=False):
    torch_device: str | None
    fallback: bool
    cuda_available: bool
    mps_available: bool
    name: str | None
    capability: str | None
    count: int | None
    cuda_visible_devices: str | None
    backend: str | None
    warnings: list[str]


class _LayerKeys(TypedDict):
    name: str
    held: bool


class Layer(_LayerKeys, total=False):
    detail: str


class _SandboxKeys(TypedDict):
    layers: list[Layer]


class Sandbox(_SandboxKeys, total=False):
    degraded: list[str]
    warnings: list[str]
    summary: str | None


class Parameters(TypedDict, total=False):
    without_grad: list[str]
    zero_grad: list[str]
    not_in_optimizer: list[str]


class Output(TypedDict, total=False):
    bytes: int
    head: str
    tail: str
    truncated: bool
    note: str


class Figure(TypedDict):
    step: int
    value: float | None


class _ParameterFiguresKeys(TypedDict):
    step: int
    name: str


class ParameterFigures(_ParameterFiguresKeys, total=False):
    grad_norm: float | None
    grad_max: float | None
    update_norm: float | None
    weight_norm: float | None


class _ActivationKeys(TypedDict):
    module: str
    step: int


class Activation(_ActivationKeys, total=False):
    kind: str
    mean: float | None
    std: float | None
    zeros: float | None
    nonfinite: float | None


class Training(TypedDict, total=False):
    loss: list[Figure]
    grad_norm: list[Figure]
    update_ratio: list[Figure]
    layers: dict[str, dict[str, float | None]]
    parameters: list[ParameterFigures]
    activations: list[Activation]
    parameter_names: list[str]
    same_start: dict[str, Any]


class _ReportKeys(TypedDict):
    schema_version: int
    probe_version: str | None
    status: str
    stopped_by: str
    mode: str
    target: Target
    bounds: Bounds
    progress: Progress
    device: Device
    environment: dict[str, Any] | None
    findings: list[Finding]
    nonfinite: Nonfinite
    parameters: Parameters
    autocast: list[str]
    warnings: list[Warning_]
    exception: ExceptionInfo | None
    notes: list[str]
    lines: list[LineRecord]
    dropped_lines: int
    truncated: bool
    timing: dict[str, Any]


class Report(_ReportKeys, total=False):
    """The whole document (docs/probe-report.md); the server adds `sandbox`, `output`,
    `written` and, with `--nproc`, the merged `distributed`."""

    sandbox: Sandbox
    output: Output
    training: Training
    written: dict[str, Any]
    provisional: bool
    distributed: dict[str, Any]
    inspection: dict[str, Any]


# Each TypedDict above and the schema object it stands for (`#/$defs/<name>`, or a property of
# the top level), for the agreement test.
SCHEMA_OBJECTS: dict[str, type] = {
    "#": Report,
    "#/$defs/related": Related,
    "#/$defs/finding": Finding,
    "#/$defs/summary": Summary,
    "#/$defs/entry": Entry,
    "#/$defs/line": LineRecord,
    "#/$defs/event": Event,
    "#/$defs/frame": Frame,
    "#/$defs/exception": ExceptionInfo,
    "#/$defs/warning": Warning_,
    "#/$defs/figure": Figure,
    "#/$defs/parameter_figures": ParameterFigures,
    "#/$defs/activation": Activation,
    "#/$defs/position": Position,
    "target": Target,
    "bounds": Bounds,
    "progress": Progress,
    "device": Device,
    "sandbox": Sandbox,
    "nonfinite": Nonfinite,
    "parameters": Parameters,
    "output": Output,
    "training": Training,
}
