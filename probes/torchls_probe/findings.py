"""TL901-TL906: turn what the probe collected into findings on the user's lines.

In: the `Trace`, the `Roots` parameter checks and how the run ended (`Outcome`). Out: finding
dicts (code, name, severity, position, message, related locations), in a fixed order so that the
same code gives the same findings. Codes and names follow the rule catalog (rules.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torchls_probe.attribution import Location
from torchls_probe.positions import position
from torchls_probe.records import Event

if TYPE_CHECKING:  # torch-free at import: a report must be writable where torch is missing
    from torchls_probe.params import Roots
    from torchls_probe.tracer import Trace

NAMES = {
    "TL901": "first-non-finite",
    "TL902": "parameter-without-gradient",
    "TL903": "loss-contract-violated",
    "TL904": "runtime-warning",
    "TL905": "probe-error",
    "TL906": "probe-limit",
    "TL907": "loss-diverging",
    "TL911": "checkpoint-not-weights-only",
}
# Origins that begin a non-finite value of their own: "op" (made from finite inputs) and
# "masked" (a NaN made from a +-inf mask, e.g. a softmax over a row masked everywhere). A "mask"
# (an infinity the code wrote on purpose, `masked_fill(mask, -inf)`) is not a problem unless it
# reaches the loss, a gradient or a parameter.
ORIGINS = ("op", "masked")
PHASES = ("input", "forward", "loss", "backward", "step")


@dataclass
class Outcome:
    """How the run ended."""

    status: str = "ok"  # ok | error | timeout | memory | crashed
    # steps | backwards | batches | end | exit | exception | timeout | cpu | memory | output
    stopped_by: str = "end"
    exception: dict[str, Any] | None = None
    location: Location | None = None
    limit_message: str = ""
    notes: list[str] = field(default_factory=list)


def finding(
    code: str,
    severity: str,
    loc: Location,
    message: str,
    related: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    item: dict[str, Any] = {"code": code, "name": NAMES[code], "severity": severity}
    item.update(position(loc))
    item["message"] = message
    item["related"] = related or []
    return item


def related(loc: Location, message: str) -> dict[str, Any]:
    item = position(loc)
    item["message"] = message
    return item


def build(
    trace: Trace, roots: Roots, outcome: Outcome, file: str, divergence: Any = None
) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    found.extend(_nonfinite(trace))
    found.extend(_parameters(trace, roots, file))
    found.extend(_diverging(divergence, trace, roots, file))
    for loc, _op, violation in trace.contracts:
        found.append(finding("TL903", violation.severity, loc, violation.message))
    for warning in trace.warnings:
        loc = warning["location"]
        if loc is not None:
            text = f"{warning['category']}: {_first_line(warning['message'])}"
            found.append(finding("TL904", "information", loc, text))
    found.extend(_outcome(outcome, file))
    return found


def _first_line(text: str, limit: int = 300) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def describe_nonfinite(info: dict[str, Any]) -> str:
    """'3 -inf of 32 values' style text for messages."""
    counts = info.get("nonfinite") or {}
    parts = []
    for key, label in (("nan", "NaN"), ("posinf", "+inf"), ("neginf", "-inf")):
        if counts.get(key):
            parts.append(f"{counts[key]} {label}")
    total = counts.get("numel")
    return (", ".join(parts) or "non-finite values") + (f" of {total} values" if total else "")


# --- TL901 -------------------------------------------------------------------------------------


def chain(events: list[Event], start: Event) -> list[Event]:
    """The events that carried `start`'s value on to the loss: the shortest path (breadth
    first, earliest events first) to an event in the loss, backward or step phase. A value often
    feeds several ops, and the first of them can be a dead branch (an `exp` turning -inf into 0,
    a logged statistic); only when no path reaches the loss is the first-child chain shown."""
    children: dict[int, list[Event]] = {}
    for event in events:
        for source in event.sources:
            children.setdefault(source, []).append(event)
    parent: dict[int, Event | None] = {start.index: None}
    queue = [start]
    for current in queue:  # grows while iterating: a breadth-first walk
        if current.phase in ("loss", "backward", "step"):
            path = [current]
            while (previous := parent[path[-1].index]) is not None:
                path.append(previous)
            return path[::-1]
        for child in children.get(current.index, []):
            if child.index not in parent:
                parent[child.index] = current
                queue.append(child)
    path = [start]
    seen = {start.index}
    current = start
    while True:
        nexts = [e for e in children.get(current.index, []) if e.index not in seen]
        if not nexts:
            return path
        current = nexts[0]
        seen.add(current.index)
        path.append(current)


def _nonfinite(trace: Trace) -> list[dict[str, Any]]:
    events = trace.events.items
    if not events:
        return []
    reported_lines: set[tuple[str, int]] = set()
    found = []
    # The first event of each phase, in the order they happened.
    firsts = sorted(
        (e for e in (_first_in(events, phase) for phase in PHASES) if e is not None),
        key=lambda e: e.index,
    )
    for index, event in enumerate(firsts):
        if index > 0 and (event.origin not in ORIGINS or event.location.key() in reported_lines):
            continue
        path = chain(events, event)
        links = [related(e.location, f"{e.phase}: {_what(e)}") for e in path[1:]]
        for other in firsts:
            if other in path:
                continue
            if other.phase != event.phase and other.index > event.index:
                if other.location.key() != event.location.key() or other.phase == "step":
                    links.append(related(other.location, f"first in {other.phase}: {_what(other)}"))
        reported_lines.add(event.location.key())
        message = _event_message(event, first=not found)
        found.append(finding("TL901", "error", event.location, message, _unique(links)))
    return found


def _first_in(events: list[Event], phase: str) -> Event | None:
    return next((e for e in events if e.phase == phase and not is_mask(e)), None)


def is_mask(event: Event) -> bool:
    """An intended infinity that stayed where masks belong (before the loss), or a value the
    code replaced before anything used it (`cleaned`)."""
    return event.origin in ("mask", "cleaned") and event.phase in ("input", "forward")


def _unique(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen = set()
    kept = []
    for item in items:
        key = (item["filename"], item["line"], item["message"])
        if key not in seen:
            seen.add(key)
            kept.append(item)
    return kept


def _what(event: Event) -> str:
    values = describe_nonfinite(event.summary or {})
    subject = event.detail or event.op
    return f"{subject} ({values})"


def _event_message(event: Event, first: bool) -> str:
    values = describe_nonfinite(event.summary or {})
    lead = "first non-finite value" if first else "non-finite value"
    module = f" in {event.module}" if event.module else ""
    if event.phase == "input":
        if event.detail:
            return (
                f"{lead} (input): parameter {event.detail} already holds {values} before training"
            )
        return f"{lead} (input): the batch from the DataLoader contains {values}"
    if event.phase == "step":
        why = (
            "although its gradients were finite: the update exploded (learning rate too high?)"
            if event.origin == "op"
            else "because its gradients were already non-finite"
        )
        return (
            f"{lead} (step): after optimizer step {event.step}, parameter {event.detail} "
            f"holds {values} {why}"
        )
    if event.phase == "backward":
        cause = (
            "from a finite incoming gradient"
            if event.origin == "op"
            else "from an already non-finite gradient"
        )
        return f"{lead} (backward): the gradient through {event.op}{module} has {values} {cause}"
    cause = {
        "op": "from finite inputs",
        "masked": "from an input masked with an infinity (is every position of a row masked?)",
        "mask": "from an infinity written as a mask, and it reached the loss",
    }.get(event.origin, "from an input that was non-finite")
    return f"{lead} ({event.phase}): {event.op}{module} produced {values} {cause}"


# --- TL902 -------------------------------------------------------------------------------------


def _parameters(trace: Trace, roots: Roots, file: str) -> list[dict[str, Any]]:
    fallback = _fallback_location(trace, roots, file)
    found = []
    groups = (
        (roots.without_grad, "got no gradient (an unused layer or a detached branch)"),
        (roots.zero_grad, "got an all-zero gradient"),
        (roots.not_in_optimizer(trace.copied_from), "is in no optimizer, so it is never updated"),
    )
    step_lines = [roots.optimizer_lines[k] for k in sorted(roots.optimizer_lines)][:1]
    for index, (params, why) in enumerate(groups):
        by_module: dict[str, list[str]] = {}
        where: dict[str, Location | None] = {}
        for name, loc in params.items():
            owner = name.rsplit(".", 1)[0]
            by_module.setdefault(owner, []).append(name)
            where.setdefault(owner, loc)
        for owner, names in by_module.items():
            loc = where[owner] or fallback
            subject = names[0] if len(names) == 1 else f"{', '.join(names)}"
            verb = why
            if len(names) > 1:
                verb = why.replace("is in", "are in").replace("it is", "they are")
                verb = verb.replace("gets", "get")
            plural = "parameter" if len(names) == 1 else "parameters"
            links = []
            if index == 2 and step_lines:
                links.append(related(step_lines[0], "the optimizer that steps is built without it"))
            found.append(finding("TL902", "warning", loc, f"{plural} {subject} {verb}", links))
    return found


# --- TL907 -------------------------------------------------------------------------------------


def _diverging(divergence: Any, trace: Trace, roots: Roots, file: str) -> list[dict[str, Any]]:
    verdict = divergence.verdict() if divergence is not None else None
    if verdict is None:
        return []
    message, where, loss_line = verdict
    loc = where or _fallback_location(trace, roots, file)
    links = [related(loss_line, "the loss")] if loss_line is not None and loss_line != loc else []
    return [finding("TL907", "warning", loc, message, links)]


def _fallback_location(trace: Trace, roots: Roots, file: str) -> Location:
    for model in roots.models:
        loc = roots.first_call.get(id(model))
        if loc is not None:
            return loc
    for loc in trace.backward_lines.values():
        return loc
    return Location(file, 1)


# --- TL905 / TL906 -----------------------------------------------------------------------------


def _outcome(outcome: Outcome, file: str) -> list[dict[str, Any]]:
    loc = outcome.location or Location(file, 1)
    if outcome.stopped_by in ("exception", "exit") and outcome.exception is not None:
        info = outcome.exception
        message = f"{info['type']}: {_first_line(info['message'])}"
        if info.get("op"):
            message += f" (while running {info['op']})"
        return [finding("TL905", "error", loc, message)]
    if outcome.stopped_by in ("timeout", "cpu", "memory", "output"):
        return [finding("TL906", "warning", loc, outcome.limit_message)]
    return []


def build_limit_only(outcome: Outcome, file: str) -> list[dict[str, Any]]:
    """When a limit struck before tracing started (during `import torch`, say)."""
    return _outcome(outcome, file)
