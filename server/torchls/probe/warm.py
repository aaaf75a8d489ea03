"""Warm runs: a long-lived sandboxed worker per interpreter that forks a child per repro.

In: prepared runs (see prepare.py). Out: the same `ReproReport` a cold run gives, in a fraction
of the time (no interpreter start, no `import torch`, no first-optimizer imports). The worker
itself runs under the sandbox (bubblewrap, pids cgroup, minimal environment); each child adds
its own session, rlimits and, where permitted, a PID namespace. Only CPU runs are served warm,
and only by a worker that saw no accelerator: forking after CUDA initialises is unsafe, and a
forked child cannot hide devices from a torch that already counted them.

`ReproSession` is what the language server keeps: `run()` uses a ready worker when one fits and
otherwise runs cold while a worker warms up in the background for next time.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from torchls.probe.locate import stage_probe
from torchls.probe.options import ReproOptions
from torchls.probe.prepare import Prepared, new_scratch, prepare
from torchls.probe.process import Ended
from torchls.probe.report import ReproReport
from torchls.probe.runner import (
    KILL_GRACE_S,
    ProgressCallback,
    ProgressEvent,
    ReproCancelled,
    finish,
    forward_progress,
    notify,
    run_cold,
    wall_clock_layer,
)
from torchls.probe.sandbox import Launch, Layer, Limits, keep_paths, limits_for, plan

READY_TIMEOUT_S = 120.0
# How long past its deadline a worker may stay silent before it is killed as a whole.
WORKER_SLACK_S = 15.0


class WorkerError(RuntimeError):
    """The worker died or misbehaved; the run falls back to a cold start."""


def _key(prepared: Prepared) -> tuple[Any, ...]:
    options = prepared.resolved.options
    return (
        str(prepared.python),
        options.sandbox,
        options.pass_env,
        tuple(keep_paths([prepared.root, *prepared.read_paths])),
    )


class WarmWorker:
    def __init__(self, prepared: Prepared) -> None:
        self.key = _key(prepared)
        self.scratch_root = new_scratch()
        try:
            self.launch: Launch = self._plan(prepared)
        except BaseException:
            shutil.rmtree(self.scratch_root, ignore_errors=True)
            raise
        self.bwrap = any(layer.name == "bubblewrap" and layer.held for layer in self.launch.layers)
        argv = [*self.launch.argv_prefix, str(prepared.python), "-m", "torchls_probe.worker"]
        self.stderr_path = self.scratch_root / "worker-stderr.txt"
        # bubblewrap's --die-with-parent (PR_SET_PDEATHSIG) fires when the *thread* that forked
        # it exits, so the worker is started from a keeper thread that lives as long as it does.
        self._stop = threading.Event()
        spawned = threading.Event()
        failure: list[BaseException] = []

        def keep() -> None:
            try:
                with open(self.stderr_path, "wb") as stderr:
                    self.process = subprocess.Popen(
                        argv,
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=stderr,
                        env=self.launch.env,
                        cwd=str(prepared.root),
                        start_new_session=True,
                        preexec_fn=self.launch.preexec,
                    )
            except BaseException as error:
                failure.append(error)
            finally:
                spawned.set()
            self._stop.wait()

        threading.Thread(target=keep, name="torchls-warm-worker", daemon=True).start()
        spawned.wait()
        if failure:
            self.launch.close()
            shutil.rmtree(self.scratch_root, ignore_errors=True)
            raise WorkerError(f"the warm worker could not start: {failure[0]}")
        assert self.process.stdout is not None
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.process.stdout, selectors.EVENT_READ)
        self._buffer = b""
        self._ids = itertools.count(1)
        self.info: dict[str, Any] | None = None
        self.lock = threading.Lock()

    def _plan(self, prepared: Prepared) -> Launch:
        options = prepared.resolved.options
        # The worker has no rlimits of its own: each child sets the limits of its run.
        return plan(
            python=prepared.python,
            probe_dir=stage_probe(prepared.probe_package, self.scratch_root),
            scratch=self.scratch_root,
            cwd=prepared.root,
            read_paths=list(prepared.read_paths),
            limits=Limits(0, 0, 0, options.max_processes),
            mode=options.sandbox,
            extra_env=options.pass_env,
        )

    # --- protocol ------------------------------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write((json.dumps(message) + "\n").encode("utf-8"))
            self.process.stdin.flush()
        except OSError as error:
            raise WorkerError(f"the warm worker is gone: {error}") from None

    def _messages(self, timeout: float) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        assert self.process.stdout is not None
        for _ready in self._selector.select(timeout):
            chunk = os.read(self.process.stdout.fileno(), 65536)
            if not chunk:
                raise WorkerError(f"the warm worker exited: {self._stderr_tail()}")
            *lines, self._buffer = (self._buffer + chunk).split(b"\n")
            for line in lines:
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                if isinstance(message, dict):
                    found.append(message)
        return found

    def _stderr_tail(self) -> str:
        try:
            lines = self.stderr_path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return "no stderr"
        return lines[-1] if lines else "no stderr"

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> dict[str, Any]:
        end = time.monotonic() + timeout
        while self.info is None:
            if time.monotonic() > end:
                raise WorkerError("the warm worker did not become ready in time")
            for message in self._messages(0.1):
                if message.get("event") == "failed":
                    raise WorkerError(f"the warm worker failed: {message.get('error')}")
                if message.get("event") == "ready":
                    self.info = message
        return self.info

    def serves(self, prepared: Prepared) -> bool:
        info = self.info
        if info is None or self.process.poll() is not None or sys.platform != "linux":
            return False
        if info.get("cuda") or info.get("mps"):
            return False
        return prepared.resolved.device in ("cpu", "auto") and _key(prepared) == self.key

    # --- one run -------------------------------------------------------------------------------

    def run(
        self,
        prepared: Prepared,
        on_progress: ProgressCallback | None,
        cancel_event: threading.Event | None,
    ) -> ReproReport:
        started = time.monotonic()
        run_id = next(self._ids)
        scratch = self.scratch_root / f"run-{run_id}"
        scratch.mkdir()
        r = prepared.resolved
        try:
            request = prepared.request(scratch)
            limits = limits_for(
                r.memory_mb, r.timeout_s, r.options.file_size_mb, r.options.max_processes, r.device
            )
            deadline_s = r.timeout_s + KILL_GRACE_S
            self._send(
                {
                    "op": "run",
                    "id": run_id,
                    "request": request,
                    "limits": _limits_json(limits),
                    "deadline_s": deadline_s,
                    "network": not self.bwrap,
                }
            )
            notify(on_progress, ProgressEvent("start", "forking warm interpreter"))
            exit_message, child = self._follow(
                run_id, started + deadline_s + WORKER_SLACK_S, on_progress, cancel_event
            )
            if exit_message.get("killed_for") == "cancel":
                raise ReproCancelled("the repro was cancelled")
            ended = _ended(exit_message, child, started)
            layers = self._layers(limits, child, r.timeout_s)
            report = finish(prepared, request, scratch, ended, layers, self.launch.warnings, "warm")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        report.data["timing"]["server_wall_s"] = round(time.monotonic() - started, 4)
        notify(on_progress, ProgressEvent("done", f"done: {report.status}"))
        return report

    def _follow(
        self,
        run_id: int,
        hard_deadline: float,
        on_progress: ProgressCallback | None,
        cancel_event: threading.Event | None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        child: dict[str, Any] = {}
        cancelled = False
        while True:
            if cancel_event is not None and cancel_event.is_set() and not cancelled:
                self._send({"op": "cancel", "id": run_id})
                cancelled = True
            if time.monotonic() > hard_deadline:
                self.close()
                raise WorkerError("the warm worker did not end the run at its deadline")
            for message in self._messages(0.05):
                if message.get("id") != run_id:
                    continue
                event = message.get("event")
                if event == "exit":
                    if message.get("error"):
                        raise WorkerError(f"the warm worker refused the run: {message['error']}")
                    return message, child
                if event == "child":
                    child = message
                else:
                    forward_progress(message, on_progress)

    def _layers(self, limits: Limits, child: dict[str, Any], timeout_s: float) -> list[Layer]:
        layers = []
        for layer in self.launch.layers:
            if layer.name in ("memory", "cpu_time", "file_size"):
                continue  # the worker has none; the child's own are listed below
            if layer.name == "network" and not self.bwrap:
                held = bool(child.get("network"))
                detail = "private network namespace (unshare in the forked child)"
                layer = Layer("network", held, detail if held else "NOT isolated")
            if layer.name == "pid_namespace":
                held = bool(child.get("pid_namespace")) or layer.held
                detail = "own PID namespace per run" if child.get("pid_namespace") else layer.detail
                layer = Layer("pid_namespace", held, detail)
            layers.append(layer)
        memory_kind = "RLIMIT_DATA" if limits.use_data_limit else "RLIMIT_AS"
        layers += [
            Layer("memory", True, f"{memory_kind} {limits.memory_mb} MB"),
            Layer("cpu_time", True, f"RLIMIT_CPU {limits.cpu_s} s"),
            Layer("file_size", True, f"RLIMIT_FSIZE {limits.file_size_mb} MB, no core files"),
            wall_clock_layer(timeout_s),
        ]
        return layers

    def close(self) -> None:
        try:
            if self.process.poll() is None:
                try:
                    self._send({"op": "exit"})
                    self.process.wait(timeout=2)
                except (WorkerError, subprocess.TimeoutExpired):
                    pass
            if self.process.poll() is None:
                with contextlib.suppress(OSError):
                    os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        finally:
            self._selector.close()
            for stream in (self.process.stdin, self.process.stdout):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()
            self._stop.set()
            self.launch.close()
            shutil.rmtree(self.scratch_root, ignore_errors=True)


def _limits_json(limits: Limits) -> dict[str, Any]:
    return {
        "memory_mb": limits.memory_mb,
        "cpu_s": limits.cpu_s,
        "file_size_mb": limits.file_size_mb,
        "use_data_limit": limits.use_data_limit,
        "nproc": 0,
    }


def _ended(message: dict[str, Any], child: dict[str, Any], started: float) -> Ended:
    code = message.get("returncode")
    # Behind a PID namespace the intermediate child reports a signal death as 128 + signal.
    if isinstance(code, int) and child.get("pid_namespace") and code > 128:
        code = 128 - code
    wall = float(message.get("wall_s") or (time.monotonic() - started))
    return Ended(code, message.get("killed_for"), wall, "")


class ReproSession:
    """Repro runs for one client (the language server): warm when possible, cold otherwise.

    `run()` blocks the calling thread until the report is ready; call it from a worker thread.
    One warm run at a time per worker; a second concurrent run simply goes cold.
    """

    def __init__(self, warm: bool = True) -> None:
        self.warm = warm and sys.platform == "linux"
        self._workers: dict[tuple[Any, ...], WarmWorker] = {}
        self._starting: dict[tuple[Any, ...], threading.Thread] = {}
        self._lock = threading.Lock()

    def run(
        self,
        path: str | Path,
        options: ReproOptions | None = None,
        *,
        on_progress: ProgressCallback | None = None,
        cancel_event: threading.Event | None = None,
    ) -> ReproReport:
        prepared = prepare(path, options)
        worker = self._ready_worker(prepared)
        if worker is not None and worker.lock.acquire(blocking=False):
            try:
                return worker.run(prepared, on_progress, cancel_event)
            except WorkerError:
                self._drop(worker)
            finally:
                worker.lock.release()
        if self.warm and prepared.resolved.device in ("cpu", "auto"):
            self.prewarm_prepared(prepared)
        return run_cold(prepared, on_progress, cancel_event)

    def prewarm(self, path: str | Path, options: ReproOptions | None = None) -> None:
        """Start a worker for runs like this one in the background (returns at once)."""
        self.prewarm_prepared(prepare(path, options))

    def prewarm_prepared(self, prepared: Prepared, wait: bool = False) -> None:
        """Start a worker for `prepared`'s key unless one exists; `wait` joins the start."""
        if not self.warm:
            return
        key = _key(prepared)
        with self._lock:
            thread = self._starting.get(key)
            if thread is None and key not in self._workers:
                thread = threading.Thread(target=self._start, args=(prepared, key), daemon=True)
                self._starting[key] = thread
                thread.start()
        if wait and thread is not None:
            thread.join()

    def _start(self, prepared: Prepared, key: tuple[Any, ...]) -> None:
        worker = None
        try:
            worker = WarmWorker(prepared)
            worker.wait_ready()
            with self._lock:
                old = self._workers.pop(key, None)
                self._workers[key] = worker
            if old is not None:
                old.close()
        except (WorkerError, OSError, RuntimeError):
            if worker is not None:
                worker.close()
        finally:
            with self._lock:
                self._starting.pop(key, None)

    def _ready_worker(self, prepared: Prepared) -> WarmWorker | None:
        with self._lock:
            worker = self._workers.get(_key(prepared))
        return worker if worker is not None and worker.serves(prepared) else None

    def _drop(self, worker: WarmWorker) -> None:
        with self._lock:
            if self._workers.get(worker.key) is worker:
                del self._workers[worker.key]
        worker.close()

    def close(self) -> None:
        with self._lock:
            workers = list(self._workers.values())
            self._workers.clear()
        for worker in workers:
            worker.close()
