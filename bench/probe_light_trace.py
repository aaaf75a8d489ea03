"""Benchmark: code that builds no graph (sampling between training steps) under the probe.

Runs in this interpreter (it needs torch). `generate` is a small autoregressive sampler under
`torch.no_grad()` (300 tokens: embedding, linear, softmax, multinomial, cat per token), the
kind of phase minGPT runs after every step. Prints its wall time plain, fully traced (every op
of every call recorded, as before the light trace), and with the probe's light trace (each op
of a line traced on its first `LIGHT_REPEATS` calls while autograd is off), with the ratios
against plain measured in the same run. No assertions.
Usage: python bench/probe_light_trace.py [--tokens 300] [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "probes"))

from torchls_probe import tracer  # noqa: E402
from torchls_probe.attribution import UserCode  # noqa: E402
from torchls_probe.hooks import Hooks  # noqa: E402
from torchls_probe.params import Roots  # noqa: E402
from torchls_probe.progress import Progress  # noqa: E402

MODEL = nn.Sequential(nn.Embedding(64, 32), nn.Linear(32, 64))


@torch.no_grad()
def generate(tokens: int) -> torch.Tensor:
    idx = torch.zeros(1, 1, dtype=torch.long)
    for _ in range(tokens):
        logits = MODEL(idx[:, -8:])[:, -1, :]
        probs = torch.softmax(logits, dim=-1)
        idx = torch.cat([idx, torch.multinomial(probs, 1)], dim=1)
    return idx


def best_of(repeat: int, tokens: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        generate(tokens)
        times.append(time.perf_counter() - started)
    return min(times)


def traced(repeats: int, repeat: int, tokens: int) -> float:
    tracer.LIGHT_REPEATS = repeats
    user = UserCode([str(Path(__file__).parent)], [__file__], [])
    trace = tracer.Trace(user, 400, 8, 20)
    hooks = Hooks(trace, Roots(user), 1000, 1000, Progress(None))
    undo = hooks.install()
    try:
        with tracer.Tracer(trace, 4):
            return best_of(repeat, tokens)
    finally:
        undo()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    light_default = tracer.LIGHT_REPEATS
    plain = best_of(args.repeat, args.tokens)
    full = traced(10**9, args.repeat, args.tokens)
    light = traced(light_default, args.repeat, args.tokens)
    print(f"plain       {plain * 1000:8.1f} ms")
    print(f"full trace  {full * 1000:8.1f} ms  {full / plain:5.2f}x plain")
    print(f"light trace {light * 1000:8.1f} ms  {light / plain:5.2f}x plain")


if __name__ == "__main__":
    main()
