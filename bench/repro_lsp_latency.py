"""Benchmark: the repro round trip through the language server, first (cold) and warm.

Starts `python -m torchls server` over stdio, opens a small training script whose `torch.log`
makes the first NaN, and sends `workspace/executeCommand torchls.runRepro` several times. For each
run it measures the time from sending the command to the `publishDiagnostics` that carries the
TL901 finding (what the user waits for), and to the command's response. The first run is cold
(fresh sandboxed interpreter, `import torch`) and starts the server's warm worker; later runs fork
from it. Optionally also times a realistic example (`examples/image_classifier.py`, TL903).
Prints every run and the warm median/max. No assertions.
Usage: python bench/repro_lsp_latency.py [--runs 10] [--example]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.lsp.client import LanguageClient

NAN_SCRIPT = """\
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
model = nn.Linear(4, 3)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(8, 4)
y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
for step in range(10):
    probs = F.softmax(model(x), dim=1) * (y[:, None] != 0)
    logp = torch.log(probs)
    loss = -(logp * F.one_hot(y, 3)).sum() / len(y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "image_classifier.py"


class Bench:
    def __init__(self) -> None:
        self.client = LanguageClient("torchls-bench", "0")
        self.waiting: list[tuple[str, str, asyncio.Future[float]]] = []

        @self.client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        def on_diagnostics(params: types.PublishDiagnosticsParams) -> None:
            now = time.perf_counter()
            found = {str(d.code) for d in params.diagnostics if d.source == "torchls-probe"}
            for waiter in list(self.waiting):
                uri, code, future = waiter
                if uri == params.uri and code in found and not future.done():
                    future.set_result(now)
                    self.waiting.remove(waiter)

        @self.client.feature(types.WINDOW_SHOW_MESSAGE)
        def on_message(params: types.ShowMessageParams) -> None:
            print(f"  (server says: {params.message})")

        @self.client.feature(types.WINDOW_LOG_MESSAGE)
        def on_log(params: types.LogMessageParams) -> None:
            pass  # the run summaries; the figures printed here say the same

    async def start(self, root: Path) -> None:
        await self.client.start_io(sys.executable, "-m", "torchls", "server")
        await self.client.initialize_async(
            types.InitializeParams(
                capabilities=types.ClientCapabilities(),
                process_id=None,
                root_uri=root.as_uri(),
                initialization_options={"settings": {"probe": {"device": "cpu"}}},
            )
        )
        self.client.initialized(types.InitializedParams())

    def open(self, path: Path) -> str:
        uri = path.as_uri()
        self.client.text_document_did_open(
            types.DidOpenTextDocumentParams(
                text_document=types.TextDocumentItem(
                    uri=uri, language_id="python", version=1, text=path.read_text("utf-8")
                )
            )
        )
        return uri

    async def run(self, uri: str, code: str) -> tuple[float, float, dict[str, Any]]:
        """(seconds to the publish with `code`, seconds to the response, the response)."""
        published: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.waiting.append((uri, code, published))
        started = time.perf_counter()
        result = await self.client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="torchls.runRepro", arguments=[{"uri": uri}])
        )
        answered = time.perf_counter()
        arrived = await asyncio.wait_for(published, 120)
        return arrived - started, answered - started, result

    async def stop(self) -> None:
        await self.client.shutdown_async(None)
        self.client.exit(None)
        await self.client.stop()


async def series(bench: Bench, label: str, uri: str, code: str, runs: int) -> None:
    print(f"{label}: command -> publishDiagnostics with {code}")
    warm: list[float] = []
    for index in range(runs):
        to_publish, to_response, result = await bench.run(uri, code)
        runner = result.get("runner") if isinstance(result, dict) else None
        print(
            f"  run {index + 1:2d} ({runner}): {to_publish * 1000:7.0f} ms to the diagnostics, "
            f"{to_response * 1000:7.0f} ms to the response"
        )
        if runner == "warm":
            warm.append(to_publish)
    if warm:
        print(
            f"  warm: median {statistics.median(warm) * 1000:.0f} ms, "
            f"max {max(warm) * 1000:.0f} ms over {len(warm)} runs"
        )


async def main(runs: int, example: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="torchls-bench-") as folder:
        root = Path(folder)
        script = root / "train.py"
        script.write_text(NAN_SCRIPT, encoding="utf-8")
        bench = Bench()
        await bench.start(root)
        try:
            await series(bench, "NaN script", bench.open(script), "TL901", runs)
            if example:
                copy = root / EXAMPLE.name
                copy.write_text(EXAMPLE.read_text("utf-8"), encoding="utf-8")
                await series(bench, EXAMPLE.name, bench.open(copy), "TL903", max(3, runs // 2))
        finally:
            await bench.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--example", action="store_true", help="also time the image example")
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.example))
