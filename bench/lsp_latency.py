"""Benchmark: didChange → publishDiagnostics latency of the real server over stdio.

Starts `python -m torchls server`, opens a generated 2,000-line training module, then sends 200
edits one at a time (each a full-text change that toggles a planted bug on and off, so the
diagnostics really change) and measures the time until the diagnostics for that version
arrive. Prints p50/p95/max (target: p95 <= 30 ms) and, as a baseline measured in the same run,
the in-process analysis time of the same text. No assertions.
Usage: python bench/lsp_latency.py [--edits 200] [--lines 2000]
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

from torchls.analysis import analyze

BUG_OFF = "loss = criterion(logits, "
BUG_ON = "loss = criterion(F.softmax(logits, dim=-1), "


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


async def run(edits: int, lines: int) -> None:
    source = large_module(lines)
    assert BUG_OFF in source
    uri = Path("/tmp/torchls_bench_module.py").as_uri()
    client = LanguageClient("torchls-bench", "0")
    arrivals: dict[int, float] = {}
    counts: dict[int, int] = {}
    waiting: dict[int, asyncio.Future] = {}

    @client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    def on_diagnostics(params: types.PublishDiagnosticsParams) -> None:
        version = params.version if params.version is not None else -1
        arrivals[version] = time.perf_counter()
        counts[version] = len(params.diagnostics)
        future = waiting.pop(version, None)
        if future is not None and not future.done():
            future.set_result(None)

    await client.start_io(sys.executable, "-m", "torchls", "server")
    await client.initialize_async(
        types.InitializeParams(capabilities=types.ClientCapabilities(), process_id=None)
    )
    client.initialized(types.InitializedParams())

    loop = asyncio.get_running_loop()
    waiting[0] = loop.create_future()
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(
                uri=uri, language_id="python", version=0, text=source
            )
        )
    )
    await asyncio.wait_for(waiting[0], 30)

    latencies = []
    texts = []
    for version in range(1, edits + 1):
        text = source.replace(BUG_OFF, BUG_ON, 1) if version % 2 else source
        texts.append(text)
        waiting[version] = loop.create_future()
        sent = time.perf_counter()
        client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)],
            )
        )
        await asyncio.wait_for(waiting[version], 30)
        latencies.append((arrivals[version] - sent) * 1000)

    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()

    baseline = []
    for text in texts[:40]:
        start = time.perf_counter()
        analyze(text, "bench.py")
        baseline.append((time.perf_counter() - start) * 1000)
    changed = len({counts[v] for v in range(1, edits + 1)})
    print(
        f"document: {source.count(chr(10))} lines; {edits} edits; {changed} distinct finding counts"
    )
    print(
        f"didChange -> publishDiagnostics: p50 {statistics.median(latencies):.1f} ms, "
        f"p95 {percentile(latencies, 0.95):.1f} ms, max {max(latencies):.1f} ms (target p95 <= 30)"
    )
    base = statistics.median(baseline)
    print(f"in-process analysis of the same text (baseline): p50 {base:.1f} ms")
    print(f"protocol + server overhead at p50: {statistics.median(latencies) / base:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--edits", type=int, default=200)
    parser.add_argument("--lines", type=int, default=2000)
    options = parser.parse_args()
    asyncio.run(run(options.edits, options.lines))


if __name__ == "__main__":
    main()
