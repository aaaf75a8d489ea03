"""Benchmark: resident memory of the real language server: 200 real files open, then closed,
then 10,000 incremental edits.

Starts `python -m torchls server` over stdio (the workspace root is the real-code corpus
folder when it is present) and reads its RSS after `initialize`. With the real corpus
(`bench/real_corpus.py` materialises it from the fetched snapshots; skipped when absent, or
with `--real 0`): opens `--real` real training files, waits for each one's diagnostics and
for the server to go idle (its CPU time stops moving: the cross-file passes are done), reads
the RSS; closes them all, waits again, reads the RSS. Then the soak: opens a training module
(examples/image_classifier.py by default), makes 200 warm-up edits, reads the server's RSS,
then sends 10,000 incremental edits (typing and deleting characters in a comment, and
toggling a TL101 bug in an appended function on and off, so the findings really change) with
a hover and a code action every 100 edits, and reads the RSS again. It waits for the
diagnostics of every `--wait-every`-th version, so the server analyses a good share of the
versions instead of only the last one. Prints RSS before and after, the growth, the peak
(VmHWM), RSS every tenth of the run (to tell a leak, which keeps growing, from allocator
high-water marks, which level off) and the edit rate. No assertions.
Usage: python bench/memory_soak.py [--edits 10000] [--wait-every 10] [--file PATH] [--real 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from lsprotocol import types
from pygls.lsp.client import LanguageClient

sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_corpus import CACHE, DEFAULT_MANIFEST, materialise

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_FILE = ROOT / "examples" / "image_classifier.py"
WAIT_S = 60.0  # a safety net against a hung server, not a measurement


def status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


async def idle(pid: int, quiet_s: float = 1.0, limit_s: float = 300.0) -> None:
    """Wait until the server has used no CPU for `quiet_s` (its queued analyses are done)."""
    deadline = time.monotonic() + limit_s
    last = cpu_ticks(pid)
    while time.monotonic() < deadline:
        await asyncio.sleep(quiet_s)
        now = cpu_ticks(pid)
        if now == last:
            return
        last = now


def real_files(count: int) -> list[Path]:
    """Up to `count` real training files of the corpus (the clean rows), materialised."""
    if count <= 0 or not DEFAULT_MANIFEST.is_file():
        return []
    manifest = json.loads(DEFAULT_MANIFEST.read_text(encoding="utf-8"))
    entries = manifest["entries"] if isinstance(manifest, dict) else manifest
    found: list[Path] = []
    for entry in entries:
        if entry["kind"] != "clean":
            continue
        root = materialise(entry["repo"], entry["commit"])
        if root is not None and (root / entry["path"]).is_file():
            found.append(root / entry["path"])
        if len(found) == count:
            break
    return found


def position(text: str, offset: int) -> types.Position:
    """UTF-16 position of code-point `offset` (the test files are ASCII, but be exact)."""
    line = text.count("\n", 0, offset)
    start = text.rfind("\n", 0, offset) + 1
    column = len(text[start:offset].encode("utf-16-le")) // 2
    return types.Position(line=line, character=column)


SOAK_TAIL = """
# soak:
import torch.nn.functional as F


def soak_step(logits, targets):
    return F.cross_entropy(logits, targets)
"""
BUG = ("F.cross_entropy(logits", "F.cross_entropy(F.softmax(logits, dim=1)")


class Editor:
    """The document as the client sees it, and the incremental changes that edit it."""

    def __init__(self, text: str) -> None:
        self.text = text.rstrip("\n") + "\n" + SOAK_TAIL
        self.comment_end = self.text.index("# soak:") + len("# soak:")

    def change(self, step: int) -> types.TextDocumentContentChangePartial:
        if step % 50 == 0:  # the planted TL101 on at every 100th edit, off at the 50th
            old, new = BUG if step % 100 == 0 else BUG[::-1]
            start = self.text.find(old)
            if start != -1:
                return self._replace(start, start + len(old), new)
        if step % 2:
            return self._replace(self.comment_end, self.comment_end, "x")
        return self._replace(self.comment_end - 1, self.comment_end, "")

    def _replace(self, start: int, end: int, new: str) -> types.TextDocumentContentChangePartial:
        change = types.TextDocumentContentChangePartial(
            range=types.Range(position(self.text, start), position(self.text, end)), text=new
        )
        if start <= self.comment_end:
            self.comment_end += len(new) - (end - start)
        self.text = self.text[:start] + new + self.text[end:]
        return change


def _resolve(future: asyncio.Future, count: int) -> None:
    if not future.done():
        future.set_result(count)


async def run(edits: int, wait_every: int, source: Path, real: int) -> None:
    # Only the URI is needed: the document lives in the editor, never on disk.
    uri = (Path(tempfile.gettempdir()) / "torchls-soak" / "soak.py").as_uri()
    editor = Editor(source.read_text(encoding="utf-8"))
    client = LanguageClient("torchls-soak", "0")
    published: dict[int, asyncio.Future] = {}

    @client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    def on_diagnostics(params: types.PublishDiagnosticsParams) -> None:
        # pygls may call this off the event loop's thread: hand the result over thread-safely.
        future = published.get(params.version if params.version is not None else -1)
        if future is not None:
            future.get_loop().call_soon_threadsafe(_resolve, future, len(params.diagnostics))

    await client.start_io(sys.executable, "-m", "torchls", "server")
    server = client._server  # type: ignore[attr-defined]
    server_pid = server.pid
    # pygls pipes the server's stderr and never reads it: drain it, or a chatty server blocks.
    log_lines: list[bytes] = []

    async def drain_stderr() -> None:
        while line := await server.stderr.readline():
            log_lines.append(line)

    drainer = asyncio.create_task(drain_stderr())
    corpus = real_files(real)
    await client.initialize_async(
        types.InitializeParams(
            capabilities=types.ClientCapabilities(),
            process_id=None,
            root_uri=CACHE.as_uri() if corpus else None,
        )
    )
    client.initialized(types.InitializedParams())
    loop = asyncio.get_running_loop()
    await idle(server_pid)
    initial = status_kb(server_pid, "VmRSS")
    real_figures: list[str] = []
    if corpus:
        real_figures = await open_and_close(client, server_pid, corpus, published, initial)
    published[0] = loop.create_future()
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(
                uri=uri, language_id="python", version=0, text=editor.text
            )
        )
    )
    await asyncio.wait_for(published[0], WAIT_S)

    async def edit_range(first: int, last: int) -> None:
        for version in range(first, last + 1):
            wait = version % wait_every == 0 or version == last
            if wait:
                published[version] = loop.create_future()
            client.text_document_did_change(
                types.DidChangeTextDocumentParams(
                    text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                    content_changes=[editor.change(version)],
                )
            )
            if version % 100 == 0:
                where = position(editor.text, len(editor.text) // 2)
                document = types.TextDocumentIdentifier(uri=uri)
                await client.text_document_hover_async(types.HoverParams(document, where))
                await client.text_document_code_action_async(
                    types.CodeActionParams(
                        document,
                        types.Range(types.Position(0, 0), where),
                        types.CodeActionContext(diagnostics=[]),
                    )
                )
            if wait:
                await asyncio.wait_for(published[version], WAIT_S)
                del published[version]
            if version % sample_every == 0:
                trajectory.append((version, status_kb(server_pid, "VmRSS")))

    trajectory: list[tuple[int, int]] = []
    sample_every = max(1, edits // 10)
    warm_up = 200
    await edit_range(1, warm_up)
    before = status_kb(server_pid, "VmRSS")
    started = time.perf_counter()
    await edit_range(warm_up + 1, warm_up + edits)
    elapsed = time.perf_counter() - started
    after = status_kb(server_pid, "VmRSS")
    peak = status_kb(server_pid, "VmHWM")

    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()
    await drainer

    lines = editor.text.count("\n")
    print(f"server RSS after initialize: {initial / 1024:.1f} MiB")
    for line in real_figures:
        print(line)
    print(f"document: {source.name}, {lines} lines; {edits} incremental edits after {warm_up}")
    print(f"waited for the diagnostics of every {wait_every}th version")
    print(f"server RSS before: {before / 1024:.1f} MiB; after: {after / 1024:.1f} MiB")
    print(f"growth: {(after - before) / 1024:+.1f} MiB ({(after - before) / before:+.1%})")
    print(f"peak RSS (VmHWM): {peak / 1024:.1f} MiB")
    points = ", ".join(f"{version - warm_up}: {kb / 1024:.1f}" for version, kb in trajectory)
    print(f"RSS (MiB) after N edits: {points}")
    print(f"{edits / elapsed:.0f} edits/s ({elapsed:.1f} s)")
    print(f"server log: {len(log_lines)} lines on stderr")
    for line in log_lines[:5]:
        print("  " + line.decode("utf-8", "replace").rstrip()[:200])


async def open_and_close(
    client: LanguageClient,
    pid: int,
    files: list[Path],
    published: dict[int, asyncio.Future],
    initial: int,
) -> list[str]:
    """Open every file of `files` (waiting for its diagnostics), then close them all; the RSS
    after each, once the server is idle. Returns the lines to print."""
    loop = asyncio.get_running_loop()
    lines = sum(path.read_bytes().count(b"\n") for path in files)
    started = time.perf_counter()
    for path in files:
        published[0] = loop.create_future()
        client.text_document_did_open(
            types.DidOpenTextDocumentParams(
                text_document=types.TextDocumentItem(
                    uri=path.as_uri(),
                    language_id="python",
                    version=0,
                    text=path.read_text(encoding="utf-8", errors="replace"),
                )
            )
        )
        await asyncio.wait_for(published[0], WAIT_S)
    await idle(pid)
    opened_s = time.perf_counter() - started
    opened = status_kb(pid, "VmRSS")
    for path in files:
        client.text_document_did_close(
            types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri=path.as_uri()))
        )
    await asyncio.sleep(2.0)  # past the server's trim delay after the last close
    await idle(pid)
    closed = status_kb(pid, "VmRSS")
    published.pop(0, None)
    return [
        f"real files: {len(files)} open ({lines} lines), all analysed in {opened_s:.1f} s",
        f"server RSS with them open: {opened / 1024:.1f} MiB "
        f"({(opened - initial) / 1024:+.1f} MiB over initialize)",
        f"server RSS after closing them: {closed / 1024:.1f} MiB "
        f"({(closed - initial) / 1024:+.1f} MiB over initialize)",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--edits", type=int, default=10_000)
    parser.add_argument("--wait-every", type=int, default=10)
    parser.add_argument("--file", type=Path, default=DEFAULT_FILE)
    parser.add_argument(
        "--real", type=int, default=200, help="real corpus files to open and close (0: none)"
    )
    options = parser.parse_args()
    asyncio.run(run(options.edits, options.wait_every, options.file, options.real))


if __name__ == "__main__":
    main()
