"""The tracer: a TorchFunctionMode that attributes every top-level torch call to a user line.

In: torch calls made while the mode is active (the mode is disabled inside its own handler, so
`F.cross_entropy` is one call, not its internals). Out: the shared `Trace` — per-line tensor
summaries, the first non-finite value per (line, op, phase) with origin vs propagated, loss
contract violations and broadcast differences feeding a loss. Backward work has no user frame,
so it is attributed through `Node.register_hook` closures created when the forward op ran.
"""

from __future__ import annotations

import math
import os
import sys
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from torchls_probe.attribution import Location, UserCode
from torchls_probe.contracts import LOSS_FUNCTIONS, Violation, broadcast_pair, check_loss
from torchls_probe.names import op_name
from torchls_probe.records import Entry, Event, Events, LineTable
from torchls_probe.stats import is_finite, summary, tensors_in

_BACKWARD = {torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad}
_UNINITIALIZED = {
    "torch.empty",
    "torch.empty_like",
    "torch.empty_strided",
    "Tensor.new_empty",
    "Tensor.new_empty_strided",
}
LIGHT_REPEATS = 2  # traced calls per (line, op) while autograd is off
_DIFFERENCES = {"Tensor.sub", "Tensor.__sub__", "Tensor.__rsub__", "Tensor.rsub", "torch.sub"}
# Ops that write a fill value: with an infinite one (`masked_fill(mask, float("-inf"))` before a
# softmax, `torch.full((n, n), -inf).triu(1)` for causal attention) the infinity is a mask the
# code meant, not a numerical accident.
_MASK_WRITERS = {
    "Tensor.masked_fill",
    "Tensor.masked_fill_",
    "torch.masked_fill",
    "torch.where",
    "Tensor.where",
    "torch.full",
    "torch.full_like",
    "Tensor.new_full",
    "Tensor.fill_",
    "torch.fill",
    "Tensor.index_fill",
    "Tensor.index_fill_",
    "torch.tensor",
    "torch.as_tensor",
    "torch.scalar_tensor",
}
# Methods of torch.nn modules that build, move, reset or serialise a model rather than compute
# with it: an op run under one of them (parameter creation in a layer's constructor,
# `model.to(device)`, BatchNorm's running statistics, `state_dict()` in a `torch.save` line) is
# recorded as `setup`, so that a report's shape table can show the training step alone.
_SETUP_METHODS = {
    "__init__",
    "_apply",
    "state_dict",
    "_save_to_state_dict",
    "load_state_dict",
    "_load_from_state_dict",
    "reset_parameters",
    "_reset_parameters",
    "reset_running_stats",
    "to_empty",
}
_TORCH_NN = os.path.dirname(torch.nn.__file__) + os.sep
# Autograd nodes walked per recorded op: enough to cover a composite op's internal nodes.
_NODE_WALK = 32
_SUSPECT_SEARCH = 512


def _infinite_fill(args: tuple, kwargs: dict) -> bool:
    """Whether a fill value among the arguments is +-inf (a Python float, a one-element tensor,
    or a short literal list such as `torch.tensor([0.0, float("-inf")])`)."""
    values: list[Any] = [*args, *kwargs.values()]
    seen = 0
    while values and seen < 256:
        value = values.pop()
        seen += 1
        if isinstance(value, float):
            if math.isinf(value):
                return True
        elif isinstance(value, list | tuple):
            values.extend(value[:64])
        elif isinstance(value, torch.Tensor) and value.numel() == 1 and value.is_floating_point():
            if math.isinf(float(value.detach())):
                return True
    return False


class Trace:
    """Everything the probe collected; `report.py` reads it, the hooks and the mode write it."""

    def __init__(self, user: UserCode, max_lines: int, max_entries: int, max_events: int) -> None:
        self.user = user
        self.lines = LineTable(max_lines, max_entries)
        self.events = Events(max_events)
        self.contracts: list[tuple[Location, str, Violation]] = []
        self._contract_keys: set[tuple[Any, ...]] = set()
        self.warnings: list[dict[str, Any]] = []
        self._warning_keys: set[tuple[Any, ...]] = set()
        self.observed_devices: dict[str, None] = {}
        self.loss_lines: dict[tuple[str, int], None] = {}
        self.backward_lines: dict[tuple[str, int], Location] = {}
        self.phase = "forward"
        self.busy = False  # the probe's own torch work must not be traced
        self.in_step = False
        self.steps = 0
        self.batches = 0
        self.backward_calls = 0
        self.last_step_at: float | None = None  # time.monotonic() after the last optimizer step
        self.backward_at_last_step = 0
        # Set by the hooks: called before and after every backward (the step bound for loops
        # without an optimizer, gradients judged right after a complete backward, the loss).
        self.before_backward: Callable[[], None] | None = None
        self.after_backward: Callable[[Any], None] | None = None
        self.current_op: str | None = None
        self.module_stack: list[torch.nn.Module] = []
        self.module_names: dict[int, str] = {}
        self.internal_errors: list[str] = []

    def internal_error(self, op: str, error: Exception) -> None:
        if len(self.internal_errors) < 5:
            self.internal_errors.append(f"probe error while recording {op}: {error!r}")

    def module_path(self) -> str | None:
        if not self.module_stack:
            return None
        module = self.module_stack[-1]
        return self.module_names.get(id(module), type(module).__name__)

    def add_contract(self, loc: Location, op: str, violation: Violation) -> None:
        key = (loc.key(), violation.message)
        if key not in self._contract_keys and len(self.contracts) < 50:
            self._contract_keys.add(key)
            self.contracts.append((loc, op, violation))

    def add_warning(self, loc: Location | None, category: str, message: str) -> None:
        key = (loc.key() if loc else None, category, message)
        if key in self._warning_keys or len(self.warnings) >= 50:
            return
        self._warning_keys.add(key)
        self.warnings.append({"location": loc, "category": category, "message": message})

    def event(
        self,
        phase: str,
        loc: Location,
        op: str,
        info: dict[str, Any] | None,
        origin: str,
        sources: list[int] | None = None,
        detail: str = "",
        module: str | None = None,
    ) -> Event | None:
        return self.events.add(
            Event(
                index=-1,
                phase=phase,
                origin=origin,
                location=loc,
                op=op,
                module=module if module is not None else self.module_path(),
                summary=info,
                sources=sources or [],
                step=self.steps,
                detail=detail,
            )
        )


class Tracer(TorchFunctionMode):
    def __init__(self, trace: Trace, max_outputs: int) -> None:
        super().__init__()
        self.trace = trace
        self.max_outputs = max_outputs
        # id(tensor) -> (weak reference, event index): non-finite tensors the probe produced.
        self._nonfinite: dict[int, tuple[weakref.ref, int]] = {}
        # id(autograd node) -> forward location and entry; cleared after each backward.
        self._nodes: dict[int, tuple[Location, Entry | None]] = {}
        self._no_grad_calls: dict[tuple[Any, int, str], int] = {}
        # id(node) -> (node, location, violation) of broadcast differences, checked at backward.
        self._suspects: dict[int, tuple[Any, Location, Violation]] = {}

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple = (),
        kwargs: dict | None = None,
    ) -> Any:
        if kwargs is None:
            kwargs = {}
        trace = self.trace
        if trace.busy or trace.in_step:
            return func(*args, **kwargs)
        name = op_name(func)
        if name is None:
            return func(*args, **kwargs)
        frame = trace.user.innermost(sys._getframe(1))
        if frame is None:
            return func(*args, **kwargs)
        if not torch.is_grad_enabled() and func not in _BACKWARD:
            # Light trace for code that builds no graph (evaluation, sampling, logging between
            # steps): each op of a line is traced on its first calls only, so generating 500
            # tokens after every step costs little more than a plain run.
            key = (frame.f_code, frame.f_lineno, name)
            seen = self._no_grad_calls.get(key, 0)
            if seen >= LIGHT_REPEATS:
                return func(*args, **kwargs)
            self._no_grad_calls[key] = seen + 1
        loc = trace.user.location(frame)
        if func in _BACKWARD:
            return self._backward(func, args, kwargs, loc)
        loss = func in LOSS_FUNCTIONS
        if loss:
            self._check(lambda: check_loss(func, args, kwargs), loc, name)
        trace.current_op = name
        result = func(*args, **kwargs)
        trace.current_op = None
        trace.busy = True
        try:
            self._record(name, loc, result, args, kwargs, "loss" if loss else trace.phase)
        except Exception as error:  # a probe bug must never change what the user's step does
            trace.internal_error(name, error)
        finally:
            trace.busy = False
        return result

    # --- forward -------------------------------------------------------------------------------

    def _check(self, run: Callable[[], list[Violation]], loc: Location, op: str) -> None:
        self.trace.busy = True
        try:
            for violation in run():
                self.trace.add_contract(loc, op, violation)
        except Exception:  # a check must never break the user's step
            pass
        finally:
            self.trace.busy = False

    def _record(
        self, name: str, loc: Location, result: Any, args: tuple, kwargs: dict, phase: str
    ) -> None:
        outputs = tensors_in(result, self.max_outputs)
        if not outputs:
            return
        trace = self.trace
        for t in outputs:
            trace.observed_devices.setdefault(str(t.device), None)
        uninitialized = name in _UNINITIALIZED
        key = (name, loc.col, loc.end_col, tuple(tuple(t.shape) for t in outputs))
        entry = trace.lines.find(loc, key)
        if entry is None:
            summaries = [summary(t, uninitialized=uninitialized) for t in outputs]
            finite = [s.get("finite", True) for s in summaries]
            made = Entry(name, loc.col, loc.end_col, trace.module_path(), phase, summaries)
            made.setup = self._in_setup(sys._getframe(2))
            entry = trace.lines.add(loc, key, made)
        else:
            entry.count += 1
            finite = [True if uninitialized else is_finite(t) for t in outputs]
        inputs_finite = True
        if not all(finite):
            origin = self._nonfinite_output(name, loc, outputs, finite, args, kwargs, entry, phase)
            inputs_finite = origin == "op"
        if name in _DIFFERENCES:
            self._difference(name, loc, args, outputs[0])
        self._watch(outputs, loc, entry, inputs_finite)

    def _in_setup(self, frame: Any) -> bool:
        """Whether the library frames between this op and the user's line include a torch.nn
        method that builds, moves or serialises a model (once per new entry, not per call)."""
        user = self.trace.user
        while frame is not None and user.filename(frame.f_code) is None:
            code = frame.f_code
            if code.co_name in _SETUP_METHODS and code.co_filename.startswith(_TORCH_NN):
                return True
            frame = frame.f_back
        return False

    def _nonfinite_output(
        self,
        name: str,
        loc: Location,
        outputs: list[torch.Tensor],
        finite: list[bool],
        args: tuple,
        kwargs: dict,
        entry: Entry | None,
        phase: str,
    ) -> str:
        """Record the event; returns its origin ("op" when every input was finite)."""
        if entry is not None:
            entry.nonfinite_count += 1
        bad = outputs[finite.index(False)]
        sources: list[int] = []
        untracked = False
        for t in tensors_in((args, kwargs), 32):
            mark = self._nonfinite.get(id(t))
            if mark is not None and mark[0]() is t:
                sources.append(mark[1])
            elif not is_finite(t):
                untracked = True
        origin = "propagated" if sources or untracked else "op"
        info = summary(bad)
        has_nan = bool((info.get("nonfinite") or {}).get("nan"))
        mask_writer = name in _MASK_WRITERS and not has_nan
        if origin == "op" and mask_writer and _infinite_fill(args, kwargs):
            origin = "mask"
        elif sources and not untracked and all(self._is_mask(i) for i in sources):
            # Still a mask (scaled, added to, sliced), or a NaN made from one: a softmax over a
            # row with every position masked is a real bug born here.
            origin = "masked" if has_nan else "mask"
        event = self.trace.event(phase, loc, name, info, origin, sources)
        if event is None:
            return origin
        index = event.index
        for t, ok in zip(outputs, finite):  # noqa: B905 - equal lengths; runs on Python < 3.10
            if not ok:
                key = id(t)
                self._nonfinite[key] = (weakref.ref(t, lambda _, k=key: self._forget(k)), index)
        return origin

    def _forget(self, key: int) -> None:
        self._nonfinite.pop(key, None)

    def _is_mask(self, index: int) -> bool:
        items = self.trace.events.items
        return 0 <= index < len(items) and items[index].origin == "mask"

    def _difference(self, name: str, loc: Location, args: tuple, out: torch.Tensor) -> None:
        """Remember `[N,1] - [N]` differences; reported if they turn out to feed a loss."""
        tensors = [a for a in args[:2] if isinstance(a, torch.Tensor)]
        if len(tensors) != 2 or out.grad_fn is None:
            return
        a, b = tensors[0].shape, tensors[1].shape
        column_vs_vector = (len(a) == len(b) + 1 and a[-1] == 1 and a[:-1] == b) or (
            len(b) == len(a) + 1 and b[-1] == 1 and b[:-1] == a
        )
        if not column_vs_vector or (len(a) and a[0] == 1) or (len(b) and b[0] == 1):
            return
        first, second = ("right", "left") if "rsub" in name else ("left", "right")
        violation = broadcast_pair("difference", a, b, f"{first} operand", f"{second} operand")
        if violation is not None and len(self._suspects) < 64:
            self._suspects[id(out.grad_fn)] = (out.grad_fn, loc, violation)

    def _watch(
        self, outputs: list[torch.Tensor], loc: Location, entry: Entry | None, inputs_finite: bool
    ) -> None:
        """Hook the autograd nodes this op created, so backward can be attributed to `loc`."""
        nodes = self._nodes
        for out_index, t in enumerate(outputs):
            node = t.grad_fn
            if node is None or id(node) in nodes:
                continue
            pending = deque([node])
            walked = 0
            while pending and walked < _NODE_WALK:
                current = pending.popleft()
                if current is None or id(current) in nodes:
                    continue
                if type(current).__name__ == "AccumulateGrad":
                    continue
                nodes[id(current)] = (loc, entry)
                own = current is node and out_index == 0
                hook = self._backward_hook(loc, entry, own, current.name(), inputs_finite)
                current.register_hook(hook)
                walked += 1
                pending.extend(fn for fn, _ in current.next_functions)

    def _backward_hook(
        self, loc: Location, entry: Entry | None, own: bool, node_name: str, inputs_finite: bool
    ) -> Callable[..., None]:
        """A node hook: a non-finite gradient is an origin only if neither the incoming
        gradient nor the op's forward inputs were already non-finite."""
        trace = self.trace

        def hook(grad_inputs: tuple, grad_outputs: tuple) -> None:
            was_busy = trace.busy
            trace.busy = True
            try:
                if own and entry is not None and entry.grad is None:
                    arriving = next((g for g in grad_outputs if g is not None), None)
                    if arriving is not None:
                        entry.grad = summary(arriving)
                bad = next(
                    (g for g in grad_inputs if isinstance(g, torch.Tensor) and not is_finite(g)),
                    None,
                )
                if bad is not None:
                    upstream = any(
                        isinstance(g, torch.Tensor) and not is_finite(g) for g in grad_outputs
                    )
                    origin = "propagated" if upstream or not inputs_finite else "op"
                    module = entry.module if entry is not None else None
                    trace.event("backward", loc, node_name, summary(bad), origin, module=module)
            finally:
                trace.busy = was_busy

        return hook

    # --- backward ------------------------------------------------------------------------------

    def _backward(self, func: Callable[..., Any], args: tuple, kwargs: dict, loc: Location) -> Any:
        trace = self.trace
        trace.busy = True
        try:
            first = args[0] if args else kwargs.get("tensors", kwargs.get("outputs"))
            for root in tensors_in(first, 8):
                node = root.grad_fn
                if node is None:
                    continue
                known = self._nodes.get(id(node))
                if known is not None:
                    self._mark_loss(known[0], known[1])
                self._suspects_feeding(node)
            trace.backward_lines.setdefault(loc.key(), loc)
        finally:
            trace.busy = False
        if trace.before_backward is not None:
            trace.before_backward()  # may stop the run at its step bound
        trace.backward_calls += 1
        previous = trace.phase
        trace.phase = "backward"
        try:
            result = func(*args, **kwargs)
        finally:
            trace.phase = previous
            self._nodes.clear()
            self._suspects.clear()
        if trace.after_backward is not None:
            trace.busy = True
            try:
                trace.after_backward(first)
            finally:
                trace.busy = False
        return result

    def _mark_loss(self, loc: Location, entry: Entry | None) -> None:
        trace = self.trace
        if loc.key() in trace.loss_lines:
            return
        trace.loss_lines[loc.key()] = None
        trace.events.relabel(loc.key(), "forward", "loss")
        record = trace.lines.lines.get(loc.key())
        if record is not None:
            for item in record.entries.values():
                if item.phase == "forward":
                    item.phase = "loss"

    def _suspects_feeding(self, node: Any) -> None:
        if not self._suspects:
            return
        pending = deque([node])
        seen: set[int] = set()
        while pending and len(seen) < _SUSPECT_SEARCH:
            current = pending.popleft()
            if current is None or id(current) in seen:
                continue
            seen.add(id(current))
            suspect = self._suspects.get(id(current))
            if suspect is not None and suspect[0] is current:
                self.trace.add_contract(suspect[1], "difference", suspect[2])
            pending.extend(fn for fn, _ in current.next_functions)
