"""The global hooks around the tracer: modules, optimizers, DataLoaders and warnings.

In: a `Trace`, the step/batch bounds and a progress channel. Out: module paths and root models
(global forward hooks), the `step` phase, parameter checks and the step bound (global optimizer
hooks), the batch bound and input checks (a counting wrapper on `DataLoader.__iter__`), and
Python/torch warnings placed on the innermost user line. `install()` returns an undo function.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
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

    def install(self) -> Callable[[], None]:
        handles = [
            register_module_forward_pre_hook(self._module_pre),
            register_module_forward_hook(self._module_post, always_call=True),
            register_optimizer_step_pre_hook(self._step_pre),
            register_optimizer_step_post_hook(self._step_post),
        ]
        original_iter = DataLoader.__iter__
        hooks = self

        def counting_iter(loader: DataLoader) -> Any:
            return _CountingIterator(original_iter(loader), hooks)

        DataLoader.__iter__ = counting_iter  # type: ignore[method-assign]
        original_show = warnings.showwarning
        catcher = warnings.catch_warnings()
        catcher.__enter__()
        warnings.simplefilter("default")
        warnings.showwarning = self._show_warning

        def undo() -> None:
            catcher.__exit__(None, None, None)
            warnings.showwarning = original_show
            DataLoader.__iter__ = original_iter  # type: ignore[method-assign]
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
            self._check_parameters(module, where)
        self._note_autocast()

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

    # --- optimizers ----------------------------------------------------------------------------

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
            where = trace.user.here()
            if where is not None:
                self._check_updated(optimizer, where)
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
