"""Benchmark: `torchls check` analysis time against a bare `ast.parse` of the same files.

Prints the corpus size, the median of several runs for each, and the ratio (target: <= 3x the
parse floor). Also times the real CLI end to end (process start included). No assertions.
Usage: python bench/check_vs_ast.py [--files 40] [--repeat 5]
"""

from __future__ import annotations

import argparse
import ast
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus import write_corpus

from torchls.analysis import analyze


def median_seconds(action, repeat: int) -> float:
    timings = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        timings.append(time.perf_counter() - start)
    return statistics.median(timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=5)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        paths = write_corpus(Path(folder), options.files)
        sources = [path.read_bytes() for path in paths]
        lines = sum(source.count(b"\n") for source in sources)
        findings = sum(
            len(analyze(s, str(p)).findings) for s, p in zip(sources, paths, strict=True)
        )

        parse = median_seconds(lambda: [ast.parse(s) for s in sources], options.repeat)
        check = median_seconds(
            lambda: [analyze(s, str(p)) for s, p in zip(sources, paths, strict=True)],
            options.repeat,
        )
        cli = median_seconds(
            lambda: subprocess.run(
                [sys.executable, "-m", "torchls", "check", "--exit-zero", folder],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                check=False,
            ),
            max(1, options.repeat // 2),
        )
        print(f"corpus: {len(paths)} files, {lines} lines, {findings} findings")
        print(f"ast.parse floor:   {parse * 1000:8.1f} ms")
        print(f"torchls analysis:  {check * 1000:8.1f} ms  ({lines / check:,.0f} lines/s)")
        print(f"ratio analysis / ast.parse: {check / parse:.2f}x (target <= 3x)")
        print(f"torchls check CLI end to end (process start included): {cli * 1000:.0f} ms")


if __name__ == "__main__":
    main()
