"""The tracer: a TorchFunctionMode that attributes every top-level torch call to a user line.

In: torch calls made while the mode is active (the mode is disabled inside its own handler, so
`F.cross_entropy` is one call, not its internals). Out: the shared `Trace` — per-line tensor
summaries, the first non-finite value per (line, op, phase) with origin vs propagated, loss
contract violations and broadcast differences feeding a loss. Backward work has no user frame,
so it is attributed through `Node.register_hook` closures created when the forward op ran.

Finiteness is judged in batches, not per op: a repeated op only queues its outputs (and a
backward node its gradients) with their version counters, and the queue is judged at once
(`stats.suspects`: a few reductions, one device->host transfer) before anything that could
change those values or needs the verdict: a call that writes into a queued tensor or into an
input of a queued op (in place, `out=`, `inplace=True`, a NumPy view), `backward()`, an
optimizer step, any other event, a full queue, the mode's exit. Only the items holding a suspect
are then judged one by one, in the order the ops ran, with the same rules as an op-by-op check,
so TL901 names the same first op, phase, line and origin. A value changed behind the probe's
back (its version moved although no traced call wrote it) is left unjudged rather than judged
by what it became. The first call of each (line, op, shapes) is summarised at once: that
summary is the line's hover. While the probe's own work, an optimizer step or a
DataLoader's fetching runs, the tracer is taken off the mode stack (`Trace.paused`).
"""

from __future__ import annotations

import contextlib
import inspect
import math
import os
import sys
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

try:  # the mode stack itself: popping the tracer for a stretch costs less than passing through
    from torch._C import (
        _get_function_stack_at,
        _len_torch_function_stack,
        _pop_torch_function_stack,
        _push_on_torch_function_stack,
    )
except ImportError:  # pragma: no cover - a torch without them: nothing is ever paused
    _len_torch_function_stack = None  # type: ignore[assignment]

from torchls_probe.attribution import Location, UserCode
from torchls_probe.contracts import LOSS_FUNCTIONS, Violation, broadcast_pair, check_loss
from torchls_probe.names import op_name
from torchls_probe.records import Entry, Event, Events, LineTable
from torchls_probe.stats import is_finite, summary, suspects, tensors_in, version_of

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
# The deferred queue is judged once it holds this many items or bytes: it keeps those tensors
# alive until then. On the CPU that costs more than it saves beyond a few MiB (memory a step
# would have reused is held, and the allocator hands fresh pages in), and a tensor of a MiB or
# more is judged at once: its sum costs more than the dispatch that batching saves. On an
# accelerator, memory is cached and each judgement is a device sync, so the queue runs longer.
_PENDING_ITEMS = 1024
_PENDING_BYTES = 64 << 20
_PENDING_BYTES_CPU = 16 << 20
_AT_ONCE_BYTES_CPU = 1 << 20
_FORWARD, _GRADIENT = 0, 1
# Calls that write into a tensor they were given (or hand out a way to write that bypasses
# version counters: a NumPy array, a DLPack capsule, a raw pointer). The queue is judged before
# one of them runs, so that a value is judged as its op produced it.
_WRITING_DUNDERS = {
    "__iadd__",
    "__isub__",
    "__imul__",
    "__itruediv__",
    "__ifloordiv__",
    "__imod__",
    "__ipow__",
    "__iand__",
    "__ior__",
    "__ixor__",
    "__ilshift__",
    "__irshift__",
    "__imatmul__",
    "__setitem__",
    "__delitem__",
    "__setstate__",
}
# Attributes whose assignment (`p.data = w`, a descriptor's `__set__`) writes a tensor's values;
# `p.grad = None` or `x.requires_grad = True` leave them as they are.
_WRITING_ATTRIBUTES = {"data", "real", "imag"}
_ESCAPES = {"numpy", "__array__", "__dlpack__", "data_ptr", "untyped_storage", "storage"}
_NOT_WRITING = {"requires_grad_", "retain_grad", "share_memory_"}
_ESCAPE = "escape"  # `_writes` of the calls in `_ESCAPES` and of `x.data = ...`
# `x.data`: an alias whose writes (`p.data.add_(...)`) do not move `x`'s version counter.
_DATA_GET = torch.Tensor.data.__get__
_FUNCS: dict[Any, tuple[str | None, Any, int]] = {}
# What a callable is, as bits of the third item of `_FUNCS` (one lookup per call, not four).
_IS_BACKWARD, _IS_LOSS, _IS_UNINITIALIZED, _IS_DIFFERENCE, _IS_SAFE = 1, 2, 4, 8, 16
_IS_SANITIZER = 32
# Ops that replace non-finite values by finite ones when the code asks them to
# (`torch.where(torch.isinf(x), 0, x)`, `nan_to_num`): a finite output made from a non-finite
# input that nothing else used is the code cleaning up, not a value that went wrong.
_SANITIZERS = {
    "torch.nan_to_num",
    "Tensor.nan_to_num",
    "torch.where",
    "Tensor.where",
    "Tensor.masked_fill",
    "torch.masked_fill",
}
# Ops whose output cannot hold a NaN or an infinity unless their first argument does (values
# moved, selected, clamped or squashed, never combined or scaled up): when that argument is
# a tensor judged finite and not written since, the output needs no judging of its own. On a
# CNN that is every ReLU and max-pool output, the largest tensors of the step.
_SAFE = {
    "F.relu",
    "torch.relu",
    "Tensor.relu",
    "F.relu6",
    "torch.sigmoid",
    "Tensor.sigmoid",
    "F.sigmoid",
    "torch.tanh",
    "Tensor.tanh",
    "F.tanh",
    "F.gelu",
    "F.silu",
    "F.softmax",
    "torch.softmax",
    "Tensor.softmax",
    "F.max_pool1d",
    "F.max_pool2d",
    "F.max_pool3d",
    "torch.max_pool1d",
    "torch.max_pool2d",
    "torch.max_pool3d",
    "F.adaptive_max_pool1d",
    "F.adaptive_max_pool2d",
    "torch.abs",
    "Tensor.abs",
    "torch.neg",
    "Tensor.neg",
    "Tensor.__neg__",
    "Tensor.view",
    "Tensor.view_as",
    "Tensor.reshape",
    "Tensor.reshape_as",
    "torch.reshape",
    "Tensor.flatten",
    "torch.flatten",
    "Tensor.permute",
    "torch.permute",
    "Tensor.transpose",
    "torch.transpose",
    "Tensor.t",
    "Tensor.contiguous",
    "Tensor.squeeze",
    "torch.squeeze",
    "Tensor.unsqueeze",
    "torch.unsqueeze",
    "Tensor.detach",
    "Tensor.clone",
    "torch.clone",
    "Tensor.expand",
    "Tensor.expand_as",
    "Tensor.__getitem__",
    "Tensor.narrow",
    "Tensor.select",
}
_KNOWN_LIMIT = 512  # tensors remembered as judged finite (weakly), cleared beyond
_COPIES_LIMIT = 65536  # `Trace.copied_from` entries kept
_COPY = torch.Tensor.copy_
_CURRENT: Any = object()  # `Trace.event(module=...)` default: the module running now
_UNSEEN: Any = object()


def _writes(func: Any) -> Any:
    """True if `func` always writes into an argument, the position of its `inplace` parameter
    (-1: keyword only) if it has one, else None."""
    name = getattr(func, "__name__", "") or ""
    if name == "__set__":  # a new `.data` is not seen by the version counter either
        attribute = getattr(getattr(func, "__self__", None), "__name__", "")
        return _ESCAPE if attribute in _WRITING_ATTRIBUTES else None
    if name in _ESCAPES:
        return _ESCAPE
    if name in _WRITING_DUNDERS:
        return True
    if name.endswith("_") and not name.endswith("__") and name not in _NOT_WRITING:
        return True
    try:
        parameters = inspect.signature(func).parameters
    except (TypeError, ValueError):  # most builtins have no signature; none of them has `inplace`
        return None
    if "inplace" not in parameters:
        return None
    names = list(parameters)
    kind = parameters["inplace"].kind
    if kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
        return names.index("inplace")
    return -1


def _describe(func: Any) -> tuple[str | None, Any, int]:
    """(op name or None, how it writes, `_IS_*` bits): computed once per callable."""
    name = op_name(func)
    kind = 0
    try:
        kind |= _IS_BACKWARD if func in _BACKWARD else 0
        kind |= _IS_LOSS if func in LOSS_FUNCTIONS else 0
    except TypeError:  # unhashable
        pass
    kind |= _IS_UNINITIALIZED if name in _UNINITIALIZED else 0
    kind |= _IS_DIFFERENCE if name in _DIFFERENCES else 0
    kind |= _IS_SAFE if name in _SAFE else 0
    kind |= _IS_SANITIZER if name in _SANITIZERS else 0
    info = (name, _writes(func), kind)
    with contextlib.suppress(TypeError):  # an unhashable callable: just don't cache it
        _FUNCS[func] = info
    return info


def _in_place(how: Any, args: tuple, kwargs: dict) -> bool:
    if how is True or how is _ESCAPE:
        return True
    if kwargs.get("inplace"):
        return True
    if how >= 0 and len(args) > how:
        flag = args[how]
        return isinstance(flag, bool | int) and bool(flag)
    return False


def _arguments(args: tuple, kwargs: dict) -> list[torch.Tensor] | None:
    """The tensors among a call's arguments, one list deep (`torch.cat([a, b])`); None when a
    deeper container might hold more, so that the caller assumes the worst."""
    found: list[torch.Tensor] = []
    for value in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, list | tuple):
            for inner in value:
                if isinstance(inner, torch.Tensor):
                    found.append(inner)
                elif isinstance(inner, list | tuple | dict):
                    return None
        elif isinstance(value, dict):
            return None
    return found


def _has_graph(t: torch.Tensor) -> bool:
    """Whether `t` has an autograd node. Asking a view made under `no_grad` and written in
    place there (`nn.init.orthogonal_` does `w.view_as(q).copy_(q)`) raises instead: such a
    view has no graph."""
    try:
        return t.grad_fn is not None
    except RuntimeError:
        return False


def _storage(t: torch.Tensor) -> int | None:
    """Which memory `t` lives in (views and `.data` aliases share it); None if unknown."""
    try:
        return t.untyped_storage().data_ptr()
    except Exception:  # a tensor without storage (a subclass, a functional wrapper)
        return None


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


class _Pause:
    """`with trace.paused():` takes the tracer off the mode stack while the probe's own torch
    work, the optimizer's step or a DataLoader's fetching runs (none of it is traced: every one
    of their calls would only be passed through, at a microsecond each), and puts it back
    where it was. Re-entrant; a no-op when the tracer is not the innermost mode."""

    def __init__(self) -> None:
        self.mode: TorchFunctionMode | None = None
        self._popped: list[bool] = []

    def __enter__(self) -> _Pause:
        mode = self.mode
        popped = False
        if mode is not None and _len_torch_function_stack is not None:
            depth = _len_torch_function_stack()
            if depth and _get_function_stack_at(depth - 1) is mode:
                _pop_torch_function_stack()
                popped = True
        self._popped.append(popped)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._popped and self._popped.pop():
            _push_on_torch_function_stack(self.mode)


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
        self.batches_without_grad = 0  # taken under `no_grad`/`inference_mode`
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
        # Memory written by `Tensor.copy_` -> the memory it was copied from (`data_ptr`s): a
        # target network is filled from the trained one (`target.load_state_dict(
        # online.state_dict())`, `t.data.copy_(p.data)`) and is updated that way, not by an
        # optimizer (see `Roots.not_in_optimizer`).
        self.copied_from: dict[int, int] = {}
        # Set by the tracer: judges what it deferred (see the module docstring).
        self._flush: Callable[[], None] | None = None
        self._pause = _Pause()

    def paused(self) -> _Pause:
        """A context in which torch calls bypass the tracer (see `_Pause`)."""
        return self._pause

    def flush(self) -> None:
        """Judge every deferred finiteness check now (before the weights change, say)."""
        if self._flush is not None:
            self._flush()

    def note_copy(self, target: Any, source: Any) -> None:
        if not isinstance(target, torch.Tensor) or not isinstance(source, torch.Tensor):
            return
        copied = self.copied_from
        if len(copied) >= _COPIES_LIMIT:
            return  # the copies that matter (model weights) come early and are few
        with contextlib.suppress(RuntimeError):  # a tensor without storage (a wrapper, meta)
            copied[target.data_ptr()] = source.data_ptr()

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
        module: str | None = _CURRENT,
    ) -> Event | None:
        if self._flush is not None:
            self._flush()  # what ran earlier must get the earlier events
        return self.events.add(
            Event(
                index=-1,
                phase=phase,
                origin=origin,
                location=loc,
                op=op,
                module=self.module_path() if module is _CURRENT else module,
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
        # (code, lasti) -> (location, line key): one `Location` per call site, built once.
        self._sites: dict[tuple[Any, int], tuple[Location, tuple[str, int]]] = {}
        self._devices: set[Any] = set()
        # Deferred finiteness checks, in the order the ops and backward nodes ran.
        self._pending: list[tuple[Any, ...]] = []
        self._pending_bytes = 0
        # `_storage` of the queued tensors, filled in only when an in-place call asks (those
        # are rarer than ops), up to `_memory_known` items of the queue.
        self._pending_memory: set[int | None] = set()
        self._memory_known = 0
        self._byte_cap = _PENDING_BYTES_CPU  # while only CPU tensors were seen
        self._at_once = _AT_ONCE_BYTES_CPU
        # id(tensor) -> (weak reference, version) of large tensors judged finite: the input of
        # a `_SAFE` op found here (same tensor, same version) makes its output finite too.
        self._known: dict[int, tuple[weakref.ref, int]] = {}
        self._flushing = False
        self._writing = False  # inside `_write_into_nonfinite`
        trace._flush = self.flush
        trace._pause.mode = self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        # Popped only if it is still on the stack: an optimizer step that raised leaves the
        # tracer paused (see `Trace.paused`), and the mode below it is not ours to pop.
        if _len_torch_function_stack is None:
            super().__exit__(exc_type, exc_value, traceback)
        else:
            depth = _len_torch_function_stack()
            if depth and _get_function_stack_at(depth - 1) is self:
                _pop_torch_function_stack()
        # The report is built from what is judged. When the run is already failing (out of
        # memory, say), a failure to judge is not the probe's error to report.
        self.flush(quiet=exc_type is not None)

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
        if func is _COPY and len(args) > 1:  # before the light trace of no-grad code skips it
            trace.note_copy(args[0], args[1])
        try:
            name, writes, kind = _FUNCS[func]
        except (KeyError, TypeError):
            name, writes, kind = _describe(func)
        if self._pending and (writes is not None or (kwargs and "out" in kwargs)):
            if self._overwrites(writes, args, kwargs):
                self.flush()  # judge queued values before this call overwrites one of them
        if writes is not None and self._nonfinite and args and not self._writing:
            target = args[0]
            mark = self._nonfinite.get(id(target)) if isinstance(target, torch.Tensor) else None
            if mark is not None and mark[0]() is target and _in_place(writes, args, kwargs):
                return self._write_into_nonfinite(func, types, args, kwargs, target, mark[1])
        if self._known and (writes is _ESCAPE or (name is None and func == _DATA_GET)):
            # Writes through these go unseen by version counters: forget what was judged.
            self._known.clear()
        if name is None:
            return func(*args, **kwargs)
        caller = frame = sys._getframe(1)
        user = trace.user
        known = user._by_code  # `UserCode.innermost`, inlined: it runs for every call
        while frame is not None:
            verdict = known.get(frame.f_code, _UNSEEN)
            if verdict is _UNSEEN:
                verdict = user.filename(frame.f_code)
            if verdict is not None:
                break
            frame = frame.f_back
        else:
            return func(*args, **kwargs)
        if not kind & _IS_BACKWARD and not torch.is_grad_enabled():
            # Light trace for code that builds no graph (evaluation, sampling, logging between
            # steps): each op of a line is traced on its first calls only, so generating 500
            # tokens after every step costs little more than a plain run.
            key = (frame.f_code, frame.f_lineno, name)
            seen = self._no_grad_calls.get(key, 0)
            if seen >= LIGHT_REPEATS:
                return func(*args, **kwargs)
            self._no_grad_calls[key] = seen + 1
        where = (frame.f_code, frame.f_lasti)
        site = self._sites.get(where)
        if site is None:
            loc = trace.user.location(frame)
            site = self._sites[where] = (loc, loc.key())
        loc = site[0]
        if kind & _IS_BACKWARD:
            return self._backward(func, args, kwargs, loc)
        if kind & _IS_LOSS:
            self._check(lambda: check_loss(func, args, kwargs), loc, name)
        if kind & _IS_SAFE and self._known and args:
            # Asked before the call: an in-place ReLU moves its input's version.
            first = args[0]
            mark = self._known.get(id(first))
            if mark is None or mark[0]() is not first or mark[1] != version_of(first):
                kind &= ~_IS_SAFE
        else:
            kind &= ~_IS_SAFE
        trace.current_op = name
        result = func(*args, **kwargs)
        trace.current_op = None
        trace.busy = True
        try:
            phase = "loss" if kind & _IS_LOSS else trace.phase
            if kind & _IS_SANITIZER and self._nonfinite:
                self._sanitized(args, kwargs, result)
            self._record(name, kind, loc, site[1], result, args, kwargs, phase, caller)
        except Exception as error:  # a probe bug must never change what the user's step does
            trace.internal_error(name, error)
        finally:
            trace.busy = False
        return result

    # --- values the code cleans up -------------------------------------------------------------

    def _write_into_nonfinite(
        self, func: Any, types: Any, args: tuple, kwargs: dict, target: torch.Tensor, index: int
    ) -> Any:
        """An in-place write into a tensor holding the non-finite value of event `index`
        (`x[x == float("inf")] = 0` after `x = 1 / degree`): traced as usual, and when the
        tensor is finite afterwards, the code has cleaned the value up."""
        self._writing = True
        try:
            result = self.__torch_function__(func, types, args, kwargs)
        finally:
            self._writing = False
        trace = self.trace
        was_busy, trace.busy = trace.busy, True
        try:
            if is_finite(target):
                self._forget(id(target))
                self._clean(index)
        except Exception as error:  # a probe bug must never change what the user's step does
            trace.internal_error("a write into a non-finite tensor", error)
        finally:
            trace.busy = was_busy
        return result

    def _sanitized(self, args: tuple, kwargs: dict, result: Any) -> None:
        """A sanitizer made a finite output from non-finite inputs the probe tracks."""
        found = []
        for t in tensors_in((args, kwargs), 8):
            mark = self._nonfinite.get(id(t))
            if mark is not None and mark[0]() is t:
                found.append(mark[1])
        if found and isinstance(result, torch.Tensor) and is_finite(result):
            for index in found:
                self._clean(index)

    def _clean(self, index: int) -> None:
        """Event `index` (input or forward phase) was cleaned up before any other use: it and
        the events it came from whose values are gone and went nowhere else become `cleaned`,
        listed but never a finding. A value still alive (a sanitizer only read it) may be used
        later; such a use takes the verdict back (`_unclean`)."""
        items = self.trace.events.items
        if not 0 <= index < len(items):
            return
        event = items[index]
        if event.phase not in ("input", "forward") or event.origin not in ("op", "propagated"):
            return
        if any(index in other.sources for other in items):
            return  # something else was already made from it
        event.uncleaned, event.origin = event.origin, "cleaned"
        for source in event.sources:
            if not 0 <= source < len(items) or self._tracked(source):
                continue  # its value lives on and may be used again
            children = [other for other in items if source in other.sources]
            if all(child.origin == "cleaned" for child in children):
                parent = items[source]
                if parent.phase in ("input", "forward") and parent.origin in ("op", "propagated"):
                    parent.uncleaned, parent.origin = parent.origin, "cleaned"

    def _tracked(self, index: int) -> bool:
        return any(mark[1] == index and mark[0]() is not None for mark in self._nonfinite.values())

    def _unclean(self, index: int) -> None:
        """A value judged cleaned up was used after all: its event and those it came from get
        their origin back."""
        items = self.trace.events.items
        todo = [index]
        while todo:
            current = todo.pop()
            if 0 <= current < len(items) and items[current].origin == "cleaned":
                event = items[current]
                event.origin, event.uncleaned = event.uncleaned or "op", ""
                todo.extend(event.sources)

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
        self,
        name: str,
        kind: int,
        loc: Location,
        line_key: tuple[str, int],
        result: Any,
        args: tuple,
        kwargs: dict,
        phase: str,
        caller: Any,
    ) -> None:
        # Every op of every step comes here: the one-tensor case (nearly all of them) avoids
        # loops and comprehensions.
        trace = self.trace
        if isinstance(result, torch.Tensor):
            outputs = [result]
            key = (name, loc.col, loc.end_col, (result.shape,))
            device = result.device
            if device not in self._devices:
                self._note_devices(outputs)
            try:
                graph = result.grad_fn is not None
            except RuntimeError:  # see `_has_graph`
                graph = False
        else:
            outputs = tensors_in(result, self.max_outputs)
            if not outputs:
                return
            key = (name, loc.col, loc.end_col, tuple(t.shape for t in outputs))
            self._note_devices(outputs)
            graph = any(_has_graph(t) for t in outputs)
        lines = trace.lines
        record = lines.lines.get(line_key)
        entry = record.entries.get(key) if record is not None else None
        cell = [True]  # whether every input was finite, for the backward hooks of this op
        if entry is not None:
            entry.count += 1
            if kind & _IS_SAFE:  # its input was judged finite: so is this
                self._remember(outputs)
            elif not kind & _IS_UNINITIALIZED:
                self._defer(outputs, args, kwargs, name, loc, entry, phase, cell)
        elif lines.room(loc):
            # The first time this (line, op, shapes) runs: its summary is taken now (it is the
            # entry's shape, dtype and range) and says whether it is finite.
            uninitialized = bool(kind & _IS_UNINITIALIZED)
            summaries = [summary(t, uninitialized=uninitialized) for t in outputs]
            made = Entry(name, loc.col, loc.end_col, trace.module_path(), phase, summaries)
            made.setup = self._in_setup(caller)
            entry = lines.add(loc, key, made)
            finite = [item.get("finite", True) for item in summaries]
            if not all(finite):
                self.flush()  # earlier ops' values first: event order is the order they ran
                origin = self._nonfinite_output(
                    name, loc, outputs, finite, args, kwargs, entry, phase, _CURRENT
                )
                cell[0] = origin == "op"
        elif not kind & _IS_UNINITIALIZED:  # a line or entry over the caps: still judged
            self._defer(outputs, args, kwargs, name, loc, None, phase, cell)
        if kind & _IS_DIFFERENCE:
            self._difference(name, loc, args, outputs[0])
        if graph:
            self._watch(outputs, loc, entry, cell)

    def _remember(self, tensors: list[torch.Tensor]) -> None:
        """Note large tensors now known to be finite (see `_known`)."""
        known = self._known
        for t in tensors:
            if t.nbytes >= self._at_once and t.is_floating_point():
                version = version_of(t)
                if version < 0:
                    continue  # no version counter: a later in-place write would go unseen
                if len(known) >= _KNOWN_LIMIT:
                    known.clear()
                known[id(t)] = (weakref.ref(t), version)

    def _note_devices(self, outputs: list[torch.Tensor]) -> None:
        for t in outputs:
            device = t.device
            if device not in self._devices:
                self._devices.add(device)
                self.trace.observed_devices.setdefault(str(device), None)
                if device.type not in ("cpu", "meta"):
                    self._byte_cap, self._at_once = _PENDING_BYTES, _PENDING_BYTES

    def _defer(
        self,
        outputs: list[torch.Tensor],
        args: tuple,
        kwargs: dict,
        name: str,
        loc: Location,
        entry: Entry | None,
        phase: str,
        cell: list[bool],
    ) -> None:
        """Queue an op's outputs (with their versions) to be judged at the next flush."""
        trace = self.trace
        module = trace.module_path() if trace.module_stack else None
        if len(outputs) == 1:
            try:
                versions = [outputs[0]._version]
            except RuntimeError:  # made under inference mode: see `version_of`
                versions = [-1]
            size = outputs[0].nbytes
        else:
            versions = [version_of(t) for t in outputs]
            size = sum(t.nbytes for t in outputs)
        self._pending_bytes += size
        pending = self._pending
        pending.append(
            (_FORWARD, outputs, versions, args, kwargs, name, loc, entry, phase, module, cell)
        )
        if (
            size >= self._at_once
            or self._pending_bytes >= self._byte_cap
            or len(pending) >= _PENDING_ITEMS
        ):
            self.flush()

    def _overwrites(self, writes: Any, args: tuple, kwargs: dict) -> bool:
        """Whether this call may write into the memory of a queued tensor or of an input of a
        queued op (or a view of one): only then must the queue be judged first, since judging
        an op that made a non-finite value asks whether its inputs already were. Unknown
        targets count as queued."""
        targets: list[Any] = []
        out = kwargs.get("out") if kwargs else None
        if out is not None:
            targets.extend(tensors_in(out, 16) or [None])
        if writes is not None and _in_place(writes, args, kwargs):
            first = args[0] if args else None
            if isinstance(first, torch.Tensor):
                targets.append(first)
            elif isinstance(first, list | tuple) and first:
                targets.extend(t if isinstance(t, torch.Tensor) else None for t in first)
            else:
                targets.append(None)
        memory = self._pending_memory
        pending = self._pending
        for item in pending[self._memory_known :]:
            if item[0] == _FORWARD:
                inputs = _arguments(item[3], item[4])
                if inputs is None:
                    memory.add(None)  # inputs not known: any write must judge the queue first
                    inputs = []
                tensors = [*item[1], *inputs]
            else:
                tensors = [g for g in (*item[1], *item[3]) if g is not None]
            for t in tensors:
                memory.add(_storage(t))
        self._memory_known = len(pending)
        if None in memory:
            return True
        for target in targets:
            if target is None:
                return True
            key = _storage(target)
            if key is None or key in memory:
                return True
        return False

    def flush(self, quiet: bool = False) -> None:
        """Judge the queued outputs and gradients: at once when all are finite (the usual
        case), else item by item in the order they were produced, as an op-by-op check would."""
        if self._flushing or not self._pending:
            return
        trace = self.trace
        items, self._pending, self._pending_bytes = self._pending, [], 0
        self._pending_memory, self._memory_known = set(), 0
        self._flushing = True
        was_busy, trace.busy = trace.busy, True
        try:
            current: list[torch.Tensor] = []
            for item in items:
                if item[0] == _FORWARD:
                    current.extend(
                        t
                        for t, version in zip(item[1], item[2])  # noqa: B905 - equal lengths
                        if version_of(t) == version
                    )
                else:
                    current.extend(g for g in item[1] if isinstance(g, torch.Tensor))
            found = suspects(current)
            if not found:
                self._remember(current)
            else:
                # Only the items holding a suspect are judged one by one (a -inf mask written
                # on every step must not make the whole step's queue be asked again).
                doubtful = {id(current[i]) for i in found}
                for item in items:
                    if not any(id(t) in doubtful for t in item[1]):
                        continue
                    if item[0] == _FORWARD:
                        self._judge_outputs(*item[1:])
                    else:
                        self._judge_gradients(*item[1:])
        except Exception as error:  # a probe bug must never change what the user's step does
            if not quiet:
                trace.internal_error("deferred finiteness checks", error)
        finally:
            trace.busy = was_busy
            self._flushing = False

    def _judge_outputs(
        self,
        outputs: list[torch.Tensor],
        versions: list[int],
        args: tuple,
        kwargs: dict,
        name: str,
        loc: Location,
        entry: Entry | None,
        phase: str,
        module: str | None,
        cell: list[bool],
    ) -> None:
        finite = [
            version_of(t) != version or is_finite(t)
            for t, version in zip(outputs, versions)  # noqa: B905 - equal lengths
        ]
        if not all(finite):
            origin = self._nonfinite_output(
                name, loc, outputs, finite, args, kwargs, entry, phase, module
            )
            cell[0] = origin == "op"

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
        module: Any,
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
        items = self.trace.events.items
        for source in sources:
            if 0 <= source < len(items) and items[source].origin == "cleaned":
                self._unclean(source)
        # The full summary (counts and range) only for an event not recorded yet: a mask
        # written on every step is recorded once, and its later steps need only know whether
        # it holds a NaN.
        events = self.trace.events
        info = None if events.known(loc, name, phase) else summary(bad)
        nan: list[bool] = []

        def has_nan() -> bool:
            if not nan:
                if info is not None:
                    nan.append(bool((info.get("nonfinite") or {}).get("nan")))
                else:
                    nan.append(bool(torch.isnan(bad.detach()).any()))
            return nan[0]

        if (
            origin == "op"
            and name in _MASK_WRITERS
            and not has_nan()
            and _infinite_fill(args, kwargs)
        ):
            origin = "mask"
        elif sources and not untracked and all(self._is_mask(i) for i in sources):
            # Still a mask (scaled, added to, sliced), or a NaN made from one: a softmax over a
            # row with every position masked is a real bug born here.
            origin = "masked" if has_nan() else "mask"
        event = self.trace.event(phase, loc, name, info, origin, sources, module=module)
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
        self, outputs: list[torch.Tensor], loc: Location, entry: Entry | None, cell: list[bool]
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
                hook = self._backward_hook(loc, entry, own, current.name(), cell)
                current.register_hook(hook)
                walked += 1
                pending.extend(fn for fn, _ in current.next_functions)

    def _backward_hook(
        self, loc: Location, entry: Entry | None, own: bool, node_name: str, cell: list[bool]
    ) -> Callable[..., None]:
        """A node hook: its gradients join the deferred queue. A non-finite gradient is an
        origin only if neither the incoming gradient nor the op's forward inputs (`cell`,
        judged before the backward began) were already non-finite."""
        trace = self.trace

        def hook(grad_inputs: tuple, grad_outputs: tuple) -> None:
            if own and entry is not None and entry.grad is None:
                arriving = next((g for g in grad_outputs if g is not None), None)
                if arriving is not None:
                    was_busy, trace.busy = trace.busy, True
                    try:
                        entry.grad = summary(arriving)
                    finally:
                        trace.busy = was_busy
            module = entry.module if entry is not None else None
            if module is None and trace.module_stack:
                module = trace.module_path()
            # Gradients need no version: nothing traced runs before the end of this backward,
            # and autograd only accumulates in place into a buffer nobody else holds.
            pending = self._pending
            pending.append(
                (_GRADIENT, grad_inputs, None, grad_outputs, loc, node_name, module, cell)
            )
            size = 0
            for g in grad_inputs:
                if g is not None:
                    size += g.nbytes
            self._pending_bytes += size
            if (
                size >= self._at_once
                or self._pending_bytes >= self._byte_cap
                or len(pending) >= _PENDING_ITEMS
            ):
                self.flush()

        return hook

    def _judge_gradients(
        self,
        grad_inputs: tuple,
        _versions: None,
        grad_outputs: tuple,
        loc: Location,
        node_name: str,
        module: str | None,
        cell: list[bool],
    ) -> None:
        bad = next(
            (g for g in grad_inputs if isinstance(g, torch.Tensor) and not is_finite(g)), None
        )
        if bad is None:
            return
        upstream = any(isinstance(g, torch.Tensor) and not is_finite(g) for g in grad_outputs)
        origin = "propagated" if upstream or not cell[0] else "op"
        self.trace.event("backward", loc, node_name, summary(bad), origin, module=module)

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
                    if known[0].key() not in trace.loss_lines:
                        # The loss line's events are relabelled once: its values first.
                        self.flush()
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
            self.flush()  # the forward's outputs, then the gradients this backward queued
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
