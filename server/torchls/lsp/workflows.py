"""Editor workflows over the probe: inspect a checkpoint, compare with a baseline, show the report.

Why a module of its own: each of these runs a whole CLI workflow (`torchls inspect`, `torchls
repro --compare`, `--report`) from the editor and turns its result into LSP objects; the repro
feature (`repro`) owns runs and their results, this module only calls into it.

In:
- `textDocument/codeAction` on a `torch.load("literal")` / `torch.save(obj, "literal")` line
  whose literal (relative to the document's folder, or absolute) names an existing regular
  file: "Inspect checkpoint PATH" (trusted workspaces only), running
- `torchls.inspectCheckpoint [path]` -> `{"status": "ok"|"blocked"|"error", "markdown": str,
  "loads": bool|null}`: the file read in the sandbox (`inspect_cli.inspect_data`); a short
  `window/showMessage`; afterwards the hover on a `torch.load`/`torch.save` of that file shows
  the summary (and says the file confirms a TL301 finding on a `torch.save` line);
- `torchls.compareRepro [uri, baseline]` -> `{"status": "ok"|"error", "exit_status": 0|1|null,
  "markdown": str}` (the code action "Compare with HEAD", beside "Run bounded repro", sends
  `[uri, "HEAD"]`; offered to clients that show work-done progress, and for the others the
  command answers `{"status": "started", ...}` at once and reports later): `compare.run_compare`
  with the editor repro's options (`repro.probe_options`);
  the candidate run becomes the document's newest repro result (`ReproController.publish`), its
  findings tagged "(introduced vs B)" / "(still there)", plus an information diagnostic
  "(fixed vs B)" per baseline finding the candidate fixed;
- `torchls.showReproReport [uri]` (or `[{"uri"}]`) -> `{"path": str, "html": str}`: the newest
  result of that document as the HTML report (`html_report.render_html`, with the baseline
  overlaid after a comparison), written to a per-server temporary folder (named by
  `leftovers.owned_prefix`, removed at exit or by the next server's sweep). Clients with
  `window/showDocument` are asked to open it externally, unless they announced
  `webviewReports: true` in `initializationOptions` (the VS Code extension, which opens a
  webview itself); the others get a message with the path. No result yet: an error response.

Runs block (a sandbox, git archive, pygal), so each happens on a thread of its own and the event
loop only awaits it. Everything from a run or a checkpoint is untrusted and goes through
`torchls.probe.untrusted` before it reaches Markdown or a message.
"""

from __future__ import annotations

import ast
import asyncio
import atexit
import contextlib
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from lsprotocol import types
from pygls.capabilities import get_capability
from pygls.exceptions import JsonRpcInvalidParams, JsonRpcServerError
from pygls.uris import from_fs_path, to_fs_path

from torchls.lsp import plaintext
from torchls.lsp.commands import (
    COMPARE_REPRO,
    COMPARE_TITLE,
    INSPECT_CHECKPOINT,
    INSPECT_KIND,
    REPRO_KIND,
    SHOW_REPRO_REPORT,
)
from torchls.lsp.repro import announces_progress, probe_options
from torchls.lsp.repro_state import FileTrace, build_result, read_baseline, real_path
from torchls.lsp.rule_docs import _option_layers
from torchls.lsp.server import Snapshot, TorchLanguageServer
from torchls.probe import untrusted
from torchls.probe.document import Finding, Report
from torchls.probe.leftovers import REPRO, owned_prefix
from torchls.records import record

T = TypeVar("T")

WEBVIEW_OPTION = "webviewReports"
NO_RESULT = -32001  # the error code of `torchls.showReproReport` before any run
NO_REPORT = -32002  # ... and when the report could not be rendered
UNTRUSTED = (
    "torchls: this workspace is not trusted, so torchls runs nothing from it (inspecting a "
    "checkpoint and comparing runs start the probe). Trust the workspace to use them."
)


# -- the checkpoint literals of a document ----------------------------------------------------


@record(frozen=True)
class CheckpointCall:
    """A `torch.load`/`torch.save` call whose file is a string literal naming a regular file."""

    kind: str  # "load" or "save"
    row: int  # 1-based, the call's first line
    end_row: int
    literal: str
    path: str  # absolute, as the literal resolves from the document's folder


def _torch_names(tree: ast.AST) -> set[str]:
    """The names `torch` is bound to (`import torch`, `import torch as t`)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "torch":
                    names.add(alias.asname or "torch")
    return names


def _file_argument(call: ast.Call, kind: str) -> ast.expr | None:
    """The `f` argument: `torch.load(f, ...)`, `torch.save(obj, f, ...)`, or `f=` by name."""
    for keyword in call.keywords:
        if keyword.arg == "f":
            return keyword.value
    position = 0 if kind == "load" else 1
    return call.args[position] if len(call.args) > position else None


def is_regular_file(path: str) -> bool:
    """Whether `path` is a regular file (never opened: a FIFO would block the reader)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def checkpoint_calls(source: str, folder: str | None) -> list[CheckpointCall]:
    """Every `torch.load`/`torch.save` of `source` whose literal path names an existing regular
    file (run on a worker thread: it parses and stats)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    torch = _torch_names(tree)
    found = []
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("load", "save")
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in torch
        ):
            continue
        kind = node.func.attr
        argument = _file_argument(node, kind)
        if not (isinstance(argument, ast.Constant) and isinstance(argument.value, str)):
            continue
        literal = argument.value
        if not literal or "\x00" in literal:
            continue
        expanded = os.path.expanduser(literal)
        if not os.path.isabs(expanded):
            if folder is None:
                continue  # an unsaved document: relative to nothing
            expanded = os.path.join(folder, expanded)
        path = os.path.abspath(expanded)
        if is_regular_file(path):
            end = node.end_lineno or node.lineno
            found.append(CheckpointCall(kind, node.lineno, end, literal, path))
    return sorted(found, key=lambda call: (call.row, call.kind))


# -- Markdown ---------------------------------------------------------------------------------


def inspection_markdown(path: str, record: dict[str, Any]) -> str:
    """The inspection summary: weights_only verdict, blocking globals and where they sit,
    tensors, training state, what is missing to resume. `record` is untrusted."""
    from torchls.inspect_cli import human_size

    name = untrusted.code(os.path.basename(path))
    verdict = record.get("weights_only") or {}
    loads = verdict.get("loads")
    lines = [f"**Checkpoint {name}** ({untrusted.markdown(record.get('format') or '?')})", ""]
    if loads is True:
        lines.append("`weights_only=True`: **loads**")
    elif loads is False:
        lines.append(
            "`weights_only=True`: **refused** (TL911): "
            + untrusted.markdown(verdict.get("note") or "")
        )
    else:
        lines.append("`weights_only=True`: " + untrusted.markdown(verdict.get("note") or "unknown"))
    blocking = [item for item in verdict.get("blocking") or [] if isinstance(item, Mapping)]
    if blocking:
        lines += ["", "| where | global that blocks it |", "|---|---|"]
        for item in blocking[:20]:
            lines.append(
                f"| {untrusted.code(item.get('path'))} | {untrusted.code(item.get('global'))} |"
            )
        if len(blocking) > 20:
            lines.append(f"| … | {len(blocking) - 20} more |")
        fix = blocking[0].get("fix")
        if fix:
            lines += ["", "Fix: " + untrusted.markdown(fix)]
    totals = record.get("totals") or {}
    lines += [
        "",
        f"Tensors: {untrusted.markdown(totals.get('tensors'))}, "
        f"{untrusted.markdown(human_size(totals.get('bytes')))}",
    ]
    state = record.get("training_state") or {}
    held = [name for name in ("model", "scheduler", "scaler", "rng") if state.get(name)]
    optimizer = state.get("optimizer")
    if optimizer:
        rates = [f"{lr:g}" for lr in (optimizer.get("lr") or []) if isinstance(lr, int | float)]
        held.append(f"optimizer (lr {', '.join(rates)})" if rates else "optimizer")
    counters = state.get("counters") or {}
    if isinstance(counters, Mapping):
        held += [f"{key} {value}" for key, value in list(counters.items())[:10]]
    lines.append("Training state: " + (untrusted.markdown(", ".join(held)) or "none found"))
    missing = [str(item) for item in record.get("missing") or []]
    if missing:
        lines.append("Missing to resume: " + untrusted.markdown("; ".join(missing[:10])))
    return "\n".join(lines)


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, int | float) else "non-finite"


def comparison_markdown(comparison: dict[str, Any]) -> str:
    """The comparison as a summary: loss per step side by side, fixed/introduced/stayed."""
    ref = untrusted.code(comparison["baseline"]["ref"], 80)
    verdict = (
        "the candidate fixes the baseline's problems and adds none"
        if comparison.get("exit_status") == 0
        else "the candidate keeps or adds warning/error findings"
    )
    lines = [
        f"**Compare with {ref}**: baseline {untrusted.code(comparison['baseline']['file'])} vs "
        f"candidate {untrusted.code(os.path.basename(comparison['candidate']['file']))}",
        "",
        f"Exit status {comparison.get('exit_status')}: {verdict}.",
    ]
    base, cand = comparison["loss"]["baseline"], comparison["loss"]["candidate"]
    if base or cand:
        lines += ["", "| step | baseline loss | candidate loss |", "|---:|---:|---:|"]
        for step in range(max(len(base), len(cand))):
            b = _number(base[step]) if step < len(base) else "—"
            c = _number(cand[step]) if step < len(cand) else "—"
            lines.append(f"| {step + 1} | {b} | {c} |")
    lines.append("")
    for kind in ("fixed", "introduced", "stayed"):
        items = comparison["findings"][kind]
        if not items:
            lines.append(f"- **{kind}**: none")
            continue
        for item in items:
            lines.append(
                f"- **{kind}**: {untrusted.code(item.get('code'), 8)} line "
                f"{untrusted.markdown(item.get('line'))}: {untrusted.markdown(item.get('message'))}"
            )
    return "\n".join(lines)


# -- running off the event loop ---------------------------------------------------------------


async def off_loop(work: Callable[[], T], name: str) -> T:
    """`work()` on a thread of its own (as the repro does: a sandbox's die-with-parent is tied
    to the thread that started it, so that thread must outlive the run), awaited."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def deliver(ok: bool, value: Any) -> None:
        if done.done():
            return
        if ok:
            done.set_result(value)
        else:
            done.set_exception(value)

    def run() -> None:
        try:
            value, ok = work(), True
        except BaseException as error:  # handed to the awaiting coroutine
            value, ok = error, False
        with contextlib.suppress(RuntimeError):  # the loop is gone: the server is exiting
            loop.call_soon_threadsafe(deliver, ok, value)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await done


# -- the feature ------------------------------------------------------------------------------


@record
class Inspection:
    loads: bool | None
    markdown: str
    stamp: tuple[int, int] | None  # (mtime_ns, size) of the file that was read


def file_stamp(path: str) -> tuple[int, int] | None:
    """What tells a rewritten checkpoint from the one inspected."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_mtime_ns, info.st_size


@record
class Comparison:
    """The comparison behind a document's newest result, for its report."""

    run_id: int
    data: dict[str, Any]
    baseline: Report  # the baseline run's report data


class Workflows:
    """Per-server state: inspections by file, comparisons by document, the report folder."""

    def __init__(self, server: TorchLanguageServer) -> None:
        self.server = server
        self.inspections: dict[str, Inspection] = {}  # real path of the checkpoint -> result
        self.comparisons: dict[str, Comparison] = {}  # document uri -> its last comparison
        self._calls: dict[str, tuple[tuple[int | None, str], list[CheckpointCall]]] = {}
        self._folder: Path | None = None
        # Comparisons whose command already answered (clients without progress); the event
        # loop keeps only weak references to tasks.
        self._detached: set[asyncio.Task[dict[str, Any]]] = set()

    def configure(self, params: types.InitializeParams) -> None:
        self.server.webview_reports = any(
            layer.get(WEBVIEW_OPTION) is True
            for layer in _option_layers(params.initialization_options)
        )

    def _show(self, message: str, kind: types.MessageType = types.MessageType.Info) -> None:
        if not plaintext.accepts_markdown(self.server):
            message = plaintext.inline(message)
        self.server.window_show_message(types.ShowMessageParams(type=kind, message=message))

    async def calls_of(self, snapshot: Snapshot) -> list[CheckpointCall]:
        """The checkpoint calls of the snapshot (cached for the newest version)."""
        key = (snapshot.version, snapshot.source)
        cached = self._calls.get(snapshot.uri)
        if cached is not None and cached[0] == key:
            return cached[1]
        path = to_fs_path(snapshot.uri)
        folder = os.path.dirname(path) if path else None
        loop = asyncio.get_running_loop()
        calls = await loop.run_in_executor(
            self.server.analysis_pool, checkpoint_calls, snapshot.source, folder
        )
        for uri in [u for u in self._calls if u not in self.server.documents]:
            del self._calls[uri]
        self._calls[snapshot.uri] = (key, calls)
        return calls

    # -- code actions --

    async def code_actions(
        self, snapshot: Snapshot, requested: types.Range
    ) -> list[types.CodeAction]:
        """ "Inspect checkpoint PATH" for each checkpoint literal in `requested`."""
        if not self.server.trusted:
            return []  # the inspection starts the probe: never in an untrusted workspace
        first, last = requested.start.line + 1, requested.end.line + 1
        actions, seen = [], set()
        for call in await self.calls_of(snapshot):
            if call.row > last or call.end_row < first or call.path in seen:
                continue
            seen.add(call.path)
            title = f"Inspect checkpoint {call.literal}"
            actions.append(
                types.CodeAction(
                    title=title,
                    kind=INSPECT_KIND,
                    command=types.Command(
                        title=title, command=INSPECT_CHECKPOINT, arguments=[call.path]
                    ),
                )
            )
        return actions

    @staticmethod
    def compare_action(uri: str) -> types.CodeAction:
        """ "Compare with HEAD", offered wherever "Run bounded repro" is."""
        return types.CodeAction(
            title=COMPARE_TITLE,
            kind=REPRO_KIND,
            command=types.Command(
                title=COMPARE_TITLE, command=COMPARE_REPRO, arguments=[uri, "HEAD"]
            ),
        )

    # -- torchls.inspectCheckpoint --

    async def inspect(self, *arguments: Any) -> dict[str, Any]:
        if len(arguments) != 1 or not isinstance(arguments[0], str) or not arguments[0]:
            raise JsonRpcInvalidParams(f"{INSPECT_CHECKPOINT} takes one argument: the file path")
        path = os.path.abspath(os.path.expanduser(arguments[0]))
        if not self.server.trusted:
            self._show(UNTRUSTED, types.MessageType.Error)
            return {"status": "error", "markdown": untrusted.markdown(UNTRUSTED), "loads": None}
        from torchls.inspect_cli import check_input, inspect_data

        if (problem := check_input(path)) is not None:
            return self._inspect_failed(path, problem)
        stamp = file_stamp(path)  # before the read: a file rewritten meanwhile counts as changed
        await self.server.wait_for_settings()
        probe = self.server.settings.probe
        repro = self.server.repro
        root = repro.project_root(path) if repro is not None else Path(path).parent

        def work() -> dict[str, Any]:
            _, python, _ = probe_options(path, root, probe)
            return inspect_data(path, python)

        from torchls.probe import ReproUsageError

        try:
            data = await off_loop(work, "torchls-inspect")
        except ReproUsageError as error:
            return self._inspect_failed(path, str(error))
        except Exception as error:  # the server outlives any probe bug
            return self._inspect_failed(path, f"the probe failed: {error}")
        record = data.get("inspection")
        if not isinstance(record, dict):
            exception = data.get("exception") or {}
            findings = data.get("findings") or []
            why = exception.get("message") or (findings[0].get("message") if findings else None)
            return self._inspect_failed(path, str(why or "the probe wrote no report"))
        loads = (record.get("weights_only") or {}).get("loads")
        loads = loads if isinstance(loads, bool) else None
        markdown = inspection_markdown(path, record)
        self.inspections[real_path(path)] = Inspection(loads, markdown, stamp)
        name = os.path.basename(path)
        if loads is False:
            blocking = (record.get("weights_only") or {}).get("blocking") or []
            where = ", ".join(
                f"{item.get('path')}: {item.get('global')}"
                for item in blocking[:3]
                if isinstance(item, Mapping)
            )
            message = f"{name} does not load with weights_only=True (TL911): {where}"
            kind = types.MessageType.Warning
        elif loads is True:
            message, kind = f"{name} loads with weights_only=True", types.MessageType.Info
        else:
            message, kind = (
                f"{name}: {(record.get('weights_only') or {}).get('note')}",
                types.MessageType.Info,
            )
        self._show(f"torchls: {untrusted.notification(message)}", kind)
        return {
            "status": "blocked" if loads is False else "ok",
            "markdown": markdown,
            "loads": loads,
        }

    def _inspect_failed(self, path: str, why: str) -> dict[str, Any]:
        message = f"torchls: cannot inspect {os.path.basename(path)}: {untrusted.notification(why)}"
        self._show(message, types.MessageType.Error)
        return {"status": "error", "markdown": untrusted.markdown(message), "loads": None}

    async def hover(self, snapshot: Snapshot, row: int, column: int) -> str | None:
        """The inspection summary on a `torch.load`/`torch.save` line of an inspected file."""
        if not self.inspections:
            return None
        calls = [c for c in await self.calls_of(snapshot) if c.row <= row <= c.end_row]
        parts = []
        for call in calls:
            key = real_path(call.path)
            found = self.inspections.get(key)
            if found is None:
                continue
            if found.stamp is None or file_stamp(key) != found.stamp:
                del self.inspections[key]  # the file was rewritten: the summary describes another
                continue
            text = found.markdown
            if (
                call.kind == "save"
                and found.loads is False
                and await self._tl301_on(snapshot, call)
            ):
                text += (
                    "\n\nThe file confirms TL301: the checkpoint saved here does not load "
                    "with `weights_only=True`."
                )
            parts.append(text)
        return "\n\n".join(parts) or None

    async def _tl301_on(self, snapshot: Snapshot, call: CheckpointCall) -> bool:
        outcome = await self.server.docs.analyse(snapshot)
        return any(
            f.code == "TL301" and call.row <= f.span.start.row <= call.end_row
            for f in outcome.findings
        )

    # -- torchls.compareRepro --

    async def compare(self, *arguments: Any) -> dict[str, Any]:
        if len(arguments) != 2 or not all(isinstance(a, str) and a for a in arguments):
            raise JsonRpcInvalidParams(f"{COMPARE_REPRO} takes two arguments: [uri, baseline]")
        uri, baseline = arguments
        server, repro = self.server, self.server.repro
        if not server.trusted or repro is None:
            self._show(UNTRUSTED, types.MessageType.Error)
            return {
                "status": "error",
                "exit_status": None,
                "markdown": untrusted.markdown(UNTRUSTED),
            }
        path = to_fs_path(uri)
        if path is None or not Path(path).is_file():
            return self._compare_failed("the comparison runs a file saved on disk; save it first")
        if not announces_progress(server):
            # The client would wait on the answer with a short timeout (eglot): answer now, and
            # let the diagnostics and a message tell the rest.
            task = asyncio.ensure_future(self._compare(uri, path, baseline))
            self._detached.add(task)
            task.add_done_callback(self._detached.discard)
            message = f"torchls: comparing {os.path.basename(path)} with {baseline}"
            self._show(untrusted.notification(message))
            return {
                "status": "started",
                "exit_status": None,
                "markdown": untrusted.markdown(message),
            }
        return await self._compare(uri, path, baseline)

    async def _compare(self, uri: str, path: str, baseline: str) -> dict[str, Any]:
        server, repro = self.server, self.server.repro
        assert repro is not None  # checked by `compare`
        await server.wait_for_settings()
        probe = server.settings.probe
        root = repro.project_root(path)
        label = untrusted.one_line(baseline, 40)

        def work() -> tuple[dict[str, Any], Report, Any]:
            from torchls.compare import run_compare
            from torchls.probe.report import ReproReport

            options, _, _ = probe_options(path, root, probe)
            lines = read_baseline(path)
            keep: list[ReproReport] = []
            comparison = run_compare(Path(path), baseline, options, 1, keep)
            data = keep[1].data.copy()
            data["findings"] = tagged_findings(comparison, data, label)
            baselines = {real_path(path): lines} if lines is not None else {}
            result = build_result(uri, 0, data, baselines, root=root)
            if lines is not None:
                add_fixed(result, real_path(path), lines, comparison, label)
            return comparison, keep[0].data, result

        from torchls.probe import ReproUsageError

        try:
            comparison, baseline_data, result = await off_loop(work, "torchls-compare")
        except ReproUsageError as error:
            return self._compare_failed(str(error))
        except Exception as error:  # the server outlives any probe bug
            return self._compare_failed(f"the comparison failed: {error}")
        run_id = repro.publish(result)
        self.comparisons[uri] = Comparison(run_id, comparison, baseline_data)
        findings = comparison["findings"]
        counts = ", ".join(f"{len(findings[k])} {k}" for k in ("fixed", "introduced", "stayed"))
        self._show(
            f"torchls: compare with {untrusted.notification(label)}: {counts}; exit status "
            f"{comparison['exit_status']}",
            types.MessageType.Info,
        )
        return {
            "status": "ok",
            "exit_status": comparison["exit_status"],
            "markdown": comparison_markdown(comparison),
        }

    def _compare_failed(self, why: str) -> dict[str, Any]:
        message = f"torchls: the comparison could not run: {untrusted.notification(why)}"
        self._show(message, types.MessageType.Error)
        return {"status": "error", "exit_status": None, "markdown": untrusted.markdown(message)}

    # -- torchls.showReproReport --

    def _report_folder(self) -> Path:
        if self._folder is None:
            # Named like the repro's folders, so a killed server's is swept by the next one.
            self._folder = Path(tempfile.mkdtemp(prefix=owned_prefix(REPRO)))
            atexit.register(shutil.rmtree, self._folder, ignore_errors=True)
        return self._folder

    async def show_report(self, *arguments: Any) -> dict[str, Any]:
        uri = arguments[0] if len(arguments) == 1 else None
        if isinstance(uri, Mapping):
            uri = uri.get("uri")
        if not isinstance(uri, str) or not uri:
            raise JsonRpcInvalidParams(
                f'{SHOW_REPRO_REPORT} takes one argument: the uri (or {{"uri"}})'
            )
        server = self.server
        result = server.repro_store.get(uri)
        if result is None:
            raise JsonRpcServerError(
                "no repro result for this document yet: run the repro (torchls.runRepro) first",
                NO_RESULT,
            )
        comparison = self.comparisons.get(uri)
        if comparison is not None and comparison.run_id != result.run_id:
            comparison = None  # a later plain run replaced the comparison's candidate
        name = Path(to_fs_path(uri) or "repro").stem

        def render() -> tuple[str, str]:
            from torchls.probe.html_report import render_html
            from torchls.probe.report import ReproReport

            if comparison is None:
                page = render_html(ReproReport(result.data), title=f"torchls repro {name}")
            else:
                page = render_html(
                    ReproReport(result.data),
                    title=f"torchls repro {name}",
                    other=("baseline", ReproReport(comparison.baseline)),
                    comparison=comparison.data,
                )
            target = self._report_folder() / f"{name}-report.html"
            target.write_text(page, encoding="utf-8")
            return str(target), page

        try:
            path, page = await asyncio.get_running_loop().run_in_executor(None, render)
        except Exception as error:  # a rendering bug: say so instead of an internal error
            message = f"torchls: the repro report could not be rendered: {error}"
            self._show(untrusted.notification(message), types.MessageType.Error)
            raise JsonRpcServerError(untrusted.one_line(message), NO_REPORT) from error
        if server.webview_reports:
            pass  # the VS Code extension opens the returned HTML in a webview itself
        elif get_capability(server.client_capabilities, "window.show_document.support", False):
            params = types.ShowDocumentParams(uri=from_fs_path(path) or path, external=True)
            with contextlib.suppress(Exception):  # showing is a courtesy; the answer has it
                await server.window_show_document_async(params)
        else:
            self._show(f"torchls: the repro report is at {path}", types.MessageType.Info)
        return {"path": path, "html": page}


def tagged_findings(comparison: dict[str, Any], data: Report, label: str) -> list[Finding]:
    """The candidate's findings, each message saying whether the comparison with `label`
    introduced it or found it in both runs."""
    kinds: dict[tuple[str, Any], str] = {}
    for kind, tag in (("stayed", "still there"), ("introduced", f"introduced vs {label}")):
        for item in comparison["findings"][kind]:
            kinds[(str(item.get("code")), item.get("line"))] = tag
    tagged = []
    for item in data["findings"]:
        copy = item.copy()
        said = kinds.get((copy["code"], copy["line"]))
        if said is not None:
            copy["message"] = f"{copy['message']} ({said})"
        tagged.append(copy)
    return tagged


def add_fixed(
    result: Any, path: str, lines: list[str], comparison: dict[str, Any], label: str
) -> None:
    """An information finding per baseline finding the candidate fixed, on the line of the
    current text that reads the same (else the baseline's line number, which a fix that
    edited the line keeps)."""
    trace = result.files.get(path)
    if trace is None:
        trace = result.files[path] = FileTrace(path, lines)
    normalised = [" ".join(line.split()) for line in lines]
    for item in comparison["findings"]["fixed"]:
        text = item.get("line_text")
        if text in normalised:
            row = normalised.index(text) + 1
        else:
            line = item.get("line")
            row = min(max(line if isinstance(line, int) else 1, 1), max(len(lines), 1))
        own = lines[row - 1] if row <= len(lines) else ""
        indent = len(own) - len(own.lstrip())
        trace.findings.append(
            {
                "code": str(item.get("code")),
                "filename": path,
                "line": row,
                "column": indent + 1,
                "end_line": row,
                "end_column": len(own.rstrip()) + 1,
                "message": f"{item.get('message', '')} (fixed vs {label})",
                "severity": "information",
            }
        )


def register(server: TorchLanguageServer) -> Workflows:
    """Attach the inspect, compare and report commands and the inspection hover to `server`."""
    workflows = Workflows(server)
    server.workflows = workflows
    server.initialize_hooks.append(workflows.configure)
    server.hover_layers.append(workflows.hover)

    @server.command(INSPECT_CHECKPOINT)
    async def inspect_checkpoint(ls: TorchLanguageServer, *arguments: Any) -> dict[str, Any]:
        return await workflows.inspect(*arguments)

    @server.command(COMPARE_REPRO)
    async def compare_repro(ls: TorchLanguageServer, *arguments: Any) -> dict[str, Any]:
        return await workflows.compare(*arguments)

    @server.command(SHOW_REPRO_REPORT)
    async def show_repro_report(ls: TorchLanguageServer, *arguments: Any) -> dict[str, Any]:
        return await workflows.show_report(*arguments)

    return workflows
