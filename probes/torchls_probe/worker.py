"""`python -m torchls_probe.worker --scratch DIR --results DIR [--wipe DIR]...`: a warm parent
that forks one fresh child per repro.

In: JSON lines on stdin — `{"op": "run", "id", "request", "limits", "deadline_s", "network",
"report_limit", "output_head", "output_tail"}`, `{"op": "cancel", "id"}`, `{"op": "exit"}`. Out:
JSON lines on stdout — `ready` (once torch and every probe module are loaded), `started`, the
child's `progress` and `child` (isolation) events, and `exit` with the child's status, its report
(text, or why it was refused) and output, and `dirty` when what the run left could not all be
removed. Every message about a run carries the run's `id` and the `token` the server sent with
it.

The channel to the server is the worker's alone: a run's child never holds it. Each run gets a
pipe of its own that only this worker reads; what the child writes there is parsed, checked,
re-serialised and stamped with the run's id and token by the worker (nothing else is
forwarded), and `exit` is sent only after the child and every process it left (its group, and
any orphan re-parented to this subreaper) have been killed and reaped. The worker is not
dumpable, so a run cannot reach the channel through /proc either.

The parent sets `torch.set_num_threads(1)` before any torch op: a fork after OpenMP
started its pool deadlocks the child's first parallel op (measured here); the child restores the
thread count a fresh interpreter would have had.

Between runs: each run gets its own new folder under `--scratch` (its HOME and TMPDIR) and one
under `--results` (its report and output: a tmpfs of its own under bubblewrap, so that code
filling its HOME does not lose its report), both with unpredictable names; afterwards the parent
reads the results back without trusting them (runfiles.py) and empties the scratch, the results
and every `--wipe` folder (the sandbox's private /tmp, /var/tmp, /dev/shm), so no run sees, or
is crowded out by, what an earlier one left. Every probe module is imported before the first
fork, so a run that rewrites the probe's files (possible without bubblewrap's read-only mount)
changes nothing in later runs.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import pkgutil
import select
import signal
import sys
import tempfile
import time
from typing import Any

_OUT = 1  # protocol channel; written with os.write only, so nothing buffered crosses a fork
RUN_LINE_LIMIT = 8192  # the longest line taken from a run's pipe (progress lines are < 4000)
RUN_MESSAGE_LIMIT = 20_000  # messages forwarded per run; a flood past this is dropped


def send(message: dict[str, Any]) -> None:
    data = ("\n" + json.dumps(message, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
    view = memoryview(data)
    while view:
        view = view[os.write(_OUT, view) :]


def warm_up() -> dict[str, Any]:
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # never initialise CUDA here
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    # Lazy imports (the first optimizer pulls in torch._dynamo) and the probe's own modules are
    # paid for here, once, instead of in every child.
    from torchls_probe import runner  # noqa: F401
    from torchls_probe.attribution import UserCode
    from torchls_probe.hooks import Hooks
    from torchls_probe.params import Roots
    from torchls_probe.progress import Progress
    from torchls_probe.tracer import Trace, Tracer

    _load_every_probe_module()
    user = UserCode([], [], [])
    trace = Trace(user, 8, 8, 8)
    hooks = Hooks(trace, Roots(user), 1000, 1000, Progress(None))
    undo = hooks.install()
    try:
        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with Tracer(trace, 4):
            loss = torch.nn.functional.cross_entropy(model(torch.ones(3, 4)), torch.zeros(3).long())
            loss.backward()
            optimizer.step()
    finally:
        undo()
    cuda = bool(torch.version.cuda) and bool(torch.cuda.is_available())
    mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    return {"threads": threads, "cuda": cuda, "mps": mps, "torch": torch.__version__}


def _load_every_probe_module() -> None:
    """Children are forked from here: modules loaded now are never read from disk again."""
    import torchls_probe

    for module in pkgutil.iter_modules(torchls_probe.__path__):
        if module.name not in ("__main__", "worker"):
            importlib.import_module(f"torchls_probe.{module.name}")


def child_main(message: dict[str, Any], threads: int, channel: int) -> int:
    """In the forked child: isolate, then run the probe exactly as a cold run would."""
    started = time.monotonic()
    from torchls_probe import isolation
    from torchls_probe.progress import Progress
    from torchls_probe.request import parse_request

    os.setsid()
    isolation.die_with_parent()
    folder = message["folder"]
    os.environ["HOME"] = os.environ["TMPDIR"] = folder
    tempfile.tempdir = folder
    # The worker's stdin and stdout are its channel with the server: the run holds neither.
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    isolation.apply_limits(message.get("limits") or {})
    held = isolation.new_namespaces(bool(message.get("network")))
    run_id = message.get("id")
    progress = Progress(channel, tag=run_id)
    os.write(channel, (json.dumps({"event": "child", "id": run_id, **held}) + "\n").encode())
    if held["pid_namespace"]:
        # The first child in the new namespace is its init: when it dies, so does every process
        # it left behind, whatever they did with setsid().
        pid = os.fork()
        if pid != 0:
            _, status = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code
        isolation.die_with_parent()
    import torch

    torch.set_num_threads(threads)
    from torchls_probe.runner import run

    return run(parse_request(message["request"]), progress, started)


class Worker:
    def __init__(self, info: dict[str, Any], scratch: str, results: str, wipe: list[str]) -> None:
        from torchls_probe.runfiles import Shared

        self.info = info
        self.scratch = scratch
        self.results = results
        self.shared = []
        for folder in dict.fromkeys([scratch, results, *wipe]):
            with contextlib.suppress(OSError):  # a folder this system lacks
                self.shared.append(Shared(folder))
        self.child: int | None = None
        self.child_id: Any = None
        self.message: dict[str, Any] = {}
        self.deadline = 0.0
        self.started = 0.0
        self.killed_for: str | None = None
        self.token: Any = None
        self.pipe: int | None = None  # the read end of the run's own channel
        self.pipe_buffer = b""
        self.forwarded = 0

    def serve(self) -> None:
        buffer = b""
        while True:
            # Poll fast while a child runs (its exit is noticed within 5 ms), lazily otherwise.
            watched = [0] if self.pipe is None else [0, self.pipe]
            ready, _, _ = select.select(watched, [], [], 0.005 if self.child else 0.5)
            if self.pipe is not None and self.pipe in ready:
                self.relay()
            if 0 in ready:
                chunk = os.read(0, 65536)
                if not chunk:
                    self.kill("exit")
                    return
                *lines, buffer = (buffer + chunk).split(b"\n")
                for line in lines:
                    if line.strip() and self.handle(json.loads(line)) == "exit":
                        self.kill("exit")
                        return
            self.reap()

    def relay(self) -> None:
        """Forward what the run wrote on its pipe, as the worker's own, checked messages."""
        assert self.pipe is not None
        try:
            chunk = os.read(self.pipe, 65536)
        except OSError:
            chunk = b""
        if not chunk:  # every writer closed it: the run is over or gave it up
            self._close_pipe()
            return
        *lines, rest = (self.pipe_buffer + chunk).split(b"\n")
        self.pipe_buffer = rest if len(rest) <= RUN_LINE_LIMIT else b""
        for line in lines:
            if len(line) > RUN_LINE_LIMIT or self.forwarded >= RUN_MESSAGE_LIMIT:
                continue
            checked = _checked(line)
            if checked is not None:
                self.forwarded += 1
                self.send(checked)

    def send(self, message: dict[str, Any]) -> None:
        send({**message, "id": self.child_id, "token": self.token})

    def _close_pipe(self) -> None:
        if self.pipe is not None:
            with contextlib.suppress(OSError):
                os.close(self.pipe)
        self.pipe = None
        self.pipe_buffer = b""

    def handle(self, message: dict[str, Any]) -> str | None:
        op = message.get("op")
        if op == "exit":
            return "exit"
        if op == "cancel" and message.get("id") == self.child_id:
            self.kill("cancel")
        elif op == "run":
            self.start(message)
        return None

    def start(self, message: dict[str, Any]) -> None:
        if self.child is not None:
            send({"event": "exit", "id": message.get("id"), "error": "busy"})
            return
        try:
            folder = tempfile.mkdtemp(prefix="run-", dir=self.scratch)
            results = tempfile.mkdtemp(prefix="run-", dir=self.results)
        except OSError as error:
            send({"event": "exit", "id": message.get("id"), "error": f"no run folder: {error}"})
            return
        request = dict(message.get("request") or {})
        request["out"] = os.path.join(results, "report.json")
        request["output_file"] = os.path.join(results, "output.txt")
        token = message.get("token")
        # The child never sees the token: it is what tells the server's reader our messages.
        message = {
            **{k: v for k, v in message.items() if k != "token"},
            "request": request,
            "folder": folder,
            "results": results,
        }
        reader, writer = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                os.close(reader)
                code = child_main(message, self.info["threads"], writer)
            except BaseException:
                code = 3
            finally:
                os._exit(code)
        os.close(writer)
        self.pipe, self.pipe_buffer, self.forwarded = reader, b"", 0
        self.message = message
        self.child, self.child_id, self.token = pid, message.get("id"), token
        self.started = time.monotonic()
        self.deadline = self.started + float(message.get("deadline_s", 60.0))
        self.killed_for = None
        self.send({"event": "started"})

    def kill(self, reason: str) -> None:
        if self.child is None:
            return
        self.killed_for = self.killed_for or reason
        with contextlib.suppress(OSError):
            os.killpg(self.child, signal.SIGKILL)
        if reason == "exit":
            self._drain(self.child)

    def reap(self) -> None:
        if self.child is not None and time.monotonic() > self.deadline and not self.killed_for:
            self.kill("deadline")
        status = self._collect()
        if status is None or self.child is None:
            return
        self._drain(self.child)
        if self.pipe is not None:  # progress the child wrote just before it ended
            while self.pipe is not None and select.select([self.pipe], [], [], 0)[0]:
                self.relay()
            self._close_pipe()
        wall = round(time.monotonic() - self.started, 4)
        left = self._collect_files()
        self.send(
            {
                "event": "exit",
                "returncode": os.waitstatus_to_exitcode(status),
                "killed_for": self.killed_for,
                "wall_s": wall,
                **left,
            }
        )
        self.child = None
        self.child_id = None
        self.token = None

    def _collect_files(self) -> dict[str, Any]:
        """The run's report and output, then a clean slate for the next run."""
        from torchls_probe.runfiles import read_output, read_report, remove_tree

        message, results = self.message, self.message["results"]
        report, problem = read_report(
            os.path.join(results, "report.json"), int(message.get("report_limit", 16 << 20))
        )
        output = read_output(
            os.path.join(results, "output.txt"),
            int(message.get("output_head", 4096)),
            int(message.get("output_tail", 4096)),
        )
        remove_tree(results)
        remove_tree(message["folder"])
        clean = all([shared.clear() for shared in self.shared])
        return {"report": report, "report_problem": problem, "output": output, "dirty": not clean}

    def _collect(self) -> int | None:
        """Reap every finished descendant (we are their subreaper); the run's child's status."""
        found = None
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return found
            if pid == 0:
                return found
            if pid == self.child:
                found = status

    def _drain(self, group: int) -> None:
        """Kill and reap the run's process group until it is empty, then every process the run
        left that was re-parented to us (it called setsid() to leave the group), so that a
        finished run has left nothing behind when its `exit` is sent (bounded: 10 s)."""
        from torchls_probe.isolation import children_of

        end = time.monotonic() + 10.0
        while time.monotonic() < end:
            try:
                os.killpg(group, signal.SIGKILL)
            except OSError:
                break
            self._collect()
            time.sleep(0.005)
        me = os.getpid()
        while time.monotonic() < end:
            left = children_of(me)
            if not left:
                return
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            self._collect()
            time.sleep(0.005)


def _checked(line: bytes) -> dict[str, Any] | None:
    """A run's line as the worker will forward it, or None: only known events, known fields."""
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(message, dict):
        return None
    event = message.get("event")
    if event == "progress":
        checked: dict[str, Any] = {
            "event": "progress",
            "stage": str(message.get("stage", ""))[:40],
            "message": str(message.get("message", ""))[:400],
        }
        for key in ("step", "total"):
            value = message.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                checked[key] = value
        return checked
    if event == "child":
        held = {
            k: v
            for k, v in message.items()
            if isinstance(k, str) and len(k) <= 40 and isinstance(v, bool)
        }
        return {**dict(list(held.items())[:16]), "event": "child"}
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchls_probe.worker")
    parser.add_argument("--scratch", required=True, help="folder for the runs' own folders")
    parser.add_argument("--results", required=True, help="folder for the runs' reports")
    parser.add_argument("--wipe", action="append", default=[], help="emptied after each run")
    args = parser.parse_args(argv)
    try:
        info = warm_up()
    except BaseException as error:
        send({"event": "failed", "error": f"{type(error).__name__}: {error}"})
        return 1
    from torchls_probe.isolation import become_subreaper, not_dumpable

    become_subreaper()
    not_dumpable()
    send({"event": "ready", "pid": os.getpid(), **info})
    Worker(info, args.scratch, args.results, args.wipe).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
