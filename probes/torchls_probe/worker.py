"""`python -m torchls_probe.worker --scratch DIR --results DIR [--wipe DIR]...`: a warm parent
that forks one fresh child per repro.

In: JSON lines on stdin — `{"op": "run", "id", "request", "limits", "deadline_s", "network",
"report_limit", "output_head", "output_tail"}`, `{"op": "cancel", "id"}`, `{"op": "exit"}`. Out:
JSON lines on stdout — `ready` (once torch and every probe module are loaded), `started`, the
child's `progress` and `child` (isolation) events, and `exit` with the child's status, its report
(text, or why it was refused) and output, and `dirty` when what the run left could not all be
removed. The parent sets `torch.set_num_threads(1)` before any torch op: a fork after OpenMP
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


def send(message: dict[str, Any]) -> None:
    # The leading newline ends any unterminated line a run's child wrote on the shared channel,
    # so that this message is read on its own.
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
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
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

    def serve(self) -> None:
        buffer = b""
        while True:
            # Poll fast while a child runs (its exit is noticed within 5 ms), lazily otherwise.
            ready, _, _ = select.select([0], [], [], 0.005 if self.child else 0.5)
            if ready:
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
        message = {**message, "request": request, "folder": folder, "results": results}
        channel = os.dup(_OUT)
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                code = child_main(message, self.info["threads"], channel)
            except BaseException:
                code = 3
            finally:
                os._exit(code)
        os.close(channel)
        self.message = message
        self.child, self.child_id = pid, message.get("id")
        self.started = time.monotonic()
        self.deadline = self.started + float(message.get("deadline_s", 60.0))
        self.killed_for = None
        send({"event": "started", "id": self.child_id})

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
        wall = round(time.monotonic() - self.started, 4)
        left = self._collect_files()
        send(
            {
                "event": "exit",
                "id": self.child_id,
                "returncode": os.waitstatus_to_exitcode(status),
                "killed_for": self.killed_for,
                "wall_s": wall,
                **left,
            }
        )
        self.child = None
        self.child_id = None

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
        """Kill and reap the run's process group until it is empty, so that a finished run has
        left nothing behind when its `exit` is sent (bounded: 10 s)."""
        end = time.monotonic() + 10.0
        while time.monotonic() < end:
            try:
                os.killpg(group, signal.SIGKILL)
            except OSError:
                return
            self._collect()
            time.sleep(0.005)


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
    from torchls_probe.isolation import become_subreaper

    become_subreaper()
    send({"event": "ready", "pid": os.getpid(), **info})
    Worker(info, args.scratch, args.results, args.wipe).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
