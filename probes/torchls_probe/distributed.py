"""One rank of a distributed repro: collectives watched, replicas and batches fingerprinted.

In: the request's `distributed` block, this rank's `Identity`, the trace, the root models and
the user-code filter. Out: what this rank saw, for its report's `distributed` block and for the
checks across ranks (TL909 rank divergence, TL910 rank data overlap, TL803 every rank writing
one checkpoint) that the node's local rank 0 makes once every rank has finished.

How a hang is caught (TL908): every `torch.distributed` collective, `init_process_group`, the
construction of `DistributedDataParallel` and a backward through it (its gradient all-reduce)
mark this rank as waiting there. A watchdog thread declares a hang in the shared exchange folder
when a rank has waited longer than the collective timeout, counted from when every rank had
started its script (the ranks import torch at different speeds), and every other rank has
finished, waits in a collective too, or has not moved for as long (its heartbeat: a rank that
still computes is slow, not hung, as on a loaded machine); on that declaration every
rank's watchdog takes its main thread's Python stack. A rank whose main thread runs Python is
stopped with a signal (`ProbeStop("hang")`); a rank blocked in C writes a provisional report
and, if it is still blocked a moment later, exits, which unblocks the others (their collective
fails and is taken for what it is). The server builds the finding from the reports. A rank that
raised declares a crash the same way, and the others stop (`ProbeStop("peer")`).

The probe never uses the user's process group for itself: a collective of its own could hang,
or pair with one of the user's.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from torchls_probe.attribution import Location
from torchls_probe.bounds import ProbeStop
from torchls_probe.fingerprints import DIGEST_NAMES, model_digests, replicated, sample_fingerprints
from torchls_probe.positions import position, source_line
from torchls_probe.ranks import Exchange, Identity, stack_of

# The torch.distributed calls every rank of a group must make together.
COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "barrier",
    "monitored_barrier",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce",
    "gather",
    "scatter",
    "all_to_all",
    "all_to_all_single",
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "scatter_object_list",
    "all_reduce_coalesced",
    "send",
    "recv",
    "new_group",
)
# What gloo (and the TCP store) say when the rank at the other end went away or never came.
PEER_GONE = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|ECONNRESET|"
    r"remote worker crashing|Connection refused",
    re.IGNORECASE,
)
TIMED_OUT = re.compile(r"Timed out waiting|timed out|Timeout", re.IGNORECASE)
POLL_S = 0.1
BEAT_S = 0.3  # how often a rank's heartbeat is written at most
BLOCKED_GRACE_S = 3.0  # a blocked rank's wait for its collective to fail before it exits
END_WAIT_S = 30.0  # the longest a finished rank waits for the others to finish
TENSOR_BUDGET = 32 << 20  # bytes of weights a rank leaves for the max-difference measurement
BOUNDARIES = 10  # digest sets kept per rank (before the first step, after steps, the end)
FINGERPRINT_BATCHES = 8  # batches fingerprinted per pass over a loader
FINGERPRINT_PASSES = 4  # passes (epochs) fingerprinted per loader
PROBE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_STOP_SIGNAL = getattr(signal, "SIGUSR1", None)


@dataclass
class Pending:
    """A blocking call this rank's main thread is in."""

    op: str
    where: Location | None
    seq: int
    since: float  # time.monotonic()

    def to_json(self) -> dict[str, Any]:
        item: dict[str, Any] = {"op": self.op, "seq": self.seq}
        if self.where is not None:
            item.update(position(self.where))
            item["source"] = source_line(self.where.filename, self.where.line).strip()[:200]
        return item


def _where_json(loc: Location | None) -> dict[str, Any] | None:
    if loc is None:
        return None
    item = position(loc)
    item["source"] = source_line(loc.filename, loc.line).strip()[:200]
    return item


def _location(item: Any) -> Location | None:
    if not isinstance(item, dict) or not isinstance(item.get("filename"), str):
        return None
    line = item.get("line")
    return Location(item["filename"], line) if isinstance(line, int) else None


def finding(
    code: str,
    name: str,
    severity: str,
    loc: Location,
    message: str,
    related: list[tuple[Location, str]] = (),  # type: ignore[assignment]
) -> dict[str, Any]:
    item: dict[str, Any] = {"code": code, "name": name, "severity": severity}
    item.update(position(loc))
    item["message"] = message
    item["related"] = [{**position(where), "message": text} for where, text in related]
    return item


class Distributed:
    """This rank's part of the distributed repro (see the module docstring)."""

    def __init__(self, request: Any, identity: Identity, started: float) -> None:
        """`started`: the rank's start (time.monotonic()); its budget began `late_s` before."""
        block = request.distributed or {}
        self.request = request
        self.identity = identity
        self.exchange = Exchange(str(block.get("exchange") or os.path.join(os.getcwd(), ".ranks")))
        self.collective_timeout = float(block.get("collective_timeout_s") or 5.0)
        self.deadline = started - identity.late_s + float(request.timeout_s)
        self.lock = threading.Lock()  # the report file: the main thread or the watchdog
        self.final = False
        self.ended = False
        self.end_where: Location | None = None
        self.stopped_by: str | None = None
        self.current: Pending | None = None
        self.inside = False
        self.seq = 0
        self.initialized = False
        self.backend: dict[str, Any] = {"requested": None, "used": None, "note": None}
        self.hang: dict[str, Any] | None = None
        self.crash: dict[str, Any] | None = None
        self.snapshot: dict[str, Any] | None = None
        self.stop_requested: str | None = None
        self.unwinding = False  # the main thread is already on its way out: no second stop
        self.terminated = False  # torchrun asked this rank to stop (another one failed)
        self.all_running_at: float | None = None
        self.provisional = False
        self.ddp_lines: dict[int, Location | None] = {}
        self.synced: dict[int, Location | None] = {}  # id(model) -> a collective on its tensors
        # id(parameter) -> the user line that built the model holding it (TL909's cause when
        # the replicas differ from the start: built per rank, never broadcast).
        self.built: dict[int, Location] = {}
        self.boundaries: list[dict[str, Any]] = []
        self.seeds: list[dict[str, Any]] = []
        self.saves: list[dict[str, Any]] = []
        self.loaders: dict[int, dict[str, Any]] = {}
        self._loader_refs: dict[int, Any] = {}
        self.findings: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self._pointer_map: tuple[Any, dict[int, int]] = (None, {})
        self._mark: Any = None
        self._moved_at = time.time()
        self._beat_at = 0.0
        self._main = threading.main_thread().ident
        self._watchdog: threading.Thread | None = None
        self._stop_watch = threading.Event()
        self.trace: Any = None
        self.roots: Any = None
        self.user: Any = None
        self.state: dict[str, Any] = {}

    # -- set-up -------------------------------------------------------------------------------

    def install(self, trace: Any, roots: Any, state: dict[str, Any]) -> Callable[[], None]:
        """Wrap the distributed API and the data/seed/save entry points; start the watchdog.
        Called after the hooks are installed: the DataLoader and backward hooks wrap theirs."""
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )
        from torch.utils.data import DataLoader

        self.trace, self.roots, self.user, self.state = trace, roots, trace.user, state
        undo: list[Callable[[], None]] = []

        def patch(owner: Any, name: str, wrapper: Callable[..., Any]) -> None:
            original = getattr(owner, name)
            setattr(owner, name, wrapper)
            undo.append(lambda: setattr(owner, name, original))

        for name in COLLECTIVES:
            original = getattr(c10d, name, None)
            if original is None:
                continue
            wrapped = self._collective(name, original)
            patch(c10d, name, wrapped)
            if getattr(dist, name, None) is original:
                patch(dist, name, wrapped)
        init = self._init_process_group(c10d.init_process_group)
        patch(c10d, "init_process_group", init)
        patch(dist, "init_process_group", init)
        ddp = torch.nn.parallel.DistributedDataParallel
        patch(ddp, "__init__", self._ddp_init(ddp.__init__))
        patch(DataLoader, "__init__", self._loader_init(DataLoader.__init__))
        patch(DataLoader, "__iter__", self._loader_iter(DataLoader.__iter__))
        patch(torch, "save", self._save(torch.save))
        patch(torch, "manual_seed", self._seed(torch.manual_seed))
        handles = [
            register_optimizer_step_pre_hook(self._step_pre),
            register_optimizer_step_post_hook(self._step_post),
            torch.nn.modules.module.register_module_parameter_registration_hook(
                self._parameter_made
            ),
        ]
        before, after = trace.before_backward, trace.after_backward
        trace.before_backward = self._before_backward(before)
        trace.after_backward = self._after_backward(after)

        def restore() -> None:
            trace.before_backward, trace.after_backward = before, after
            for handle in handles:
                handle.remove()
            for step in reversed(undo):
                step()

        if _STOP_SIGNAL is not None and signal.getsignal(_STOP_SIGNAL) in (signal.SIG_DFL, None):
            signal.signal(_STOP_SIGNAL, self._on_stop_signal)
        # torchrun stops the other ranks with SIGTERM when one fails (SIGKILL 30 s later):
        # a rank that gets it still writes its report.
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, self._on_terminate)
        self.exchange.write(
            f"running.{self.identity.local_rank}", {"at": time.time(), "pid": os.getpid()}
        )
        self._watchdog = threading.Thread(target=self._watch, name="torchls-ranks", daemon=True)
        self._watchdog.start()
        return restore

    def adjust_device(self, device: dict[str, Any] | None) -> None:
        """A CUDA rank runs on the GPU of its local rank (what the script selects too)."""
        if not device or device.get("resolved") is None:
            return
        if str(device.get("torch_device", "")).startswith("cuda"):
            count = int(device.get("count") or torch.cuda.device_count() or 1)
            device["torch_device"] = f"cuda:{self.identity.local_rank % count}"

    # -- the wrapped API ----------------------------------------------------------------------

    def _enter(self, op: str, where: Location | None) -> Pending:
        self.seq += 1
        pending = Pending(op, where, self.seq, time.monotonic())
        self.current = pending
        return pending

    def _collective(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def collective(*args: Any, **kwargs: Any) -> Any:
            if self.inside or self.trace is None or self.trace.busy:
                return original(*args, **kwargs)  # a collective made by another one
            where = self.user.here()
            self._note_tensors(args, kwargs, where)
            self._enter(f"{name}()", where)
            self.inside = True
            try:
                result = original(*args, **kwargs)
                if self.backend.get("used") == "nccl" and not kwargs.get("async_op"):
                    # NCCL returns before the collective ran: wait, so a hang is seen here.
                    torch.cuda.synchronize()
                return result
            except Exception as error:
                reason = self._failed_collective(error)
                if reason is not None:
                    raise ProbeStop(reason) from error
                raise
            finally:
                self.inside = False
                self.current = None

        return collective

    def _init_process_group(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            where = self.user.here() if self.user is not None else None
            requested = kwargs.get("backend", args[0] if args else None)
            chosen, note = self._choose_backend(requested)
            if chosen != requested:
                args = args[1:] if args else args
                kwargs["backend"] = chosen
            self.backend.update(requested=requested, note=note)
            self._enter("init_process_group()", where)
            try:
                return original(*args, **kwargs)
            except Exception as error:
                reason = self._failed_collective(error)
                if reason is not None:
                    raise ProbeStop(reason) from error
                raise
            finally:
                self.current = None
                self._after_init()

        return init_process_group

    def _after_init(self) -> None:
        import torch.distributed as dist

        with contextlib.suppress(Exception):
            if dist.is_initialized():
                self.initialized = True
                self.backend["used"] = str(dist.get_backend())

    def _choose_backend(self, requested: Any) -> tuple[Any, str | None]:
        """gloo where NCCL cannot run: on the CPU, or with fewer GPUs than ranks here."""
        text = str(requested or "").lower()
        if requested is not None and "nccl" not in text:
            return requested, None
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        ranks = self.identity.local_world_size
        if requested is None:
            if gpus >= ranks and gpus > 0:
                return requested, None
            return "gloo", None if gpus == 0 else f"{ranks} ranks, {gpus} GPUs: gloo"
        if gpus == 0:
            return "gloo", "the script asks for nccl; the repro runs on the CPU, so gloo is used"
        if gpus < ranks:
            return "gloo", (
                f"the script asks for nccl, which needs one GPU per rank: {ranks} ranks, "
                f"{gpus} GPU{'s' if gpus != 1 else ''} here, so gloo is used"
            )
        return requested, None

    def _ddp_init(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def __init__(module: Any, *args: Any, **kwargs: Any) -> None:
            where = self.user.here() if self.user is not None else None
            self._enter("DistributedDataParallel()", where)
            try:
                original(module, *args, **kwargs)
            finally:
                self.current = None
            self.ddp_lines[id(module)] = where

        return __init__

    def _before_backward(self, previous: Callable[[], None] | None) -> Callable[[], None]:
        def before() -> None:
            if previous is not None:
                previous()
            if self._ddp_syncing() and self.current is None:
                self._enter("backward() through DistributedDataParallel", self.user.here())

        return before

    def _after_backward(self, previous: Callable[[Any], None] | None) -> Callable[[Any], None]:
        def after(roots_of_backward: Any) -> None:
            if self.current is not None and self.current.op.startswith("backward"):
                self.current = None
            if previous is not None:
                previous(roots_of_backward)

        return after

    def _ddp_syncing(self) -> bool:
        if not self.ddp_lines or not torch.is_grad_enabled():
            return False
        return any(
            isinstance(m, torch.nn.parallel.DistributedDataParallel)
            and getattr(m, "require_backward_grad_sync", True)
            for m in self.roots.models
        )

    def _note_tensors(self, args: tuple, kwargs: dict, where: Location | None) -> None:
        """A collective on a root model's parameters or gradients makes it synchronised."""
        if self.roots is None or not self.roots.models:
            return
        trace = self.trace
        key = (len(self.roots.models), trace.backward_calls, trace.steps)
        if self._pointer_map[0] != key:
            pointers: dict[int, int] = {}
            for model in self.roots.models:
                for tensor in [*model.parameters(), *model.buffers()][:DIGEST_NAMES]:
                    pointers[tensor.data_ptr()] = id(model)
                    grad = getattr(tensor, "grad", None)
                    if grad is not None:
                        pointers[grad.data_ptr()] = id(model)
            self._pointer_map = (key, pointers)
        pointers = self._pointer_map[1]
        candidates = [*args[:2], kwargs.get("tensor"), kwargs.get("tensor_list")]
        for value in candidates:
            items = value if isinstance(value, (list, tuple)) else [value]
            for item in items[:64]:
                if isinstance(item, torch.Tensor) and item.data_ptr() in pointers:
                    self.synced.setdefault(pointers[item.data_ptr()], where)

    def _failed_collective(self, error: BaseException) -> str | None:
        """Why a collective (or the rendezvous) failed, when a rank elsewhere is the cause:
        "hang" or "peer"; None for the user's own error."""
        if self.stop_requested is not None:
            return self.stop_requested
        if self._event("hang") is not None:
            return "hang"
        if self._event("crash") is not None:
            return "peer"
        text = str(error)
        if TIMED_OUT.search(text) and self.current is not None:
            self._declare_hang(self.current, time.monotonic() - self.current.since)
            return "hang"
        if PEER_GONE.search(text):
            return "peer"
        return None

    # -- data, seeds, checkpoints -------------------------------------------------------------

    def _loader_init(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:
            original(loader, *args, **kwargs)
            if self.user is not None and not self.trace.busy:
                self._loader(loader)["built"] = _where_json(self.user.here())

        return __init__

    def _loader(self, loader: Any) -> dict[str, Any]:
        key = id(loader)
        ref = self._loader_refs.get(key)
        if ref is None or ref() is not loader:
            with contextlib.suppress(TypeError):
                self._loader_refs[key] = weakref.ref(loader)
            self.loaders[key] = {"index": len(self.loaders), "built": None, "passes": []}
        return self.loaders[key]

    def _loader_iter(self, original: Callable[..., Any]) -> Callable[..., Any]:
        distributed = self

        @functools.wraps(original)
        def __iter__(loader: Any) -> Any:
            inner = original(loader)
            if distributed.trace is None or distributed.trace.busy:
                return inner
            record = distributed._loader(loader)
            sampler = _distributed_sampler(loader)
            passes = record["passes"]
            entry: dict[str, Any] = {
                "where": _where_json(distributed.user.here()),
                "sampler": type(getattr(loader, "sampler", None)).__name__,
                "distributed_sampler": sampler is not None,
                "shuffle": bool(getattr(sampler, "shuffle", False)) if sampler else None,
                "epoch": getattr(sampler, "epoch", None) if sampler else None,
                "batches": [],
            }
            if len(passes) >= FINGERPRINT_PASSES:
                return inner
            passes.append(entry)
            return _Fingerprinting(inner, distributed, entry["batches"])

        return __iter__

    def fingerprint(self, batch: Any, into: list[list[int]]) -> None:
        if len(into) >= FINGERPRINT_BATCHES:
            return
        trace = self.trace
        was_busy, trace.busy = trace.busy, True
        try:
            into.append(sample_fingerprints(batch))
        except Exception as error:  # a batch of an unusual kind: no fingerprint, no failure
            self.notes.append(f"a batch could not be fingerprinted: {error!r}"[:200])
            into.append([])
        finally:
            trace.busy = was_busy

    def _save(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
            if self.trace is not None and not self.trace.busy and isinstance(f, (str, os.PathLike)):
                where = self.user.here()
                if where is not None and len(self.saves) < 50:
                    path = os.path.abspath(os.fspath(f))
                    self.saves.append({"path": path, "where": _where_json(where)})
            return original(obj, f, *args, **kwargs)

        return save

    def _seed(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def manual_seed(seed: Any) -> Any:
            if self.trace is not None and not self.trace.busy and len(self.seeds) < 20:
                where = self.user.here()
                if where is not None:
                    with contextlib.suppress(TypeError, ValueError):
                        self.seeds.append({"seed": int(seed), "where": _where_json(where)})
            return original(seed)

        return manual_seed

    # -- replicas -----------------------------------------------------------------------------

    def _parameter_made(self, module: Any, name: str, param: Any) -> None:
        """A parameter registered: remember the user line whose call built the outermost module
        under construction (`model = Net()`, not `self.fc = nn.Linear(...)` inside it)."""
        if param is None or len(self.built) >= 4096 or self.trace is None or self.trace.busy:
            return
        frame = sys._getframe(1)
        site = None
        while frame is not None:
            if frame.f_code.co_name == "__init__" and isinstance(
                frame.f_locals.get("self"), torch.nn.Module
            ):
                site = None  # a module's constructor: the builder is further out
            elif site is None and self.user.filename(frame.f_code) is not None:
                site = frame
            frame = frame.f_back
        if site is not None:
            self.built[id(param)] = self.user.location(site)

    def _step_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.trace.steps == 0 and not self.boundaries:
            self._digest("before the first optimizer step")

    def _step_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        steps = self.trace.steps
        label = f"after optimizer step {steps}"
        if not self.boundaries or self.boundaries[-1]["label"] != label:
            self._digest(label)

    def _digest(self, label: str) -> None:
        if len(self.boundaries) >= BOUNDARIES or self.roots is None:
            return
        trace = self.trace
        was_busy, trace.busy = trace.busy, True
        try:
            with torch.no_grad():
                models = [
                    {"index": index, "digests": model_digests(model)}
                    for index, model in enumerate(self.roots.models)
                ]
            self.boundaries.append({"label": label, "steps": trace.steps, "models": models})
        except Exception as error:
            self.notes.append(f"the weights could not be fingerprinted: {error!r}"[:200])
        finally:
            trace.busy = was_busy

    def _model_records(self) -> list[dict[str, Any]]:
        records = []
        optimized = {
            id(p) for o in self.roots.optimizers for g in o.param_groups for p in g["params"]
        }
        for index, model in enumerate(self.roots.models):
            ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel)
            params = list(model.parameters())
            sharded = any(type(p).__name__ in ("DTensor", "FlatParameter") for p in params)
            if sharded or type(model).__name__ == "FullyShardedDataParallel":
                kind = "sharded"
            elif ddp:
                kind = "ddp"
            elif id(model) in self.synced:
                kind = "synced"
            elif any(id(p) in optimized for p in params):
                kind = "trained"
            else:
                kind = "other"
            sync_where = self.ddp_lines.get(id(model)) if ddp else self.synced.get(id(model))
            signature = [[name, list(t.shape), str(t.dtype)] for name, t in replicated(model)][
                :DIGEST_NAMES
            ]
            records.append(
                {
                    "index": index,
                    "type": type(model).__name__,
                    "kind": kind,
                    "signature": signature,
                    "first_call": _where_json(self.roots.first_call.get(id(model))),
                    "synced_at": _where_json(sync_where),
                    "built": _where_json(
                        next((self.built[id(p)] for p in params if id(p) in self.built), None)
                    ),
                }
            )
        return records

    def _save_weights(self) -> str | None:
        """This rank's weights, for the max difference local rank 0 measures."""
        tensors: dict[str, torch.Tensor] = {}
        size = 0
        for index, model in enumerate(self.roots.models):
            for name, tensor in replicated(model):
                size += tensor.numel() * tensor.element_size()
                if size > TENSOR_BUDGET:
                    return None
                tensors[f"{index}/{name}"] = tensor.detach().cpu()
        if not tensors:
            return None
        name = f"weights.{self.identity.local_rank}.pt"
        temporary = self.exchange.path(f".{name}.tmp")
        try:
            torch.save(tensors, temporary)
            os.replace(temporary, self.exchange.path(name))
        except (OSError, RuntimeError):
            return None
        return name

    # -- the watchdog -------------------------------------------------------------------------

    def _event(self, kind: str) -> dict[str, Any] | None:
        known = self.hang if kind == "hang" else self.crash
        if known is not None:
            return known
        found = self.exchange.read(f"{kind}.json")
        if isinstance(found, dict):
            if kind == "hang":
                self.hang = found
            else:
                self.crash = found
            return found
        return None

    def _all_running(self) -> bool:
        if self.all_running_at is None:
            ranks = range(self.identity.local_world_size)
            if all(self.exchange.exists(f"running.{r}") for r in ranks):
                self.all_running_at = time.monotonic()
        return self.all_running_at is not None

    def _beat(self) -> None:
        """Leave this rank's heartbeat: whether it waits, has finished, or still moves (its
        counters or the line its main thread is on changed), at most every BEAT_S."""
        frame = sys._current_frames().get(self._main)
        trace = self.trace
        pending = self.current
        mark = (
            (trace.steps, trace.backward_calls, trace.batches) if trace is not None else None,
            self.seq,
            self.ended,
            pending.seq if pending is not None else None,
            (frame.f_code, frame.f_lineno) if frame is not None else None,
        )
        now = time.time()
        if mark != self._mark:
            self._mark, self._moved_at = mark, now
        if now - self._beat_at < BEAT_S:
            return
        self._beat_at = now
        state = {"ended": self.ended, "waiting": pending is not None, "moved_unix": self._moved_at}
        self.exchange.write(f"state.{self.identity.local_rank}.json", state)

    def _others_idle(self) -> bool:
        """Whether every other rank has finished, waits in a collective, or has not moved
        for the collective timeout: only then is a long wait a hang, not a slow rank (a
        loaded machine, a rank still building its model or reading its data)."""
        now = time.time()
        for rank in range(self.identity.local_world_size):
            if rank == self.identity.local_rank:
                continue
            state = self.exchange.read(f"state.{rank}.json")
            if not isinstance(state, dict):
                return False
            moved = state.get("moved_unix")
            still = isinstance(moved, (int, float)) and now - moved > self.collective_timeout
            if not (state.get("ended") or state.get("waiting") or still):
                return False
        return True

    def _declare_hang(self, pending: Pending, waited: float) -> None:
        record = {
            "rank": self.identity.rank,
            "local_rank": self.identity.local_rank,
            "waited_s": round(waited, 2),
            "timeout_s": self.collective_timeout,
            "at_unix": time.time(),
            **pending.to_json(),
        }
        if not self.exchange.claim("hang.json", record):
            record = self.exchange.read("hang.json") or record
        self.hang = record

    def _watch(self) -> None:
        # Signals are the main thread's business: the limits, torchrun's SIGTERM, the user's.
        with contextlib.suppress(AttributeError, OSError, ValueError):
            signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        handled: set[str] = set()
        while not self._stop_watch.wait(POLL_S):
            try:
                self._watch_once(handled)
            except Exception as error:  # the watchdog must never take the rank down
                self.notes.append(f"the rank watchdog failed: {error!r}"[:200])
                return

    def _watch_once(self, handled: set[str]) -> None:
        now = time.monotonic()
        pending = self.current
        self._beat()
        if "hang" not in handled and self.hang is None and pending is not None:
            if self._all_running():
                waited = now - max(pending.since, self.all_running_at or now)
                if waited > self.collective_timeout and self._others_idle():
                    self._declare_hang(pending, now - pending.since)
        for kind in ("hang", "crash"):
            if kind in handled or self._event(kind) is None:
                continue
            handled.add(kind)
            if self.snapshot is None:
                self.take_snapshot(kind)
            if not self.ended:
                self._stop_main("hang" if kind == "hang" else "peer")
        if "deadline" not in handled and now > self.deadline + 0.5 and not self.ended:
            handled.add("deadline")
            if self.snapshot is None:
                self.take_snapshot("timeout")
            if self.current is not None:
                self._blocked("timeout")
            else:  # the alarm did not stop it either: stuck in C code, a report may not come
                self.write_provisional("timeout")

    def take_snapshot(self, reason: str) -> None:
        stack = stack_of(self._main, self.user, PROBE_DIR)
        pending = self.current
        if self.ended:
            state = "finished"
            where = self.end_where
        elif pending is not None:
            state = f"waiting in {pending.op}"
            where = pending.where or stack["innermost"]
        else:
            state = "running"
            where = stack["innermost"]
        self.snapshot = {
            "reason": reason,
            "at_unix": time.time(),
            "state": state,
            "pending": pending.to_json() if pending is not None else None,
            "where": _where_json(where),
            "frames": stack["frames"],
            "steps": self.trace.steps if self.trace is not None else 0,
        }

    def _stop_main(self, reason: str) -> None:
        self.stop_requested = reason
        if self.current is not None:
            self._blocked(reason)
            return
        if _STOP_SIGNAL is not None and signal.getsignal(_STOP_SIGNAL) == self._on_stop_signal:
            with contextlib.suppress(OSError, ValueError):
                signal.pthread_kill(self._main, _STOP_SIGNAL)

    def _on_stop_signal(self, signum: int, frame: Any) -> None:
        if self.stop_requested is None or self.ended or self.unwinding or self.current:
            return
        self.unwinding = True
        raise ProbeStop(self.stop_requested)

    def _on_terminate(self, signum: int, frame: Any) -> None:
        self.terminated = True
        if self.ended or self.unwinding:
            return  # the end: the wait for the other ranks sees the flag
        self.unwinding = True
        self.stop_requested = self.stop_requested or "peer"
        raise ProbeStop(self.stop_requested)

    def _blocked(self, reason: str) -> None:
        """The main thread is stuck in a collective: leave a report, give the collective a
        moment to fail (the others are stopping too), then exit so that theirs fail."""
        self.write_provisional(reason)
        end = time.monotonic() + BLOCKED_GRACE_S
        while time.monotonic() < end:
            if self.current is None or self.ended:
                return
            time.sleep(POLL_S)
        with self.lock:
            if self.final:
                return
            os._exit(0)

    def write_provisional(self, reason: str) -> None:
        from torchls_probe.findings import Outcome
        from torchls_probe.report import assemble, dumps, skeleton

        request = self.request
        if request.out is None:
            return
        status = "timeout" if reason == "timeout" else "error"
        outcome = Outcome(status=status, stopped_by=reason)
        if self.snapshot is not None:
            outcome.location = _location(self.snapshot.get("where"))
        found = []
        if reason == "timeout" and outcome.location is not None:
            message = (
                f"stopped by the wall-clock limit of {request.timeout_s:g} s while blocked in "
                f"{self.current.op if self.current else 'C code'}"
            )
            found.append(finding("TL906", "probe-limit", "warning", outcome.location, message))
        try:
            report = assemble(
                request=request,
                outcome=outcome,
                device=self.state.get("device"),
                environment=self.state.get("environment"),
                trace=self.trace,
                findings=found,
                parameters={"without_grad": [], "zero_grad": [], "not_in_optimizer": []},
                autocast=[],
                timing={},
            )
        except Exception:  # the trace may be mid-update: a report without it is still one
            report = skeleton(status, reason, request.file, found)
        report["provisional"] = True
        report["distributed"] = self.to_json()
        text = dumps(report, request.report_cap_bytes)
        with self.lock:
            if self.final:
                return
            with contextlib.suppress(OSError):
                with open(request.out, "w", encoding="utf-8") as handle:
                    handle.write(text)
                self.provisional = True

    # -- the end ------------------------------------------------------------------------------

    def classify(self, error: BaseException, outcome: Any) -> bool:
        """For the runner: an error caused by another rank (it crashed, hung or went away) is
        not this rank's TL905. True when `outcome` was set here."""
        self.unwinding = True
        if isinstance(error, ProbeStop) or not isinstance(error, RuntimeError):
            return False  # a user's network error (OSError) is theirs, not another rank's
        reason = self._failed_collective(error) if self.initialized else None
        if reason is None:
            return False
        outcome.stopped_by = reason
        outcome.notes.append(f"stopped because another rank {_why(reason)}: {error}"[:500])
        return True

    def finish(self, outcome: Any) -> None:
        """The run is over on this rank: announce a failure, leave this rank's record, wait
        for the other ranks, and (local rank 0) compare what they saw."""
        self.current = None
        self.ended = True
        self.end_where = outcome.location
        self.stopped_by = outcome.stopped_by
        if outcome.stopped_by == "hang":
            outcome.status = "error"
        failed = outcome.stopped_by in ("exception", "timeout", "cpu", "memory", "output") or (
            outcome.stopped_by == "exit" and outcome.status == "error"
        )
        if failed and self._event("crash") is None:
            record = {
                "rank": self.identity.rank,
                "local_rank": self.identity.local_rank,
                "stopped_by": outcome.stopped_by,
                "message": ((outcome.exception or {}).get("message") or outcome.limit_message)[
                    :300
                ],
                "where": _where_json(outcome.location),
            }
            if self.exchange.claim("crash.json", record):
                self.crash = record
        normal = outcome.stopped_by in ("steps", "batches", "backwards", "end", "exit")
        weights = None
        if self.roots is not None and self.initialized and normal:
            label = f"after optimizer step {self.trace.steps}"
            if not self.boundaries or self.boundaries[-1]["label"] != label:
                self._digest(label)
            weights = self._save_weights()
        record = {
            **self.identity.to_json(),
            "file": self.request.file,
            "initialized": self.initialized,
            "normal": normal,
            "stopped_by": outcome.stopped_by,
            "steps": self.trace.steps if self.trace is not None else 0,
            "models": self._model_records() if self.roots is not None else [],
            "boundaries": self.boundaries,
            "loaders": sorted(self.loaders.values(), key=lambda item: item["index"]),
            "seeds": self.seeds,
            "saves": self.saves,
            "weights": weights,
        }
        written = self.exchange.write(f"done.{self.identity.local_rank}.json", record)
        if not written:
            self.notes.append("this rank's record could not be written (is the scratch full?)")
        # A rank that stopped early compares nothing, so it need not wait for the others.
        others = self._wait_for_others() if normal and written else None
        if self.identity.local_rank == 0 and normal and others is not None:
            from torchls_probe import crossrank

            try:
                self.findings += crossrank.compare([record, *others], self.exchange.folder)
            except Exception as error:
                self.notes.append(f"probe error while comparing ranks: {error!r}"[:300])
        if self.identity.local_rank == 0 or not normal:
            from torchls_probe import crossrank

            self.findings += crossrank.repeated_epochs(record)

    def _wait_for_others(self) -> list[dict[str, Any]] | None:
        """The other local ranks' records once all are written; None when one never comes
        (a rank crashed, hung or was killed: comparing what is left would mislead)."""
        end = min(time.monotonic() + END_WAIT_S, self.deadline - 0.5)
        me = self.identity.local_rank
        wanted = [r for r in range(self.identity.local_world_size) if r != me]
        while True:
            found = [self.exchange.read(f"done.{r}.json") for r in wanted]
            if all(isinstance(item, dict) for item in found):
                return found
            if self.terminated or self._event("hang") or self._event("crash"):
                return None
            gone = [r for r, item in zip(wanted, found, strict=True) if item is None]
            if any(not self._alive(rank) for rank in gone):
                self.notes.append("a rank ended without its record: the ranks were not compared")
                return None
            if time.monotonic() >= end:
                self.notes.append("not every rank finished: the ranks were not compared")
                return None
            time.sleep(POLL_S)

    def _alive(self, rank: int) -> bool:
        """Whether local rank `rank`'s process still runs (a zombie does not)."""
        started = self.exchange.read(f"running.{rank}")
        pid = started.get("pid") if isinstance(started, dict) else None
        if not isinstance(pid, int):
            return True  # not known: the wait's own bound decides
        if not os.path.isdir("/proc/self"):  # no /proc (macOS): ask the kernel
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            except OSError:
                return True
            return True
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
                return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            return False

    def to_json(self) -> dict[str, Any]:
        return {
            **self.identity.to_json(),
            "initialized": self.initialized,
            "backend": dict(self.backend),
            "collective_timeout_s": self.collective_timeout,
            "collectives": self.seq,
            "hang": self.hang,
            "crash": self.crash,
            "snapshot": self.snapshot,
            "stopped_by": self.stopped_by,
            "notes": self.notes[:20],
        }

    def amend(self, report: dict[str, Any]) -> None:
        """Add this rank's block and the cross-rank findings to its report."""
        self._stop_watch.set()
        if self.hang is not None and self.snapshot is None:
            self.take_snapshot("hang")
        report["findings"] = [*report.get("findings", []), *self.findings]
        report["distributed"] = self.to_json()
        device = report.get("device")
        if isinstance(device, dict):
            device["backend"] = self.backend.get("used")

    @contextlib.contextmanager
    def writing(self) -> Any:
        with self.lock:
            self.final = True
            yield


def _why(reason: str) -> str:
    return "hung in a collective" if reason == "hang" else "failed or exited"


class _Fingerprinting:
    """A DataLoader iterator whose first batches are fingerprinted, sample by sample."""

    def __init__(self, inner: Any, distributed: Distributed, into: list[list[int]]) -> None:
        self._inner = inner
        self._distributed = distributed
        self._into = into

    def __iter__(self) -> _Fingerprinting:
        return self

    def __next__(self) -> Any:
        batch = next(self._inner)
        self._distributed.fingerprint(batch, self._into)
        return batch

    def __len__(self) -> int:
        return len(self._inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _distributed_sampler(loader: Any) -> Any:
    from torch.utils.data.distributed import DistributedSampler

    for candidate in (
        getattr(loader, "sampler", None),
        getattr(getattr(loader, "batch_sampler", None), "sampler", None),
    ):
        if isinstance(candidate, DistributedSampler):
            return candidate
    return None
