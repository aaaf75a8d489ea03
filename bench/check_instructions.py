"""Benchmark: analysis cost in simulated CPU work (valgrind/callgrind), against a baseline revision.

Why: on a shared, loaded machine wall-clock ratios move by 10% from run to run; callgrind's
instruction and cache-miss counts do not. This runs the same work as `bench/check_vs_ast.py`
(in-process `analyze()` over the generated corpus) for the working tree and for a baseline
git revision exported to a temporary folder, and prints instructions and estimated cycles
(Ir + 10 x L1 misses + 100 x last-level misses) per pass, and their ratio. No assertions.
Needs `valgrind` on PATH. Usage: python bench/check_instructions.py [--baseline REV] [--files 40]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = """
import sys
sys.path.insert(0, {bench!r})
from pathlib import Path
from corpus import write_corpus
from torchls.analysis import analyze
paths = write_corpus(Path({folder!r}), {files})
sources = [(p.read_bytes(), str(p)) for p in paths]
for _ in range({passes}):
    for source, name in sources:
        analyze(source, name)
"""


def simulated(server: Path, folder: Path, files: int, passes: int) -> tuple[int, int]:
    """(instructions, estimated cycles) of one run of the workload with `passes` passes."""
    script = WORKLOAD.format(
        bench=str(ROOT / "bench"), folder=str(folder), files=files, passes=passes
    )
    out = folder / f"callgrind.{passes}.out"
    env = {**os.environ, "PYTHONPATH": str(server)}
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--cache-sim=yes",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-c",
            script,
        ],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    summary = subprocess.run(
        ["callgrind_annotate", str(out)], capture_output=True, text=True, check=True
    ).stdout
    line = next(row for row in summary.splitlines() if "PROGRAM TOTALS" in row)
    counts = [int(n.replace(",", "")) for n in re.findall(r"([\d,]+) \(", line)]
    ir, _dr, _dw, i1, d1r, d1w, ill, dllr, dllw = counts[:9]
    return ir, ir + 10 * (i1 + d1r + d1w) + 100 * (ill + dllr + dllw)


def per_pass(server: Path, files: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as folder:
        base_ir, base_cycles = simulated(server, Path(folder), files, 0)
        ir, cycles = simulated(server, Path(folder), files, 2)
    return (ir - base_ir) / 2, (cycles - base_cycles) / 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--baseline", help="git revision to compare with (e.g. cc1ffa3)")
    parser.add_argument("--files", type=int, default=40)
    options = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt-get install valgrind)")
    rows = [("working tree", ROOT / "server")]
    exported = None
    if options.baseline:
        exported = tempfile.mkdtemp()
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", options.baseline, "server"],
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", exported], input=archive, check=True)
        rows.insert(0, (f"baseline {options.baseline}", Path(exported) / "server"))
    results = {}
    try:
        for label, server in rows:
            results[label] = per_pass(server, options.files)
            ir, cycles = results[label]
            print(f"{label:>20}: {ir / 1e6:8.0f} M instructions, {cycles / 1e6:8.0f} M est. cycles")
    finally:
        if exported:
            shutil.rmtree(exported, ignore_errors=True)
    if options.baseline:
        base, new = results[rows[0][0]], results["working tree"]
        print(
            f"ratio working tree / baseline: instructions {new[0] / base[0]:.3f}, "
            f"est. cycles {new[1] / base[1]:.3f}"
        )


if __name__ == "__main__":
    main()
