"""Benchmark: one training step traced by the probe vs the same step plain, as a ratio.

Runs in this interpreter (it needs torch). The step is a small CNN (conv 3->16 -> relu ->
maxpool -> conv 16->32 -> relu -> maxpool -> linear 2048->128 -> relu -> linear 128->10) on a
64x3x32x32 batch with cross-entropy and SGD with momentum, the case measured in
../shared/research/probe-notes.md. The traced step runs under exactly what a repro installs
(TorchFunctionMode tracer, global module and optimizer hooks, autograd node hooks), with this
file as the user's code. Plain and traced steps are interleaved in pairs so that load from other
processes hits both alike; prints medians, minima and ratios (target <= 1.3x). No assertions.
Usage: python bench/probe_overhead.py [--pairs 15] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "probes"))

from torchls_probe.attribution import UserCode  # noqa: E402
from torchls_probe.hooks import Hooks  # noqa: E402
from torchls_probe.params import Roots  # noqa: E402
from torchls_probe.progress import Progress  # noqa: E402
from torchls_probe.tracer import Trace, Tracer  # noqa: E402


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 8 * 8, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()


def timed(run) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--threads", type=int, default=0, help="0: torch's default")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = CNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,))

    user = UserCode([str(Path(__file__).resolve().parent)], [__file__], [])
    # Limits as in a repro; the step bound is out of reach so hooks never stop the loop.
    trace = Trace(user, max_lines=400, max_entries=8, max_events=20)
    hooks = Hooks(trace, Roots(user), steps=10**9, batches=10**9, progress=Progress(None))
    tracer = Tracer(trace, max_outputs=4)

    def traced() -> None:
        undo = hooks.install()
        try:
            with tracer:
                step(model, opt, x, y)
        finally:
            undo()

    first_traced = timed(traced)
    step(model, opt, x, y)  # warm-up of the plain path
    plain, probe = [], []
    for _ in range(args.pairs):
        plain.append(timed(lambda: step(model, opt, x, y)))
        probe.append(timed(traced))
    p, t = statistics.median(plain), statistics.median(probe)
    threads = torch.get_num_threads()
    print(f"threads {threads}, {args.pairs} interleaved pairs, torch {torch.__version__}")
    print(f"plain step    median {p * 1000:7.2f} ms   min {min(plain) * 1000:7.2f} ms")
    print(f"traced step   median {t * 1000:7.2f} ms   min {min(probe) * 1000:7.2f} ms")
    print(f"first traced step (probe construction, lazy init): {first_traced * 1000:.1f} ms")
    print(f"ratio traced/plain: median {t / p:.2f}x, min {min(probe) / min(plain):.2f}x")
    print("(target <= 1.3x; on a loaded machine trust the min ratio)")
    print(f"lines recorded: {len(trace.lines.lines)}, non-finite events: {len(trace.events.items)}")


if __name__ == "__main__":
    main()
