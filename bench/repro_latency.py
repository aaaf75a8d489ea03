"""Benchmark: round trip of a repro, cold (fresh interpreter) vs warm (forked from a worker).

Writes a small training script (MLP, cross-entropy, Adam, 2 optimizer steps) into a temporary
folder and times `run_repro` (cold: start the interpreter in the sandbox, import torch, run,
report) and `ReproSession.run` after the session's worker is ready (warm: fork a child of a
process that already imported torch). Both go through the full sandbox available here and
return the full report. Prints medians and minima (targets: warm <= 0.5 s; cold ~2.6 s on these
2-core machines). No assertions.
Usage: python bench/repro_latency.py [--runs 5] [--python PATH]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from torchls.probe import ReproOptions, run_repro
from torchls.probe.prepare import prepare
from torchls.probe.warm import ReproSession

SCRIPT = """\
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
for step in range(100):
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def timed(run) -> tuple[float, str]:
    started = time.perf_counter()
    report = run()
    return time.perf_counter() - started, f"{report.status}/{report.data['timing']['runner']}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--python", default=sys.executable, help="interpreter with torch")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="torchls-bench-") as folder:
        path = Path(folder) / "train.py"
        path.write_text(SCRIPT)
        options = ReproOptions(python=args.python, device="cpu")
        cold = [timed(lambda: run_repro(path, options)) for _ in range(args.runs)]
        session = ReproSession()
        try:
            started = time.perf_counter()
            session.prewarm_prepared(prepare(path, options), wait=True)
            ready = time.perf_counter() - started
            warm = [timed(lambda: session.run(path, options)) for _ in range(args.runs)]
        finally:
            session.close()
    for label, results in (("cold", cold), ("warm", warm)):
        seconds = [s for s, _ in results]
        kinds = sorted({k for _, k in results})
        print(
            f"{label}: median {statistics.median(seconds):.3f} s, min {min(seconds):.3f} s, "
            f"max {max(seconds):.3f} s over {len(seconds)} runs ({', '.join(kinds)})"
        )
    print(f"warm worker start (import torch + warm-up, in the sandbox): {ready:.2f} s")
    ratio = statistics.median(s for s, _ in cold) / statistics.median(s for s, _ in warm)
    print(f"cold/warm: {ratio:.1f}x   (target: warm <= 0.5 s)")


if __name__ == "__main__":
    main()
