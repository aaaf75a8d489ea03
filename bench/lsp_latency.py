"""Benchmark: didChange → publishDiagnostics and hover latency of the real server over stdio.

Starts `python -m torchls server` and, one after the other, opens two documents of about
2,000 lines: a generated training module, and real code assembled at run time from the real
corpus files (`bench/real_corpus.py` materialises them from fetched snapshots; skipped when
they are absent), with a small training step appended. For each it sends 200 edits one at a
time (each a full-text change that toggles a planted bug on and off, so the diagnostics
really change) and measures the time until the diagnostics for that version arrive, then
sends `--hovers` hover requests (on the loss call, and on names spread over the file) and
measures each reply. Prints p50/p95/max (targets: p95 <= 30 ms for diagnostics, <= 10 ms for
hover) and, as a baseline measured in the same run, the in-process analysis time of the same
text. No assertions.
Usage: python bench/lsp_latency.py [--edits 200] [--lines 2000] [--hovers 200]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

from lsprotocol import types
from pygls.lsp.client import LanguageClient

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus import large_module
from memory_soak import real_files

from torchls.analysis import analyze

BUG_OFF = "loss = criterion(logits, "
BUG_ON = "loss = criterion(F.softmax(logits, dim=-1), "
REAL_TAIL = """

# --- appended by bench/lsp_latency.py: the step whose bug the edits toggle ---
import torch.nn as nn
import torch.nn.functional as F


def bench_step(model, batch, targets, optimizer):
    criterion = nn.CrossEntropyLoss()
    logits = model(batch)
    loss = criterion(logits, targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()
"""


def real_module(lines: int) -> str | None:
    """About `lines` lines of real training code: whole corpus files that parse, one after
    the other (`from __future__` imports dropped: they must open a module), plus a step."""
    import ast

    parts: list[str] = []
    total = 0
    for path in real_files(400):
        text = path.read_text(encoding="utf-8", errors="replace")
        text = "\n".join(
            line for line in text.splitlines() if not line.startswith("from __future__")
        )
        try:
            ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        parts.append(f"# --- {path.name} ---\n{text}\n")
        total += text.count("\n") + 2
        if total >= lines:
            return "\n".join(parts) + REAL_TAIL
    return None


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


async def run(edits: int, lines: int, hovers: int) -> None:
    documents = [("generated", large_module(lines))]
    real = real_module(lines)
    if real is not None:
        documents.append(("real code", real))
    client = LanguageClient("torchls-bench", "0")
    arrivals: dict[tuple[str, int], float] = {}
    counts: dict[tuple[str, int], int] = {}
    waiting: dict[tuple[str, int], asyncio.Future] = {}

    @client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    def on_diagnostics(params: types.PublishDiagnosticsParams) -> None:
        key = (params.uri, params.version if params.version is not None else -1)
        arrivals[key] = time.perf_counter()
        counts[key] = len(params.diagnostics)
        future = waiting.pop(key, None)
        if future is not None and not future.done():
            future.set_result(None)

    await client.start_io(sys.executable, "-m", "torchls", "server")
    await client.initialize_async(
        types.InitializeParams(capabilities=types.ClientCapabilities(), process_id=None)
    )
    client.initialized(types.InitializedParams())
    loop = asyncio.get_running_loop()
    results = []
    for index, (name, source) in enumerate(documents):
        assert BUG_OFF in source
        uri = Path(f"/tmp/torchls_bench_module_{index}.py").as_uri()
        waiting[(uri, 0)] = loop.create_future()
        client.text_document_did_open(
            types.DidOpenTextDocumentParams(
                text_document=types.TextDocumentItem(
                    uri=uri, language_id="python", version=0, text=source
                )
            )
        )
        await asyncio.wait_for(waiting[(uri, 0)], 30)
        latencies, texts = [], []
        for version in range(1, edits + 1):
            text = source.replace(BUG_OFF, BUG_ON, 1) if version % 2 else source
            texts.append(text)
            waiting[(uri, version)] = loop.create_future()
            sent = time.perf_counter()
            client.text_document_did_change(
                types.DidChangeTextDocumentParams(
                    text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                    content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)],
                )
            )
            await asyncio.wait_for(waiting[(uri, version)], 30)
            latencies.append((arrivals[(uri, version)] - sent) * 1000)
        hover_times = await hover_latencies(client, uri, texts[-1], hovers)
        changed = len({counts[(uri, v)] for v in range(1, edits + 1)})
        results.append((name, texts, latencies, hover_times, changed))
        client.text_document_did_close(
            types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri=uri))
        )

    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()

    for name, texts, latencies, hover_times, changed in results:
        baseline = []
        for text in texts[:40]:
            start = time.perf_counter()
            analyze(text, "bench.py")
            baseline.append((time.perf_counter() - start) * 1000)
        print(
            f"{name} document: {texts[0].count(chr(10))} lines; {edits} edits; "
            f"{changed} distinct finding counts"
        )
        print(
            f"  didChange -> publishDiagnostics: p50 {statistics.median(latencies):.1f} ms, "
            f"p95 {percentile(latencies, 0.95):.1f} ms, max {max(latencies):.1f} ms "
            "(target p95 <= 30)"
        )
        base = statistics.median(baseline)
        print(f"  in-process analysis of the same text (baseline): p50 {base:.1f} ms")
        print(f"  protocol + server overhead at p50: {statistics.median(latencies) / base:.2f}x")
        if hover_times:
            print(
                f"  hover ({len(hover_times)} requests): p50 {statistics.median(hover_times):.1f} "
                f"ms, p95 {percentile(hover_times, 0.95):.1f} ms, max {max(hover_times):.1f} ms "
                "(target p95 <= 10)"
            )
    if real is None:
        print("real code document: the real corpus is not present here; skipped")


async def hover_latencies(client: LanguageClient, uri: str, text: str, count: int) -> list[float]:
    """Round trips of `count` hovers: every other one on the loss call (where the loss
    contract is shown), the rest on identifiers spread evenly over the file."""
    lines = text.splitlines()
    loss_row = next(row for row, line in enumerate(lines) if "criterion(" in line)
    loss_at = types.Position(loss_row, lines[loss_row].index("criterion(") + 2)
    spots = []
    for row in range(0, len(lines), max(1, len(lines) // max(1, count))):
        line = lines[row]
        column = next((c for c, ch in enumerate(line) if ch.isalpha()), None)
        if column is not None:
            spots.append(types.Position(row, column))
    document = types.TextDocumentIdentifier(uri=uri)
    times = []
    for index in range(count):
        where = loss_at if index % 2 == 0 or not spots else spots[index % len(spots)]
        sent = time.perf_counter()
        await client.text_document_hover_async(types.HoverParams(document, where))
        times.append((time.perf_counter() - sent) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--edits", type=int, default=200)
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--hovers", type=int, default=200)
    options = parser.parse_args()
    asyncio.run(run(options.edits, options.lines, options.hovers))


if __name__ == "__main__":
    main()
