"""The global hooks around the tracer: modules, optimizers, DataLoaders and warnings.

In: a `Trace`, the step/batch bounds and a progress channel. Out: module paths and root models
(global forward hooks), the `step` phase, parameter checks and the step bound (global optimizer
hooks), the batch bound and input checks (a counting wrapper on `DataLoader.__iter__`), and
Python/torch warnings placed on the innermost user line. `install()` returns an undo function.

Loops written by hand (`p.data.add_(-lr * p.grad)`, no optimizer anywhere) are bounded at
`backward()`: once no optimizer was ever made, the run stops at the first backward after the
step bound, and which parameters got a gradient is judged right after each complete backward
(never at the stop, which may come just after a `zero_grad`). Each step also feeds the
divergence watch (`Divergence`): the loss at every backward, the gradient norm and the size of
the update against the weights at every optimizer step.

These run at every step, so they cost as little as the figures allow: the optimizer's step,
a DataLoader's fetching and the hooks' own torch work run with the tracer off the mode stack
(`Trace.paused`), finiteness is asked of whole lists at once (`stats.all_finite`), parameter
figures use batched `_foreach_*` reductions, and the spread of large activations and the
update of large parameters are measured on fixed strided samples.
"""

from __future__ import annotations

import math
import time
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils.data import DataLoader

from torchls_probe.bounds import ProbeStop
from torchls_probe.params import Roots
from torchls_probe.progress import Progress
from torchls_probe.records import Entry
from torchls_probe.stats import all_finite, is_finite, summary, tensors_in, version_of
from torchls_probe.tracer import Trace


class Hooks:
    def __init__(
        self, trace: Trace, roots: Roots, steps: int, batches: int, progress: Progress
    ) -> None:
        self.trace = trace
        self.roots = roots
        self.steps = steps
        self.batches = batches
        self.progress = progress
        self.autocast: dict[str, None] = {}
        self._params_checked: set[int] = set()
        self._grads_finite = True
        self.optimizers_made = 0
        self.divergence = Divergence()
        self.activations = Activations()
        self.got_grad = roots.got_grad  # parameters a complete backward reached
        # --compare: keep (baseline) or restore (candidate) each root model's first weights.
        self.initial_save: str | None = None
        self.initial_load: str | None = None
        self._initial: list[dict[str, torch.Tensor]] = []
        self._loaded: list[dict[str, torch.Tensor]] | None = None
        self.initial_matched = {"models": 0, "tensors": 0, "matched": 0}

    def install(self) -> Callable[[], None]:
        handles = [
            register_module_forward_pre_hook(self._module_pre),
            register_module_forward_hook(self._module_post, always_call=True),
            register_optimizer_step_pre_hook(self._step_pre),
            register_optimizer_step_post_hook(self._step_post),
        ]
        original_iter = DataLoader.__iter__
        original_init = torch.optim.Optimizer.__init__
        hooks = self

        def counting_init(optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
            original_init(optimizer, *args, **kwargs)
            hooks.optimizer_made(optimizer)

        torch.optim.Optimizer.__init__ = counting_init  # type: ignore[method-assign]
        self.trace.before_backward = self._backward_pre
        self.trace.after_backward = self._backward_post

        def counting_iter(loader: DataLoader) -> Any:
            return _CountingIterator(original_iter(loader), hooks)

        DataLoader.__iter__ = counting_iter  # type: ignore[method-assign]
        original_show = warnings.showwarning
        catcher = warnings.catch_warnings()
        catcher.__enter__()
        # Python's own filters stay: what it hides by default (ResourceWarning, deprecations
        # raised inside libraries) stays hidden, as in a plain run of the script.
        warnings.showwarning = self._show_warning

        def undo() -> None:
            catcher.__exit__(None, None, None)
            warnings.showwarning = original_show
            DataLoader.__iter__ = original_iter  # type: ignore[method-assign]
            torch.optim.Optimizer.__init__ = original_init  # type: ignore[method-assign]
            self.trace.before_backward = self.trace.after_backward = None
            for handle in handles:
                handle.remove()

        return undo

    # --- modules -------------------------------------------------------------------------------

    def _module_pre(self, module: torch.nn.Module, args: Any) -> None:
        trace = self.trace
        if trace.busy or trace.in_step:
            return
        if not trace.module_stack:
            trace.busy = True
            try:
                self._root_call(module, args)
            finally:
                trace.busy = False
        trace.module_stack.append(module)

    def _root_call(self, module: torch.nn.Module, args: Any) -> None:
        trace = self.trace
        where = trace.user.here()
        if id(module) not in trace.module_names:
            root = type(module).__name__
            for name, sub in module.named_modules():
                trace.module_names.setdefault(id(sub), f"{root}.{name}" if name else root)
        if self.roots.add_model(module, where):
            self._same_start(module)
            self._check_parameters(module, where)
        self._note_autocast()

    def _same_start(self, module: torch.nn.Module) -> None:
        """Both sides of a comparison start from the same weights: the baseline writes each
        root model's state at its first call, the candidate copies every tensor that matches
        by name and shape into its own model (in place: optimizers keep their parameters)."""
        if self.initial_save is not None:
            self._initial.append({k: v.detach().clone() for k, v in module.state_dict().items()})
            torch.save(self._initial, self.initial_save)
            return
        if self.initial_load is None:
            return
        if self._loaded is None:
            try:
                self._loaded = torch.load(self.initial_load, weights_only=True)
            except Exception:
                self._loaded = []
        index = self.initial_matched["models"]
        self.initial_matched["models"] += 1
        if index >= len(self._loaded):
            return
        saved = self._loaded[index]
        with torch.no_grad():
            for name, tensor in module.state_dict().items():
                self.initial_matched["tensors"] += 1
                other = saved.get(name)
                fits = other is not None and other.shape == tensor.shape
                if fits and other.dtype == tensor.dtype:
                    tensor.copy_(other)
                    self.initial_matched["matched"] += 1

    def _check_parameters(self, module: torch.nn.Module, where: Any) -> None:
        """A model that already holds NaN/Inf (a bad checkpoint) is an `input` problem."""
        if where is None:
            return
        for name, param in module.named_parameters():
            if not is_finite(param):
                detail = f"{type(module).__name__}.{name}"
                self.trace.event("input", where, "parameter", summary(param), "op", detail=detail)
                return

    def _note_autocast(self) -> None:
        for device_type in ("cpu", "cuda", "mps"):
            try:
                if torch.is_autocast_enabled(device_type):
                    dtype = torch.get_autocast_dtype(device_type)
                    self.autocast.setdefault(f"{device_type}:{str(dtype).replace('torch.', '')}")
            except (RuntimeError, TypeError, AttributeError):
                continue

    def _module_post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        trace = self.trace
        if trace.busy or trace.in_step:
            return
        stack = trace.module_stack
        if stack and stack[-1] is module:
            stack.pop()
        elif any(m is module for m in stack):
            while stack and stack.pop() is not module:
                pass
        name = trace.module_names.get(id(module))
        if name is not None and trace.steps < TRACKED_STEPS:
            trace.busy = True
            try:
                with trace.paused():
                    self.activations.add(name, type(module).__name__, output, trace.steps)
            except Exception as error:  # a probe bug must never break the user's forward
                trace.internal_error(f"{name} activations", error)
            finally:
                trace.busy = False
        forward = getattr(type(module), "forward", None)
        code = getattr(forward, "__code__", None)
        if code is None or trace.user.filename(code) is None:
            return  # a library module: its ops were already recorded on the calling line
        trace.busy = True
        try:
            with trace.paused():
                self._record_module_output(module, output)
        except Exception as error:  # as above
            trace.internal_error(f"{type(module).__name__}.forward output", error)
        finally:
            trace.busy = False

    def _record_module_output(self, module: torch.nn.Module, output: Any) -> None:
        """A user module's own lines hold its ops; its call line gets the output."""
        trace = self.trace
        where = trace.user.here()
        outputs = tensors_in(output, 4)
        if where is None or not outputs:
            return
        name = f"{type(module).__name__}.forward"
        key = (name, where.col, where.end_col, tuple(tuple(t.shape) for t in outputs))
        entry = trace.lines.find(where, key)
        if entry is not None:
            entry.count += 1
            return
        path = trace.module_names.get(id(module), type(module).__name__)
        summaries = [summary(t) for t in outputs]
        trace.lines.add(
            where, key, Entry(name, where.col, where.end_col, path, trace.phase, summaries)
        )

    # --- backward (loops without an optimizer) ------------------------------------------------

    def _backward_pre(self) -> None:
        if self.optimizers_made == 0 and self.trace.backward_calls >= self.steps:
            raise ProbeStop("backwards")

    def _backward_post(self, roots_of_backward: Any) -> None:
        loss = next(iter(tensors_in(roots_of_backward, 1)), None)
        if loss is not None and loss.numel() == 1:
            self.divergence.loss(float(loss.detach()), self.trace.user.here(), self.trace.steps)
        got = self.got_grad
        for model in self.roots.models:  # ids only: no names built on every backward
            for param in model.parameters():
                if param.grad is not None:
                    got.add(id(param))

    # --- optimizers ----------------------------------------------------------------------------

    def optimizer_made(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizers_made += 1
        self.roots.optimizer_made(optimizer)
        trace = self.trace
        was_busy, trace.busy = trace.busy, True
        try:
            self.divergence.made(optimizer, trace.user.here())
        finally:
            trace.busy = was_busy

    def _step_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        trace = self.trace
        trace.busy = True
        # Paused from here to the end of `_step_post`: the optimizer's own calls are not
        # traced, and passing each of them through the tracer would cost a microsecond each.
        trace.paused().__enter__()
        try:
            trace.flush()  # the step writes the weights: what the tracer deferred is judged first
            where = trace.user.here()
            self.roots.add_optimizer(optimizer, where)
            self.roots.check_gradients(optimizer)
            tracked = trace.steps < TRACKED_STEPS
            if tracked:  # only these steps' figures are named
                names = {id(p): n for n, p, _ in self.roots.named_parameters()}
                self.divergence.before_step(optimizer, trace.steps, names)
            grads = [p.grad for group in optimizer.param_groups for p in group["params"]]
            known = tracked and self.divergence.grads_finite
            self._grads_finite = known or all_finite([g for g in grads if g is not None])
        except BaseException:
            trace.paused().__exit__(None, None, None)
            raise
        finally:
            trace.busy = False
        trace.in_step = True
        trace.phase = "step"

    def _step_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        trace = self.trace
        trace.in_step = False
        trace.phase = "forward"
        trace.busy = True
        try:
            trace.steps += 1
            trace.last_step_at = time.monotonic()
            trace.backward_at_last_step = trace.backward_calls
            where = trace.user.here()
            if where is not None:
                self._check_updated(optimizer, where)
            self.divergence.after_step(optimizer)
        finally:
            trace.busy = False
            trace.paused().__exit__(None, None, None)
        self.progress.emit(
            "step", f"step {trace.steps} of {self.steps}", step=trace.steps, total=self.steps
        )
        if trace.steps >= self.steps:
            raise ProbeStop("steps")

    def _check_updated(self, optimizer: torch.optim.Optimizer, where: Any) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if all_finite(params):  # the usual answer, for all the weights at once
            return
        names = {id(p): n for n, p, _ in self.roots.named_parameters()}
        for group in optimizer.param_groups:
            for param in group["params"]:
                if not is_finite(param):
                    origin = "op" if self._grads_finite else "propagated"
                    detail = names.get(id(param), f"parameter {tuple(param.shape)}")
                    self.trace.event(
                        "step", where, "optimizer.step", summary(param), origin, detail=detail
                    )
                    return

    # --- data ----------------------------------------------------------------------------------

    def next_batch(self) -> None:
        """Called before each batch is fetched: stop once the batch bound is reached."""
        if self.trace.batches >= self.batches:
            raise ProbeStop("batches")

    def got_batch(self, batch: Any) -> None:
        trace = self.trace
        trace.batches += 1
        if not torch.is_grad_enabled():
            trace.batches_without_grad += 1  # an evaluation pass (see `_note_short_of_steps`)
        trace.busy = True
        try:
            tensors = tensors_in(batch, 16)
            if all_finite(tensors):
                return
            for t in tensors:
                if not is_finite(t):
                    where = trace.user.here()
                    if where is not None:
                        trace.event("input", where, "DataLoader batch", summary(t), "op")
                    break
        finally:
            trace.busy = False

    # --- warnings ------------------------------------------------------------------------------

    def _show_warning(
        self,
        message: Any,
        category: type,
        filename: str,
        lineno: int,
        file: Any = None,
        line: Any = None,
    ) -> None:
        where = self.trace.user.here()
        self.trace.add_warning(where, category.__name__, str(message))


# Above these, a bounded run is diverging: a sound step changes the weights by about the
# learning rate (1e-5..1e-1 of them) and does not multiply the loss or the gradients by 100.
LOSS_GROWTH = 100.0
GRAD_GROWTH = 1000.0
UPDATE_RATIO = 1.0
CLONE_LIMIT = 256 << 20  # weights copied to measure an update: beyond this, not measured
TRACKED_STEPS = 8  # steps whose per-parameter and per-module figures are recorded
SAMPLE = 1 << 13  # activation elements the spread and the zero fraction are measured on
# Weights copied per large parameter to measure its update: a fixed, evenly strided sample.
# ||update|| is the sample's norm scaled by sqrt(size / sample) (0.5% off for 16k values):
# copying, subtracting and measuring every weight costs about a third of an Adam step.
UPDATE_SAMPLE = 1 << 14


def _stride(count: int, sample: int = SAMPLE) -> int:
    """The smallest prime stride that takes at most about `sample` of `count` elements."""
    stride = max(2, -(-count // sample))
    while any(stride % d == 0 for d in range(2, math.isqrt(stride) + 1)):
        stride += 1
    return stride


def _watched(param: torch.Tensor) -> torch.Tensor:
    """The weights of `param` whose change is measured: all of them, or a strided sample of a
    large contiguous tensor (the same positions at every step)."""
    weights = param.detach()
    count = weights.numel()
    if count <= 4 * UPDATE_SAMPLE or not weights.is_contiguous():
        return weights
    return weights.view(-1)[:: _stride(count, UPDATE_SAMPLE)]


def _norms(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The 2-norm of each tensor (0-d, fp32 or wider), in order, with one `_foreach_norm` call
    per kind instead of a few dispatches per tensor: a model has hundreds of parameters.
    Half-precision tensors are measured in fp32, as `t.float().norm()` would, so that a norm
    above 65504 does not overflow."""
    wide = [i for i, t in enumerate(tensors) if t.dtype in (torch.float32, torch.float64)]
    if len(wide) == len(tensors):
        return list(torch._foreach_norm(tensors)) if tensors else []
    found: list[Any] = [None] * len(tensors)
    for i, norm in zip(wide, torch._foreach_norm([tensors[i] for i in wide])):  # noqa: B905
        found[i] = norm
    narrow = [i for i in range(len(tensors)) if found[i] is None]
    narrow_norms = [tensors[i].float().norm() for i in narrow]
    for i, norm in zip(narrow, narrow_norms):  # noqa: B905 - equal lengths
        found[i] = norm
    return found


@dataclass
class Divergence:
    """The loss per backward, the gradient norm and update/weight ratio per optimizer step."""

    losses: list[tuple[float, Any, int]] = field(default_factory=list)  # value, where, step
    grad_norms: list[tuple[int, float]] = field(default_factory=list)  # step, norm
    updates: list[tuple[int, float, float]] = field(default_factory=list)  # step, ratio, lr
    made_at: dict[int, Any] = field(default_factory=dict)  # id(optimizer) -> construction line
    # The first step's gradient and update norm per named parameter (for --compare).
    layers: dict[str, dict[str, float]] = field(default_factory=dict)
    # Every step's figures per named parameter, in model order (the gradient-flow chart).
    per_step: list[dict[str, Any]] = field(default_factory=list)
    _first_step: int = -1
    _names: dict[int, str] = field(default_factory=dict)
    _before: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    _weights: list[torch.Tensor] = field(default_factory=list)  # norms of `_before`'s weights
    _grad_norms: Any = None  # their gradients' norms and largest |value|, before the step
    _grad_max: Any = None
    _scale: Any = None  # sqrt(size / sample) of each parameter's watched weights
    grads_finite: bool = False  # known at the last `before_step`: every gradient was finite
    # The parameters' watched weights and the buffers they are copied into before each tracked
    # step (see `_plan`). Kept between steps: a fresh copy of every weight at every step costs
    # more in page faults than in copying (the allocator hands large blocks back when freed).
    _copies: dict[tuple[Any, ...], tuple[list[Any], list[Any], Any]] = field(default_factory=dict)
    _parts: list[torch.Tensor] = field(default_factory=list)  # the watched weights
    _step: int = 0
    _optimizer: int = 0

    def made(self, optimizer: torch.optim.Optimizer, where: Any) -> None:
        if where is not None:
            self.made_at.setdefault(id(optimizer), where)

    def loss(self, value: float, where: Any, step: int) -> None:
        if len(self.losses) < 64:  # non-finite ones too: a comparison shows where they were
            self.losses.append((value, where, step))

    def _params(self, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
        groups = optimizer.param_groups
        return [p for group in groups for p in group["params"] if p.grad is not None]

    def before_step(
        self, optimizer: torch.optim.Optimizer, step: int, names: dict[int, str] | None = None
    ) -> None:
        self._before = []
        self._names = names or {}
        self.grads_finite = False
        if step >= TRACKED_STEPS:  # a repro is a few steps; past these, measuring costs time
            self._copies.clear()
            return
        params = self._params(optimizer)
        with torch.no_grad():
            grads = [p.grad.detach() for p in params]
            norms = _norms(grads)
            stacked = torch.stack(norms) if norms else None
            total = float(stacked.norm()) if stacked is not None else 0.0  # one sync
            # A finite total norm means finite gradients: the step hook need not ask again.
            self.grads_finite = math.isfinite(total)
            if math.isfinite(total):
                self.grad_norms.append((step, total))
            size = sum(p.numel() * p.element_size() for p in params)
            if size <= CLONE_LIMIT and params:
                watched, copies, self._scale = self._plan(params)
                torch._foreach_copy_(copies, watched)  # one batched copy, into kept buffers
                self._weights = _norms(params)
                self._parts = watched
                # The gradient columns of the table are taken here, from the gradients the
                # step is about to use (optimizers read them, they do not rewrite them): the
                # norms are at hand, and the step does not evict the gradients first.
                if all(g.numel() for g in grads):  # max |g| = max(|min|, |max|), no copy of |g|
                    lows = torch.stack([g.amin() for g in grads]).double().abs()
                    highs = torch.stack([g.amax() for g in grads]).double().abs()
                    self._grad_max = torch.maximum(lows, highs)
                else:
                    self._grad_max = torch.stack(
                        [
                            g.abs().max().double() if g.numel() else norms[0].new_zeros(())
                            for g in grads
                        ]
                    ).double()
                self._grad_norms = stacked.double()
                self._before = list(zip(params, copies))  # noqa: B905 - equal lengths
        self._step, self._optimizer = step, id(optimizer)

    def _plan(self, params: list[torch.Tensor]) -> tuple[list[Any], list[Any], Any]:
        """(watched weights, the buffers they are copied into, sqrt(size / watched)) for these
        parameters: built once and kept while the same parameters hold the same memory."""
        key = tuple((id(p), p.data_ptr(), p.shape, p.dtype) for p in params)
        plan = self._copies.get(key)
        if plan is None:
            watched = [_watched(p) for p in params]
            copies = [torch.empty(w.shape, dtype=w.dtype, device=w.device) for w in watched]
            pairs = zip(params, watched)  # noqa: B905 - equal lengths
            scale = [math.sqrt(p.numel() / max(1, w.numel())) for p, w in pairs]
            device = params[0].device
            plan = (watched, copies, torch.tensor(scale, dtype=torch.float64, device=device))
            if len(self._copies) >= 8:  # a few optimizers; their parameter sets rarely change
                self._copies.clear()
            self._copies[key] = plan
        return plan

    def after_step(self, optimizer: torch.optim.Optimizer) -> None:
        if not self._before or self._optimizer != id(optimizer):
            return
        before, self._before = self._before, []
        with torch.no_grad():
            # Batched (`_foreach_*`) reductions and one device->host copy for the whole table,
            # not a few dispatches and a transfer per parameter. The update is measured in
            # the copies' own memory (old - new, in place): no allocation as large as the model.
            params = [p for p, _ in before]
            olds = [old for _, old in before]
            torch._foreach_sub_(olds, self._parts)
            moved = torch.stack(_norms(olds)).double() * self._scale
            weights = torch.stack(self._weights).double()
            columns = [moved, weights, self._grad_norms, self._grad_max]
            table = torch.stack(columns).cpu().tolist()
        moved_list, weight_list, norm_list, max_list = table
        delta = sum(d**2 for d in moved_list)
        weight = sum(w**2 for w in weight_list)
        for index, p in enumerate(params):
            name = self._names.get(id(p))
            if name is None or len(self.per_step) >= 2000:
                continue
            figures = {
                "grad_norm": norm_list[index],
                "grad_max": max_list[index],
                "update_norm": moved_list[index],
                "weight_norm": weight_list[index],
            }
            if not self.layers or self._step == self._first_step:
                self._first_step = self._step
                first = {k: figures[k] for k in ("grad_norm", "update_norm")}
                self.layers.setdefault(name, first)
            self.per_step.append({"step": self._step, "name": name, **figures})
        if weight > 0 and math.isfinite(delta):
            lr = optimizer.param_groups[0].get("lr") if optimizer.param_groups else None
            lr_value = float(lr) if isinstance(lr, int | float) else float("nan")
            self.updates.append((self._step, math.sqrt(delta / weight), lr_value))

    def verdict(self) -> tuple[str, Any, Any] | None:
        """(message, where, related place) for the first sign of divergence, else None."""
        over = [item for item in self.updates if item[1] > UPDATE_RATIO]
        if over:
            step, ratio, lr = over[0]  # the first step that went wrong names the cause
            if ratio > UPDATE_RATIO:
                rate = f" (lr={lr:g})" if math.isfinite(lr) else ""
                where = next(iter(self.made_at.values()), None)
                return (
                    f"the update of optimizer step {step + 1} was {ratio:.3g} x the weights"
                    f"{rate}{self._loss_trend()}: the learning rate is probably too high",
                    where,
                    None,
                )
        if len(self.grad_norms) >= 2:
            first = self.grad_norms[0][1]
            step, last = max(self.grad_norms[1:], key=lambda item: item[1])
            if first > 0 and last / first > GRAD_GROWTH:
                where = next(iter(self.made_at.values()), None)
                return (
                    f"the gradient norm grew from {first:.3g} to {last:.3g} by optimizer step "
                    f"{step + 1}{self._loss_trend()}: exploding gradients",
                    where,
                    None,
                )
        finite = [item for item in self.losses if math.isfinite(item[0])]
        if len(finite) >= 2:
            first_value, first_where, _ = finite[0]
            value, where, step = max(finite[1:], key=lambda item: abs(item[0]))
            if abs(first_value) > 0 and abs(value) / abs(first_value) > LOSS_GROWTH:
                target = next(iter(self.made_at.values()), None) or where or first_where
                return (
                    f"the loss grew from {first_value:.4g} to {value:.4g} within {step + 1} "
                    "step(s): the run is diverging (learning rate too high?)",
                    target,
                    where,
                )
        return None

    def to_json(self) -> dict[str, Any]:
        """Per-step figures for the report (finite values only; JSON stays strict)."""

        def clean(value: float) -> float | None:
            return float(f"{value:.6g}") if math.isfinite(value) else None

        return {
            "loss": [{"step": step, "value": clean(v)} for v, _, step in self.losses],
            "grad_norm": [{"step": step, "value": clean(v)} for step, v in self.grad_norms],
            "update_ratio": [{"step": step, "value": clean(r)} for step, r, _ in self.updates],
            "layers": {
                name: {key: clean(value) for key, value in figures.items()}
                for name, figures in self.layers.items()
            },
            "parameters": [
                {k: clean(v) if isinstance(v, float) else v for k, v in item.items()}
                for item in self.per_step
            ],
        }

    def _loss_trend(self) -> str:
        finite = [value for value, _, _ in self.losses if math.isfinite(value)]
        if len(finite) >= 2:
            return f"; loss {finite[0]:.4g} -> {finite[-1]:.4g}"
        return ""


@dataclass
class Activations:
    """Per module (named in model order) and step: the first output's mean, std, fraction of
    exact zeros (a dead ReLU block outputs only zeros) and fraction non-finite.

    The mean and the non-finite fraction are exact. Above `SAMPLE` elements the spread and the
    zero fraction are taken over an evenly strided sample of about `SAMPLE` of them (a prime
    stride, so that it does not fall in step with a power-of-two dimension): those figures are
    for a chart, and measuring every element of every module's output on every tracked step
    costs a CNN as much as its own forward pass.
    """

    items: list[dict[str, Any]] = field(default_factory=list)
    _seen: set[tuple[str, int]] = field(default_factory=set)
    limit: int = 2000
    # The tensor measured last (weakly), its version and step, and the figures: a container
    # (`nn.Sequential`, a model whose forward ends with `x.view(...)`) outputs its last
    # child's tensor, or a view of it, and gets the same figures without measuring again.
    _last: tuple[Any, int, int, dict[str, Any]] | None = None

    def add(self, name: str, kind: str, output: Any, step: int) -> None:
        key = (name, step)
        if step >= TRACKED_STEPS or key in self._seen or len(self.items) >= self.limit:
            return
        tensor = next(iter(tensors_in(output, 1)), None)
        if tensor is None or not tensor.is_floating_point() or tensor.numel() == 0:
            return
        self._seen.add(key)
        figures = self._repeated(tensor, step)
        if figures is None:
            with torch.no_grad():
                figures = _figures(tensor.detach())
            version = version_of(tensor)
            # Without a version counter (inference mode) a later write could not be told.
            self._last = (weakref.ref(tensor), version, step, figures) if version >= 0 else None
        self.items.append({"step": step, "module": name, "kind": kind, **figures})

    def _repeated(self, tensor: torch.Tensor, step: int) -> dict[str, Any] | None:
        """The last figures, if `tensor` holds exactly the values measured last (the same
        tensor, or a contiguous view of it with as many elements, not written since)."""
        if self._last is None:
            return None
        ref, version, when, figures = self._last
        last = ref()
        if last is None or when != step or version_of(tensor) != version:
            return None
        if tensor is last:
            return figures
        base = last._base if last._base is not None else last
        if (
            tensor._base is base
            and tensor.numel() == last.numel()
            and tensor.data_ptr() == last.data_ptr()
            and tensor.is_contiguous()
            and last.is_contiguous()
        ):
            return figures
        return None

    def to_json(self) -> list[dict[str, Any]]:
        def clean(value: Any) -> Any:
            if isinstance(value, float):
                return float(f"{value:.6g}") if math.isfinite(value) else None
            return value

        return [{k: clean(v) for k, v in item.items()} for item in self.items]


def _figures(t: torch.Tensor) -> dict[str, Any]:
    """mean, std, zeros, nonfinite of one tensor (see `Activations`)."""
    count = t.numel()
    # Vectorised reductions and one device->host copy. (`std_mean` and `count_nonzero` are
    # not vectorised on the CPU: 25x slower than a sum.) The sum runs over every element, so a
    # NaN or an infinity anywhere makes the mean non-finite, and only then are the values
    # counted one by one and the figures taken over the finite ones. The sample is taken in
    # float64: its sum of squares then gives the spread without a centred copy.
    total = t.sum(dtype=torch.float64 if t.dtype == torch.float64 else torch.float32)
    flat = t.reshape(-1)
    part = (flat[:: _stride(count)] if count > SAMPLE else flat).to(torch.float64)
    size = part.numel()
    zero_count = (part == 0).sum()
    values = torch.stack([total.double(), part.sum(), torch.dot(part, part), zero_count]).tolist()
    total_value, first, second, zero_value = values
    spread = 0.0
    if size > 1 and math.isfinite(second):
        spread = math.sqrt(max(0.0, second - first * first / size) / (size - 1))
    mean: float | None = total_value / count
    zeros, bad = zero_value / size, 0.0
    if not (math.isfinite(total_value) and math.isfinite(second)):
        x = t.to(torch.float64 if t.dtype == torch.float64 else torch.float32)
        finite = torch.isfinite(x)
        bad = int((~finite).sum()) / count
        zeros = int((x == 0).sum()) / count
        good = x[finite]
        mean = float(good.mean()) if good.numel() else None
        spread = float(good.std()) if good.numel() > 1 else 0.0
    return {"mean": mean, "std": spread, "zeros": zeros, "nonfinite": bad}


class _CountingIterator:
    """Wraps a DataLoader iterator: counts batches and enforces the batch bound."""

    def __init__(self, inner: Any, hooks: Hooks) -> None:
        self._inner = inner
        self._hooks = hooks

    def __iter__(self) -> _CountingIterator:
        return self

    def __next__(self) -> Any:
        self._hooks.next_batch()
        # Indexing and collation inside the loader are not the user's ops (they would all land
        # on the `for` line); the batch itself is checked once it is complete.
        trace = self._hooks.trace
        was_busy, trace.busy = trace.busy, True
        try:
            with trace.paused():  # none of the loader's calls is traced: skip the tracer
                batch = next(self._inner)
        finally:
            trace.busy = was_busy
        with trace.paused():
            self._hooks.got_batch(batch)
        return batch

    def __len__(self) -> int:
        return len(self._inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
