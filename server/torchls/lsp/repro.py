"""The bounded repro in the editor: the "Run bounded repro" action and the repro commands.

In:
- `textDocument/codeAction` on a line inside a training loop or a train-step function (only in
  trusted workspaces): one action, "Run bounded repro", running the command below;
- `workspace/executeCommand` `torchls.runRepro` with one argument `{"uri", "device"?,
  "steps"?}`, and `torchls.clearRepro` with `{"uri"}` (or nothing: clear every run);
- settings `torchls.probe.device|steps|timeout|memory|python|nproc|...`.

Out: `window/workDoneProgress` begin/report/end following the probe's stages (repro_progress;
cancelling sets the run's cancel event, which kills its sandbox within the probe's 50 ms poll
interval), the run's findings and traces in `ReproStore` (published through the diagnostics
layer in repro_diagnostics, shown by the hover in repro_hover), and a message for everything
else the user must know (with the setting that fixes it). The command answers with
`{"status", "message", ...}` once the run is over. (`$/cancelRequest` on the command is not a
way to cancel: pygls answers it without stopping the handler; the progress bar's cancel is.)

Clients that do not announce `window.workDoneProgress` (eglot) wait on the command's answer
with a request timeout (eglot's is 10 s, blocking the editor meanwhile) and show no progress,
so for them the command answers `{"status": "started"}` as soon as the run is accepted, and the
run reports later: its findings as diagnostics and a short `window/showMessage` (eglot ignores
`window/logMessage`).

Threads: the probe call blocks, so each run gets a dedicated thread that lives as long as the
run does (bubblewrap's die-with-parent is tied to the thread that started it); the event loop
only awaits a future the thread resolves, so diagnostics and hovers keep flowing. The analysis
worker is never used for a run. One `ReproSession` serves the server: the first run is cold and
starts a warm worker meanwhile, so later runs fork an interpreter that already imported torch.
A new run on a document cancels the one in flight on it.

Shutting down: `shutdown` is answered at once (eglot kills a server that takes more than 1.5 s);
the runs are cancelled and the session is closed on a thread of its own, which `exit` (the
interpreter's exit) waits for, so a server that is allowed to exit leaves no folder behind. A
server killed right after `exit` (eglot again) is cleaned up after by `leftovers`: the helper
started with the session removes this server's folders once it is gone, and every server
removes the folders of dead servers at start-up.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lsprotocol import types
from pygls.capabilities import get_capability
from pygls.exceptions import JsonRpcInvalidParams
from pygls.uris import to_fs_path

from torchls.analysis.source import split_lines
from torchls.lsp import plaintext
from torchls.lsp import repro_messages as messages
from torchls.lsp.commands import CLEAR_REPRO, REPRO_KIND, RUN_REPRO  # names other features offer
from torchls.lsp.repro_diagnostics import ProbeDiagnostics
from torchls.lsp.repro_lookup import Region, repro_regions
from torchls.lsp.repro_progress import ReproProgress
from torchls.lsp.repro_state import ReproResult, build_result, read_baseline, real_path
from torchls.lsp.server import Snapshot, TorchLanguageServer
from torchls.lsp.settings import ProbeSettings, script_arguments
from torchls.probe import leftovers, untrusted
from torchls.records import field, record

if TYPE_CHECKING:
    from torchls.probe import ProgressEvent, ReproOptions, ReproSession

logger = logging.getLogger(__name__)

ACTION_TITLE = "Run bounded repro"


# -- arguments and options ------------------------------------------------------------------------


@record(frozen=True)
class RunRequest:
    """`torchls.runRepro`'s argument: what the CLI's flags say, for one run (None: the
    settings', else `[tool.torchls.probe]`'s value)."""

    uri: str
    device: str | None = None
    steps: int | None = None
    args: tuple[str, ...] | None = None
    spec: str | None = None
    cwd: str | None = None
    writable: tuple[str, ...] | None = None


def parse_run_arguments(arguments: tuple[Any, ...]) -> RunRequest:
    """The one argument of `torchls.runRepro`, checked (an invalid one is the caller's bug)."""
    if len(arguments) != 1 or not isinstance(arguments[0], Mapping):
        raise JsonRpcInvalidParams(
            f'{RUN_REPRO} takes one argument: {{"uri", "device"?, "steps"?, "args"?, '
            '"spec"?, "cwd"?, "writable"?}}'
        )
    argument = arguments[0]
    uri, device, steps = argument.get("uri"), argument.get("device"), argument.get("steps")
    if not isinstance(uri, str) or not uri:
        raise JsonRpcInvalidParams(f"{RUN_REPRO}: `uri` must be a document URI")
    if device is not None and not isinstance(device, str):
        raise JsonRpcInvalidParams(f"{RUN_REPRO}: `device` must be a string such as 'cpu'")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise JsonRpcInvalidParams(f"{RUN_REPRO}: `steps` must be a positive integer")
    args = argument.get("args")
    if args is not None:
        parsed = script_arguments(args)
        if parsed is None:
            raise JsonRpcInvalidParams(f"{RUN_REPRO}: `args` must be a string or strings")
        args = parsed
    for key in ("spec", "cwd"):
        value = argument.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            raise JsonRpcInvalidParams(f"{RUN_REPRO}: `{key}` must be a path")
    writable = argument.get("writable")
    if writable is not None:
        if not isinstance(writable, list) or not all(isinstance(w, str) for w in writable):
            raise JsonRpcInvalidParams(f"{RUN_REPRO}: `writable` must be a list of folders")
        writable = tuple(writable)
    return RunRequest(uri, device, steps, args, argument.get("spec"), argument.get("cwd"), writable)


def choose_python(setting: str | None, root: Path, project: str | None = None) -> tuple[str, str]:
    """(interpreter, why it was chosen): the setting (which the VS Code extension fills with
    the selected interpreter), else `[tool.torchls.probe] python`, else what `torchls repro`
    would choose (`torchls.probe.locate.choose_python`: the project's virtual environment, the
    server's own interpreter when it has torch, `python3`)."""
    from torchls.probe.locate import choose_python as locate_python

    if setting:
        return setting, f"`{messages.PYTHON_SETTING}`"
    if project:
        return project, "`python` in [tool.torchls.probe]"
    found, reason = locate_python(None, root)
    return str(found), reason


def probe_options(
    path: str,
    root: Path,
    probe: ProbeSettings,
    device: str | None = None,
    steps: int | None = None,
    request: RunRequest | None = None,
) -> tuple[ReproOptions, str, str]:
    """(options, interpreter, why it was chosen) for a run of `path` from the editor: the
    editor's repro and the workflows (compare, inspect) share this one reading. Reads the
    project file, so it runs on a worker thread, never on the event loop."""
    from torchls.config import config_or_defaults
    from torchls.probe import ReproOptions
    from torchls.probe.options import with_project

    # The same [tool.torchls.probe] reading as `torchls repro`: settings win, the project
    # file fills the rest (a broken file was already reported as a warning).
    project = config_or_defaults(path)[0].probe
    python, source = choose_python(probe.python, root, project.get("python"))
    request = request or RunRequest("")

    def relative(value: str | None) -> str | None:
        # Paths in a command argument or a setting are the workspace's (the CLI's: the shell's).
        return str(root / Path(value).expanduser()) if value else None

    args = request.args if request.args is not None else probe.args
    writable = request.writable if request.writable is not None else probe.writable
    options = with_project(
        ReproOptions(
            device=device or request.device or probe.device,
            steps=steps or request.steps or probe.steps,
            timeout_s=probe.timeout,
            memory_mb=probe.memory,
            python=python,
            root=str(root),
            argv=args or (),
            spec=relative(request.spec or probe.spec),
            cwd=relative(request.cwd or probe.cwd),
            writable=tuple(str(relative(w)) for w in writable or ()),
            network=bool(probe.network),
            nproc=probe.nproc,
            # Only the user's own settings reach this: a project file cannot name it.
            sandbox=probe.sandbox or "auto",
        ),
        project,
    )
    if options.cwd is None:
        # The editor launches from the workspace: that is where relative paths are read.
        from torchls.records import replace

        options = replace(options, cwd=str(root))
    return options, python, source


# -- running --------------------------------------------------------------------------------------


@record
class Finished:
    report_data: dict[str, Any]
    # The report sorted by file, with the lines of the files it names read (safely, once) on
    # the run's thread, never on the event loop. Its run id is given when it is delivered.
    result: ReproResult
    python: str
    python_source: str


@record
class Failed:
    message: str


@record
class Cancelled:
    pass


Outcome = Finished | Failed | Cancelled


@record
class ActiveRun:
    uri: str
    cancel: threading.Event = field(default_factory=threading.Event)
    finished: asyncio.Event = field(default_factory=asyncio.Event)  # its processes are gone
    started: bool = False  # its thread is running (and will set `finished` when done)
    superseded: bool = False


def announces_progress(server: TorchLanguageServer) -> bool:
    """Whether the client shows work-done progress (and so can wait for a run's answer)."""
    return bool(get_capability(server.client_capabilities, "window.work_done_progress", False))


def _close_quietly(session: ReproSession) -> None:
    try:
        session.close()
    except Exception:  # shutting down must always succeed
        logger.exception("closing the repro session failed")


class ReproController:
    """The repro features of one server: runs in flight, the warm session, code action regions."""

    def __init__(self, server: TorchLanguageServer) -> None:
        self.server = server
        self.active: dict[str, ActiveRun] = {}
        self.run_ids = itertools.count(1)
        self._session: ReproSession | None = None
        self._session_lock = threading.Lock()
        self._closed = False
        self._closers: list[threading.Thread] = []
        # Runs whose command already answered (clients without progress); referenced here
        # because the event loop keeps only weak references to tasks.
        self._detached: set[asyncio.Task[None]] = set()
        self._regions: dict[str, tuple[tuple[int | None, str], list[Region]]] = {}
        # Why earlier runs had fewer protections than the full set: each cause is told once
        # per session (a cold run and the warm worker word the same cause differently).
        self._sandbox_told: set[str] = set()

    # -- the warm session --

    def session(self) -> ReproSession:
        """Created on the first run, from the run's thread (importing the probe costs ~0.1 s,
        which the event loop should not pay). Its first run is cold and starts the warm worker
        that later runs fork from."""
        with self._session_lock:
            if self._closed:
                raise RuntimeError("the server is shutting down")
            if self._session is None:
                from torchls.probe import ReproSession

                # Removes this server's folders should it be killed before it can.
                leftovers.watch_this_process()
                self._session = ReproSession(warm=True)
                atexit.register(self.close)
            return self._session

    def begin_close(self) -> None:
        """At `shutdown`: cancel every run and close the session on a thread of its own, so
        that the answer never waits for a worker to stop."""
        for run in self.active.values():
            run.cancel.set()
        for task in list(self._detached):
            task.cancel()
        with self._session_lock:
            self._closed = True
            session, self._session = self._session, None
        if session is not None:
            closer = threading.Thread(
                target=_close_quietly, args=(session,), name="torchls-repro-close", daemon=True
            )
            closer.start()
            self._closers.append(closer)

    def close(self) -> None:
        """At exit: the same, then wait until the session is closed and its folders are gone."""
        self.begin_close()
        for closer in self._closers:
            closer.join()

    # -- the command --

    async def run(self, *arguments: Any) -> dict[str, Any]:
        request = parse_run_arguments(arguments)
        server = self.server
        if not server.trusted:
            return self._tell("refused", messages.UNTRUSTED, types.MessageType.Error)
        path = to_fs_path(request.uri)
        if path is None or not Path(path).is_file():
            return self._tell(
                "failed",
                "torchls: the repro runs a file saved on disk; save this document as a .py "
                "file first.",
                types.MessageType.Error,
            )
        if announces_progress(server):
            return await self._run(request, path, detached=False)
        task = asyncio.ensure_future(self._run_detached(request, path))
        self._detached.add(task)
        task.add_done_callback(self._detached.discard)
        message = (
            f"torchls: running the repro of {Path(path).name}; its findings will appear as "
            "diagnostics."
        )
        self._show(message, types.MessageType.Info)
        return {"status": "started", "message": message}

    async def _run_detached(self, request: RunRequest, path: str) -> None:
        """A run whose command has answered: nobody awaits it, so it must not raise."""
        try:
            await self._run(request, path, detached=True)
        except asyncio.CancelledError:
            pass  # the server is shutting down; begin_close stopped the run
        except Exception:
            logger.exception("the repro of %s failed", path)
            self._show(
                f"torchls: the repro of {Path(path).name} failed (see the server's log).",
                types.MessageType.Error,
            )

    async def _run(self, request: RunRequest, path: str, detached: bool) -> dict[str, Any]:
        server = self.server
        await server.wait_for_settings()
        probe = server.settings.probe
        # A loop, not an if: two new runs may both have waited for the same old one.
        while (previous := self.active.get(request.uri)) is not None:
            previous.superseded = True
            previous.cancel.set()
            await previous.finished.wait()  # its sandbox is gone before the new one starts
            if self.active.get(request.uri) is previous:
                del self.active[request.uri]
        active = self.active[request.uri] = ActiveRun(request.uri)
        unsaved = self._unsaved(request.uri, path)
        title = f"torchls repro: {Path(path).name}"
        progress = ReproProgress(server, None)
        try:
            progress = await ReproProgress.start(server, title, active.cancel)
            outcome = await self._execute(request, path, probe, active, progress)
        except BaseException:
            progress.end("stopped")  # the request went away (or a bug): close the bar anyway
            raise
        finally:
            if self.active.get(request.uri) is active:
                del self.active[request.uri]
            if not active.started:
                active.finished.set()  # nothing ran, so nothing for a successor to wait for
        return self._conclude(request, path, outcome, active, progress, unsaved, detached)

    def _unsaved(self, uri: str, path: str) -> bool:
        """Whether the open document (a notebook: its code cells) differs from the file the
        run will execute."""
        snapshot = self.server.docs.snapshot(uri)
        if snapshot is None:
            return False
        on_disk = read_baseline(path)
        return on_disk is not None and split_lines(snapshot.source) != on_disk

    def project_root(self, path: str) -> Path:
        """The project the file belongs to: the innermost workspace folder holding it (lines
        anywhere in it count as the user's), else the file's folder."""
        file = Path(real_path(path))
        candidates = [folder.uri for folder in self.server.workspace.folders.values()]
        if self.server.workspace.root_uri:
            candidates.append(self.server.workspace.root_uri)
        best: Path | None = None
        for uri in candidates:
            folder = to_fs_path(uri)
            if folder is None:
                continue
            resolved = Path(real_path(folder))
            if file.is_relative_to(resolved) and (
                best is None or len(resolved.parts) > len(best.parts)
            ):
                best = resolved
        return best or file.parent

    async def _execute(
        self,
        request: RunRequest,
        path: str,
        probe: ProbeSettings,
        active: ActiveRun,
        progress: ReproProgress,
    ) -> Outcome:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Outcome] = loop.create_future()
        root = self.project_root(path)

        def deliver(outcome: Outcome) -> None:
            if not done.done():
                done.set_result(outcome)
            active.finished.set()

        def on_progress(event: ProgressEvent) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is gone: the server is exiting
                loop.call_soon_threadsafe(progress.report, event)

        def work() -> None:
            outcome: Outcome
            python, source = "python", "unknown"
            try:
                from torchls.probe import ReproCancelled, ReproUsageError

                options, python, source = probe_options(path, root, probe, request=request)
                baseline = read_baseline(path)
                try:
                    report = self.session().run(
                        path, options, on_progress=on_progress, cancel_event=active.cancel
                    )
                    baselines = {real_path(path): baseline} if baseline is not None else {}
                    result = build_result(request.uri, 0, report.data, baselines, root=root)
                    outcome = Finished(report.data, result, python, source)
                except ReproCancelled:
                    outcome = Cancelled()
                except ReproUsageError as error:
                    outcome = Failed(messages.usage_failure(str(error), python, source))
            except Exception as error:  # the server outlives any probe bug
                logger.exception("the repro of %s failed", path)
                outcome = Failed(f"torchls: the repro failed: {error}")
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(deliver, outcome)

        threading.Thread(target=work, name=f"torchls-repro-{Path(path).name}", daemon=True).start()
        active.started = True
        try:
            return await asyncio.shield(done)
        except asyncio.CancelledError:
            active.cancel.set()  # the request or the server went away: stop the sandbox too
            raise

    def _conclude(
        self,
        request: RunRequest,
        path: str,
        outcome: Outcome,
        active: ActiveRun,
        progress: ReproProgress,
        unsaved: bool,
        detached: bool = False,
    ) -> dict[str, Any]:
        name = Path(path).name
        if isinstance(outcome, Cancelled):
            if active.superseded:
                progress.end("superseded by a new run")
                self.server.log(f"torchls: the repro of {name} was superseded by a new run")
                return {"status": "cancelled", "superseded": True, "message": "superseded"}
            progress.end("cancelled")
            return self._tell(
                "cancelled",
                f"torchls: the repro of {name} was cancelled; its processes were stopped.",
                types.MessageType.Info,
            )
        if isinstance(outcome, Failed):
            progress.end("could not run")
            return self._tell("failed", outcome.message, types.MessageType.Error)
        data = outcome.report_data
        exception = data.get("exception") or {}
        if exception.get("kind") in ("setup", "device"):
            progress.end("could not run")
            message = messages.setup_failure(data, outcome.python, outcome.python_source)
            return self._tell("failed", message, types.MessageType.Error)
        self.publish(outcome.result)
        summary = messages.summary(data, path)
        if self.server.webview_reports:  # the VS Code extension shows it in a webview
            summary += ". Its HTML report: torchls.showReproReport."
        progress.end(summary)
        self.server.log(f"torchls: {summary}")
        if detached:  # no progress bar and no answer to carry it: the one sign the run ended
            self._show(f"torchls: {untrusted.notification(summary)}", types.MessageType.Info)
        for kind, text in messages.report_messages(data, path):
            self._show(text, kind)
        if (weaker := messages.sandbox_problem(data)) is not None:
            cause = messages.sandbox_cause(data)
            if cause not in self._sandbox_told:  # the same on every run: once per session
                self._sandbox_told.add(cause)
                self.server.warn_once(weaker)
        if unsaved:
            self._show(
                f"torchls: the repro ran {name} as saved on disk; unsaved edits were not part of "
                "it (their lines show as stale).",
                types.MessageType.Warning,
            )
        return {
            "status": data.get("status"),
            "message": summary,
            "runner": (data.get("timing") or {}).get("runner"),
            "findings": [
                {"code": f.get("code"), "line": f.get("line"), "filename": f.get("filename")}
                for f in data.get("findings") or []
            ],
        }

    def _show(self, message: str, kind: types.MessageType) -> None:
        if not plaintext.accepts_markdown(self.server):
            message = plaintext.inline(message)  # `torchls.probe.python` reads as is
        self.server.window_show_message(types.ShowMessageParams(type=kind, message=message))

    def _tell(self, status: str, message: str, kind: types.MessageType) -> dict[str, Any]:
        """Show `message` (every editor displays window/showMessage) and answer with it."""
        self._show(message, kind)
        self.server.log(message)
        return {"status": status, "message": message}

    def publish(self, result: ReproResult) -> int:
        """Install a finished run's `result` (a repro's, or a comparison's candidate) as the
        newest for its document and refresh what shows it; returns its run id."""
        result.run_id = next(self.run_ids)
        self._refresh(self.server.repro_store.put(result))
        return result.run_id

    def _refresh(self, paths: set[str]) -> None:
        """New probe results for `paths`: the documents re-check them, and every subscribed
        feature (diagnostics) gets the results (pull clients are asked to pull again)."""
        docs = self.server.docs
        if not docs.push:
            docs.refresh_all("repro")
            return
        for uri in list(docs.states):
            own = to_fs_path(uri)
            if own is not None and real_path(own) in paths:
                docs.refresh(uri, "repro")

    async def clear(self, *arguments: Any) -> dict[str, Any]:
        uri = None
        if arguments:
            argument = arguments[0]
            uri = argument.get("uri") if isinstance(argument, Mapping) else argument
            if not isinstance(uri, str | None):
                raise JsonRpcInvalidParams(f'{CLEAR_REPRO} takes {{"uri"}} or nothing')
        paths = self.server.repro_store.clear(uri)
        self._refresh(paths)
        return {"status": "cleared", "files": len(paths)}

    # -- the code action --

    async def code_action(
        self, snapshot: Snapshot, requested: types.Range
    ) -> types.CodeAction | None:
        """ "Run bounded repro" when `requested` touches a training loop or train step."""
        if not self.server.trusted:
            return None  # never offer to run code the workspace does not trust
        path = to_fs_path(snapshot.uri)
        if path is None:
            return None
        key = (snapshot.version, snapshot.source)
        cached = self._regions.get(snapshot.uri)
        if cached is not None and cached[0] == key:
            regions = cached[1]
        else:
            loop = asyncio.get_running_loop()
            regions = await loop.run_in_executor(
                self.server.analysis_pool,
                repro_regions,
                self.server.parsed_by_uri,
                snapshot.uri,
                snapshot.source,
                path,
            )
            # One entry per open document, newest version only.
            for uri in [u for u in self._regions if u not in self.server.documents]:
                del self._regions[uri]
            self._regions[snapshot.uri] = (key, regions)
        first, last = requested.start.line + 1, requested.end.line + 1
        if not any(start <= last and first <= end for start, end in regions):
            return None
        return types.CodeAction(
            title=ACTION_TITLE,
            kind=REPRO_KIND,
            command=types.Command(
                title=ACTION_TITLE, command=RUN_REPRO, arguments=[{"uri": snapshot.uri}]
            ),
        )


def remove_leftovers(server: TorchLanguageServer) -> None:
    """Start removing the folders that killed torchls processes left behind (on a thread: a
    big leftover must not delay `initialize`); the log says what went."""
    loop = asyncio.get_running_loop()

    def sweep() -> None:
        try:
            removed = leftovers.sweep()
        except Exception:  # a cleanup bug must not cost the user the server
            logger.exception("removing leftover folders failed")
            return
        if removed:
            names = ", ".join(path.name for path in removed)
            message = f"torchls: removed {len(removed)} folder(s) left by stopped servers: {names}"
            with contextlib.suppress(RuntimeError):  # the loop is gone: the server is exiting
                loop.call_soon_threadsafe(server.log, message)

    threading.Thread(target=sweep, name="torchls-leftovers", daemon=True).start()


def register(server: TorchLanguageServer) -> ReproController:
    """Attach the repro commands, the diagnostics layer and shutdown handling to `server`."""
    controller = ReproController(server)
    server.repro = controller
    server.diagnostic_layers.append(ProbeDiagnostics(server, server.repro_store))

    async def hover_layer(snapshot: Snapshot, row: int, column: int) -> str | None:
        from torchls.lsp.repro_hover import repro_hover

        return await repro_hover(server, snapshot, row, column)

    server.hover_layers.append(hover_layer)
    server.shutdown_hooks.append(controller.begin_close)
    server.initialize_hooks.append(lambda _params: remove_leftovers(server))

    @server.command(RUN_REPRO)
    async def run_repro(ls: TorchLanguageServer, *arguments: Any) -> dict[str, Any]:
        return await controller.run(*arguments)

    @server.command(CLEAR_REPRO)
    async def clear_repro(ls: TorchLanguageServer, *arguments: Any) -> dict[str, Any]:
        return await controller.clear(*arguments)

    return controller
