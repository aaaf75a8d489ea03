"""Warm runs: a long-lived sandboxed worker per interpreter that forks a child per repro.

In: prepared runs (see prepare.py). Out: the same `ReproReport` a cold run gives, in a fraction
of the time (no interpreter start, no `import torch`, no first-optimizer imports). The worker
itself runs under the sandbox (bubblewrap, pids cgroup, minimal environment); each child adds
its own session, rlimits and, where permitted, a PID namespace. Only CPU runs are served warm,
and only by a worker that saw no accelerator: forking after CUDA initialises is unsafe, and a
forked child cannot hide devices from a torch that already counted them.

Runs of one worker share its sandbox, so the worker keeps them apart: each run gets a new
folder with an unpredictable name (its HOME and TMPDIR) that the worker creates, the worker sends
back the run's report and output itself (the server reads no file a run could have planted), and
empties every writable place afterwards. The probe package is mounted read-only (bubblewrap) and
fully imported before the first fork. A worker that could not clean up after a run says so
(`dirty`) and is replaced. bubblewrap is decided when the worker starts and again for each run
(`WarmWorker.recheck`): a run is refused, or runs cold, exactly when a cold run would differ.

A warm run is launch.py's sequence with the `OverChannel` strategy: the worker's view and plan
(both made by the same `stage` as a cold run's), started and followed over the worker's channel.

`ReproSession` is what the language server keeps: `run()` uses a ready worker when one fits and
otherwise runs cold while a worker warms up in the background for next time.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import secrets
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchls.probe.launch import (
    KILL_GRACE_S,
    OUTPUT_HEAD,
    OUTPUT_TAIL,
    REPORT_READ_LIMIT,
    LaunchSpec,
    Left,
    ProgressCallback,
    ProgressEvent,
    Run,
    Strategy,
    disk_watch,
    execute,
    forward_progress,
    make_report,
    notify,
    stage,
    wall_clock_layer,
)
from torchls.probe.options import ReproOptions, ReproUsageError
from torchls.probe.prepare import Prepared, prepare
from torchls.probe.process import WATCH_S, Ended
from torchls.probe.report import ReproReport, parse_probe_report
from torchls.probe.runner import run_cold
from torchls.probe.sandbox import (
    Layer,
    Limits,
    SandboxPlan,
    bwrap_decision,
    keep_paths,
    limit_layers,
)
from torchls.probe.scratch import RunFolder, read_tail
from torchls.probe.view import ProjectView
from torchls.records import replace

READY_TIMEOUT_S = 120.0
_CLOSING = threading.Lock()
CLOSE_JOIN_S = 10.0  # how long closing a session waits for a worker start to wind down
# How long past its deadline a worker may stay silent before it is killed as a whole.
WORKER_SLACK_S = 15.0
# The longest line read from a worker: an exit message carries a report of up to
# REPORT_READ_LIMIT bytes, which JSON escaping can make a few times longer; past this, the line
# is dropped.
MESSAGE_LIMIT = 8 * REPORT_READ_LIMIT


class WorkerError(RuntimeError):
    """The worker died or misbehaved; the run falls back to a cold start."""


# The worker's own launch: no rlimits of its own (each child sets its run's), a results folder,
# the per-run PID namespaces it makes itself.
WORKER_SPEC = LaunchSpec(worker=True, runner="warm")


def _key(prepared: Prepared) -> tuple[Any, ...]:
    options = prepared.resolved.options
    return (
        str(prepared.python),
        options.sandbox,
        options.pass_env,
        options.file_size_mb,  # sizes the worker's private tmpfs
        prepared.resolved.memory_mb,  # sizes its /dev/shm
        tuple(keep_paths([prepared.root, *prepared.read_paths])),
        # The folders seen through a copy are mounted when the worker starts.
        tuple(prepared.copied),
        options.network,
    )


class LineSplitter:
    """Splits the worker's output into lines, dropping any line longer than `limit`.

    Linear in the bytes fed: a run writing one endless line into the worker's pipe must not
    make the server re-scan what it already holds on every read (it did: 100 % CPU for the
    whole run)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._partial: list[bytes] = []  # the unfinished line, joined once it ends
        self._partial_size = 0
        self._skipping = False  # the current line went past the limit: drop it to its end

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines `chunk` completes."""
        lines = []
        *finished, rest = chunk.split(b"\n")
        for piece in finished:
            if not self._skipping and self._partial_size + len(piece) <= self.limit:
                lines.append(b"".join([*self._partial, piece]))
            self._partial.clear()
            self._partial_size = 0
            self._skipping = False
        if self._skipping:
            return lines
        if self._partial_size + len(rest) > self.limit:
            self._partial.clear()
            self._partial_size = 0
            self._skipping = True
        elif rest:
            self._partial.append(rest)
            self._partial_size += len(rest)
        return lines


class WarmWorker:
    def __init__(self, prepared: Prepared) -> None:
        self.key = _key(prepared)
        self.folder = RunFolder.create(prepared.probe_package, cold=False)
        try:
            self.project, self.launch = self._plan(prepared)
        except BaseException:
            self.folder.remove()
            raise
        self.bwrap = any(layer.name == "bubblewrap" and layer.held for layer in self.launch.layers)
        argv = [
            *self.launch.argv_prefix,
            str(prepared.python),
            "-m",
            "torchls_probe.worker",
            "--scratch",
            str(self.folder.home),
            "--results",
            str(self.folder.results),
        ]
        for folder in self.launch.private:
            argv += ["--wipe", folder]
        self.stderr_path = self.folder.stderr
        self.dirty = False
        self._closed = False
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
            self.folder.remove()
            raise WorkerError(f"the warm worker could not start: {failure[0]}")
        assert self.process.stdout is not None
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.process.stdout, selectors.EVENT_READ)
        self._lines = LineSplitter(MESSAGE_LIMIT)
        self._ids = itertools.count(1)
        self.info: dict[str, Any] | None = None
        self.lock = threading.Lock()

    def _plan(self, prepared: Prepared) -> tuple[ProjectView, SandboxPlan]:
        """The worker's project view and sandbox plan: the launch sequence's own `stage`, with
        no request (each run's comes over the channel)."""
        return stage(prepared, self.folder, WORKER_SPEC, None)

    # --- protocol ------------------------------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write((json.dumps(message) + "\n").encode("utf-8"))
            self.process.stdin.flush()
        except (OSError, ValueError) as error:  # ValueError: its pipe is already closed
            raise WorkerError(f"the warm worker is gone: {error}") from None

    def _messages(self, timeout: float) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        assert self.process.stdout is not None
        for _ready in self._selector.select(timeout):
            chunk = os.read(self.process.stdout.fileno(), 65536)
            if not chunk:
                raise WorkerError(f"the warm worker exited: {self._stderr_tail()}")
            for line in self._lines.feed(chunk):
                try:
                    message = json.loads(line)
                except (ValueError, RecursionError):  # a run's child may write anything here
                    continue
                if isinstance(message, dict):
                    found.append(message)
        return found

    def _stderr_tail(self) -> str:
        try:
            text = read_tail(self.stderr_path, 8192).decode("utf-8", "replace")
        except OSError:
            return "no stderr"
        lines = text.splitlines()
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
        if info is None or self.dirty or self.process.poll() is not None:
            return False
        if sys.platform != "linux":
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
        data = execute(
            prepared,
            LaunchSpec(runner="warm", start_message="forking warm interpreter"),
            self.folder,
            OverChannel(self),
            started=started,
            on_progress=on_progress,
            cancel_event=cancel_event,
        )
        report = make_report(prepared, data, started)
        notify(on_progress, ProgressEvent("done", f"done: {report.status}"))
        return report

    def recheck(self, mode: str) -> None:
        """Decide bubblewrap again for one run, as a cold run would (`bwrap_decision`: a pass
        is remembered for a moment, a failure is retried with a back-off): a bubblewrap that is
        installed but fails refuses the run (`SandboxRefused`), and a decision other than the
        one the worker was started with sends the run cold (`WorkerError`), so a run is never
        weaker, nor stronger, than a cold run would be now."""
        found = bwrap_decision(mode)
        if (found.state == "works") != self.bwrap:
            raise WorkerError(
                f"bubblewrap is {found.state} now, not as when the warm worker started"
            )

    def _follow(
        self,
        run_id: int,
        token: str,
        hard_deadline: float,
        on_progress: ProgressCallback | None,
        cancel_event: threading.Event | None,
        watch: Callable[[], str | None] | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any], str | None]:
        """The run's exit message, its child record, and why the server stopped it (what
        `watch`, called about every WATCH_S, returned), or None."""
        child: dict[str, Any] = {}
        cancelled = False
        stopped_for: str | None = None
        next_watch = time.monotonic() + WATCH_S
        while True:
            if cancel_event is not None and cancel_event.is_set() and not cancelled:
                self._send({"op": "cancel", "id": run_id})
                cancelled = True
            if watch is not None and not cancelled and time.monotonic() >= next_watch:
                stopped_for = watch()
                if stopped_for is not None:
                    self._send({"op": "cancel", "id": run_id})
                    cancelled = True
                next_watch = time.monotonic() + WATCH_S
            if time.monotonic() > hard_deadline:
                self.close()
                raise WorkerError("the warm worker did not end the run at its deadline")
            for message in self._messages(0.05):
                if message.get("id") != run_id or message.get("token") != token:
                    continue
                event = message.get("event")
                if event == "exit":
                    if message.get("error"):
                        raise WorkerError(f"the warm worker refused the run: {message['error']}")
                    return message, child, stopped_for
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
            if layer.name == "capabilities" and child.get("capabilities_dropped") is False:
                # The run's own user namespace gave it capabilities the worker could not drop.
                layer = Layer("capabilities", False, "NOT dropped in the run's user namespace")
            layers.append(layer)
        # The run's own rlimits, worded as a cold run's (one description: sandbox.limit_layers).
        layers += [*limit_layers(limits), wall_clock_layer(timeout_s)]
        return layers

    def close(self) -> None:
        with _CLOSING:  # a starting worker can be closed by its session and its own thread
            if self._closed:
                return
            self._closed = True
        try:
            # No goodbye: the worker keeps nothing worth saving, and waiting for it made an
            # editor's shutdown request time out. Its runs die with it (PDEATHSIG, and the PID
            # namespace under bubblewrap).
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
            self.folder.remove()


class OverChannel(Strategy):
    """A warm run: the worker's project copy (renewed) and sandbox plan instead of new ones,
    the run started and followed over the worker's channel instead of `supervise`, its report
    and output read from the worker's exit message, its layers the worker's and the child's."""

    def __init__(self, worker: WarmWorker) -> None:
        self.worker = worker
        self.exit: dict[str, Any] = {}
        self.child: dict[str, Any] = {}

    def request(self, prepared: Prepared, folder: RunFolder) -> dict[str, Any]:
        return prepared.request(None, None)  # the worker picks the run's own folder

    def stage(
        self, prepared: Prepared, folder: RunFolder, spec: LaunchSpec, request: dict[str, Any]
    ) -> tuple[ProjectView, SandboxPlan]:
        worker = self.worker
        worker.recheck(prepared.resolved.options.sandbox)
        try:
            # What an earlier run wrote into the project's copy, and the user's edits since.
            worker.project.reset()
        except (OSError, ReproUsageError) as error:
            worker.dirty = True
            raise WorkerError(f"the project's copy could not be renewed: {error}") from None
        if worker.project.linked:
            request["cwd"] = str(worker.project.copy_of(prepared.cwd))
        return worker.project, worker.launch

    def start(self, run: Run) -> Ended:
        worker, r = self.worker, run.prepared.resolved
        run_id = next(worker._ids)
        # Only the worker knows it (never the run's child): messages without it are not ours.
        token = secrets.token_hex(16)
        # The project's copies are on the host's disk, as in a cold run: they may grow by the
        # file-size limit in all, then the run is stopped (TL906, stopped_by "disk").
        watch = disk_watch(run.view, r.options.file_size_mb)
        deadline_s = r.timeout_s + KILL_GRACE_S
        worker._send(
            {
                "op": "run",
                "id": run_id,
                "token": token,
                "request": run.request,
                "limits": _limits_json(run.limits),
                "deadline_s": deadline_s,
                "network": not worker.bwrap and not r.options.network,
                "report_limit": REPORT_READ_LIMIT,
                "output_head": OUTPUT_HEAD,
                "output_tail": OUTPUT_TAIL,
            }
        )
        hard_deadline = run.started + deadline_s + WORKER_SLACK_S
        self.exit, self.child, stopped_for = worker._follow(
            run_id, token, hard_deadline, run.on_progress, run.cancel_event, watch
        )
        # Whatever this run left could not all be removed: no later run may inherit it.
        worker.dirty = worker.dirty or self.exit.get("dirty") is not False
        ended = _ended(self.exit, self.child, run.started)
        if stopped_for is not None:  # the worker saw a cancel; the reason is ours
            ended = replace(ended, killed_for=stopped_for)
        return ended

    def collect(self, run: Run, ended: Ended) -> Left:
        return _left(self.exit)

    def layers(self, run: Run, ended: Ended) -> list[Layer]:
        return self.worker._layers(run.limits, self.child, run.prepared.resolved.timeout_s)

    def close(self, run: Run) -> None:
        """Nothing: the plan is the worker's, closed with it."""


def _limits_json(limits: Limits) -> dict[str, Any]:
    return {
        "memory_mb": limits.memory_mb,
        "cpu_s": limits.cpu_s,
        "file_size_mb": limits.file_size_mb,
        "use_data_limit": limits.use_data_limit,
        "nproc": 0,
    }


def _left(message: dict[str, Any]) -> Left:
    """The report and output the worker read back for the run. A run's child can write on the
    same channel, so every field is checked and bounded like a file from the scratch folder."""
    text = message.get("report")
    problem = message.get("report_problem")
    if isinstance(text, str) and len(text) <= REPORT_READ_LIMIT:
        data, why = parse_probe_report(text)
    else:
        data, why = None, None if text is None else "the report sent by the worker is unusable"
    if data is None and why is None and isinstance(problem, str):
        why = problem[:500]
    raw = message.get("output")
    raw = raw if isinstance(raw, dict) else {}
    size = raw.get("bytes")
    output: dict[str, Any] = {
        "bytes": size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else 0,
        "head": str(raw.get("head") or "")[:OUTPUT_HEAD],
        "tail": str(raw.get("tail") or "")[:OUTPUT_TAIL],
        "truncated": raw.get("truncated") is True,
    }
    if isinstance(raw.get("note"), str):
        output["note"] = raw["note"][:500]
    return Left(data, why, output)


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
        self._launching: set[WarmWorker] = set()  # started, not yet ready
        self._closed = False
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
        if prepared.resolved.options.nproc is not None:
            # Under torchrun every rank is a fresh interpreter: no worker to fork from.
            return run_cold(prepared, on_progress, cancel_event)
        worker = self._ready_worker(prepared)
        if worker is not None and worker.lock.acquire(blocking=False):
            try:
                if worker.serves(prepared):  # checked again under the lock: not dirty since
                    return worker.run(prepared, on_progress, cancel_event)
            except WorkerError:
                self._drop(worker)
            finally:
                if worker.dirty:  # replaced before the next run, which would inherit the mess
                    self._drop(worker)  # still holding its lock: nobody runs on it meanwhile
                    self.prewarm_prepared(prepared)
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
            if self._closed:
                return
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
            with self._lock:
                adopted = not self._closed
                if adopted:
                    self._launching.add(worker)
            if adopted:
                worker.wait_ready()
            with self._lock:
                self._launching.discard(worker)
                # A session closed while this worker started must not leave it (and its
                # folder) behind: close() only sees the workers it can find.
                adopted = adopted and not self._closed
                old = self._workers.pop(key, None) if adopted else None
                if adopted:
                    self._workers[key] = worker
            if old is not None:
                old.close()
            if not adopted:
                worker.close()
        except (WorkerError, OSError, RuntimeError, ValueError):
            # ValueError: close() shut the worker's pipes while it was still starting.
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
        """Stop every worker, the ones still starting included; the session runs cold after."""
        with self._lock:
            self._closed = True
            workers = [*self._workers.values(), *self._launching]
            self._workers.clear()
            self._launching.clear()
            starting = list(self._starting.values())
        for worker in workers:
            worker.close()
        for thread in starting:  # they only finish closing what they started
            thread.join(timeout=CLOSE_JOIN_S)
