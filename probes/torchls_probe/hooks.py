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
"""

from __future__ import annotations

import math
import time
import warnings
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
from torchls_probe.stats import is_finite, summary, tensors_in
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
        self.got_grad: set[int] = set()  # parameters a complete backward reached
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
        if name is not None:
            trace.busy = True
            try:
                self.activations.add(name, type(module).__name__, output, trace.steps)
            finally:
                trace.busy = False
        forward = getattr(type(module), "forward", None)
        code = getattr(forward, "__code__", None)
        if code is None or trace.user.filename(code) is None:
            return  # a library module: its ops were already recorded on the calling line
        trace.busy = True
        try:
            self._record_module_output(module, output)
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
        for _, param, _ in self.roots.named_parameters():
            if param.grad is not None:
                self.got_grad.add(id(param))

    # --- optimizers ----------------------------------------------------------------------------

    def optimizer_made(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizers_made += 1
        trace = self.trace
        was_busy, trace.busy = trace.busy, True
        try:
            self.divergence.made(optimizer, trace.user.here())
        finally:
            trace.busy = was_busy

    def _step_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        trace = self.trace
        trace.busy = True
        try:
            where = trace.user.here()
            self.roots.add_optimizer(optimizer, where)
            self.roots.check_gradients(optimizer)
            self._grads_finite = all(
                p.grad is None or is_finite(p.grad)
                for group in optimizer.param_groups
                for p in group["params"]
            )
            names = {id(p): n for n, p, _ in self.roots.named_parameters()}
            self.divergence.before_step(optimizer, trace.steps, names)
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
        self.progress.emit(
            "step", f"step {trace.steps} of {self.steps}", step=trace.steps, total=self.steps
        )
        if trace.steps >= self.steps:
            raise ProbeStop("steps")

    def _check_updated(self, optimizer: torch.optim.Optimizer, where: Any) -> None:
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
        trace.busy = True
        try:
            for t in tensors_in(batch, 16):
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
        if step >= TRACKED_STEPS:  # a repro is a few steps; past these, measuring costs time
            return
        params = self._params(optimizer)
        with torch.no_grad():
            norms = [p.grad.detach().float().norm() for p in params]
            total = float(torch.stack(norms).norm()) if norms else 0.0  # one sync
            if math.isfinite(total):
                self.grad_norms.append((step, total))
            size = sum(p.numel() * p.element_size() for p in params)
            if size <= CLONE_LIMIT:
                self._before = [(p, p.detach().clone()) for p in params]
        self._step, self._optimizer = step, id(optimizer)

    def after_step(self, optimizer: torch.optim.Optimizer) -> None:
        if not self._before or self._optimizer != id(optimizer):
            return
        before, self._before = self._before, []
        with torch.no_grad():
            # One stacked reduction and one device->host copy per figure, not one per tensor.
            params = [p for p, _ in before]
            moved = torch.stack([(p.detach() - old).float().norm() for p, old in before])
            weights = torch.stack([old.float().norm() for _, old in before])
            grads = [p.grad.detach().float() if p.grad is not None else None for p in params]
            zero = torch.zeros((), device=moved.device)
            grad_norm = torch.stack([g.norm() if g is not None else zero for g in grads])
            grad_max = torch.stack(
                [g.abs().max() if g is not None and g.numel() else zero for g in grads]
            )
            table = torch.stack([moved, weights, grad_norm, grad_max]).double().cpu().tolist()
        moved_list, weight_list, norm_list, max_list = table
        delta = sum(d**2 for d in moved_list)
        weight = sum(w**2 for w in weight_list)
        for index, p in enumerate(params):
            name = self._names.get(id(p))
            if name is None or grads[index] is None or len(self.per_step) >= 2000:
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
    exact zeros (a dead ReLU block outputs only zeros) and fraction non-finite."""

    items: list[dict[str, Any]] = field(default_factory=list)
    _seen: set[tuple[str, int]] = field(default_factory=set)
    limit: int = 2000

    def add(self, name: str, kind: str, output: Any, step: int) -> None:
        key = (name, step)
        if step >= TRACKED_STEPS or key in self._seen or len(self.items) >= self.limit:
            return
        tensor = next(iter(tensors_in(output, 1)), None)
        if tensor is None or not tensor.is_floating_point() or tensor.numel() == 0:
            return
        self._seen.add(key)
        with torch.no_grad():
            t = tensor.detach().float()
            count = t.numel()
            # Two fused reductions (std_mean, count_nonzero) and one device->host copy: on a
            # small transformer these figures cost as much as the forward pass otherwise. A
            # NaN or an infinity makes the mean or the spread non-finite, so only then are
            # the values counted one by one and the statistics taken over the finite ones.
            if count > 1:
                spread, centre = torch.std_mean(t)
            else:
                spread, centre = t.new_zeros(()), t.mean()
            mean, std, nonzero = torch.stack(
                [centre, spread, torch.count_nonzero(t).float()]
            ).tolist()
            zeros, bad = count - nonzero, 0
            if not (math.isfinite(mean) and math.isfinite(std)):
                finite = torch.isfinite(t)
                bad = int((~finite).sum())
                zeros = int((t == 0).sum())
                good = t[finite]
                mean = float(good.mean()) if good.numel() else None
                std = float(good.std()) if good.numel() > 1 else 0.0
            self.items.append(
                {
                    "step": step,
                    "module": name,
                    "kind": kind,
                    "mean": mean,
                    "std": std,
                    "zeros": zeros / count,
                    "nonfinite": bad / count,
                }
            )

    def to_json(self) -> list[dict[str, Any]]:
        def clean(value: Any) -> Any:
            if isinstance(value, float):
                return float(f"{value:.6g}") if math.isfinite(value) else None
            return value

        return [{k: clean(v) for k, v in item.items()} for item in self.items]


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
            batch = next(self._inner)
        finally:
            trace.busy = was_busy
        self._hooks.got_batch(batch)
        return batch

    def __len__(self) -> int:
        return len(self._inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
