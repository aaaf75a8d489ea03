"""Benchmark: analysis cost in simulated CPU work (valgrind/callgrind), against a baseline revision.

Why: on a shared, loaded machine wall-clock ratios move by 10% from run to run; callgrind's
instruction and cache-miss counts do not. This runs the same work as `bench/check_vs_ast.py`
(in-process `analyze()` over the generated corpus) for the working tree and for a baseline
git revision exported to a temporary folder, and prints instructions and estimated cycles
(Ir + 10 x L1 misses + 100 x last-level misses) per pass, and their ratio. No assertions.

`--real N`: the workload is instead what `torchls check .` does in each of the first N small
repositories of the real corpus (at most 60 files each, every Python file the checker finds
there, that repository as the project root, serial, no cache), when the snapshots are on
this machine (see bench/real_corpus.py); also counted is the floor of the same files (read,
`ast.parse`, `ast.walk`), and the check's ratio to it is printed.
Needs `valgrind` on PATH.
Usage: python bench/check_instructions.py [--baseline REV] [--files 40] [--real N]
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


REAL_WORKLOAD = """
import sys
sys.path.insert(0, {bench!r})
from pathlib import Path
from check_vs_ast import floor, real_projects
from torchls.checker import CheckOptions, ConfigResolver, check_paths, discover
projects = []
for root, _ in real_projects():
    files = discover([str(root)], ConfigResolver(root / "pyproject.toml")).files
    if 0 < len(files) <= 60:
        projects.append((root, files))
projects = projects[: {repositories}]
for _ in range({passes}):
    for root, files in projects:
        if {mode!r} == "floor":
            floor(files)
            continue
        options = CheckOptions(root=root, jobs=1, cache=False, config=root / "pyproject.toml")
        list(check_paths(files, ConfigResolver(root / "pyproject.toml"), options))
"""


def simulated(
    server: Path, folder: Path, files: int, passes: int, real: int = 0, mode: str = "check"
) -> tuple[int, int]:
    """(instructions, estimated cycles) of one run of the workload with `passes` passes."""
    if real:
        script = REAL_WORKLOAD.format(
            bench=str(ROOT / "bench"), repositories=real, passes=passes, mode=mode
        )
    else:
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


def per_pass(server: Path, files: int, real: int = 0, mode: str = "check") -> tuple[float, float]:
    passes = 1 if real else 2  # a real pass is long enough on its own
    with tempfile.TemporaryDirectory() as folder:
        base_ir, base_cycles = simulated(server, Path(folder), files, 0, real, mode)
        ir, cycles = simulated(server, Path(folder), files, passes, real, mode)
    return (ir - base_ir) / passes, (cycles - base_cycles) / passes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--baseline", help="git revision to compare with (e.g. cc1ffa3)")
    parser.add_argument("--files", type=int, default=40)
    parser.add_argument("--real", type=int, default=0, metavar="N")
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
        if options.real:
            floor_ir, floor_cycles = per_pass(ROOT / "server", 0, options.real, "floor")
            print(
                f"{'floor':>20}: {floor_ir / 1e6:8.0f} M instructions, "
                f"{floor_cycles / 1e6:8.0f} M est. cycles"
            )
        for label, server in rows:
            results[label] = per_pass(server, options.files, options.real)
            ir, cycles = results[label]
            line = f"{label:>20}: {ir / 1e6:8.0f} M instructions, {cycles / 1e6:8.0f} M est. cycles"
            if options.real:
                line += f"  ({ir / floor_ir:.2f}x, {cycles / floor_cycles:.2f}x the floor)"
            print(line)
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
