"""Benchmark: `torchls check` analysis time against a bare `ast.parse` of the same files.

Generated corpus (always): prints the corpus size, the median of several runs for each, and
the ratio of the in-process `analyze()` to `ast.parse` (target: <= 3x the parse floor). Also
times the real CLI end to end (process start included).

Real corpus (when the fetched snapshots are on this machine; `bench/real_corpus.py` rebuilds
the manifest's clean files under ~/.cache/torchls-corpus; skipped otherwise, or with
`--no-real`): the same files checked the way users check them, one project (repository) at a
time with its root as the project root, so imports of project modules are followed. The floor
there is reading each file plus `ast.parse` and a full `ast.walk`. Measured in the same run,
each with its ratio to that floor: in-process `analyze()` without a project (in-file only);
in-process `check_paths` (cross-file on) serial and parallel without the cache, with a cold
cache and with a warm one; the whole `torchls check` CLI per repository (process start
included), cold and warm cache, `--jobs 1` and one job per core; and TorchFix on the same files
(when it is installed in this environment), side by side. Every ratio compares figures of
this run: the machine may be shared, so repeat the run before reading much into one figure.
Every in-process timing includes collecting the garbage the timed code left behind (the floor's
too), so work deferred to the cyclic collector is not left out of the figure.
Before any timing, the bytecode of torchls is written, as an install writes it.
`--whole N` adds the check users run most, `torchls check .` from the root of each whole
repository of the real corpus with at most N Python files: every file the checker finds
there, so the modules the scripts import are checked (and in the floor) too; in-process serial,
the CLI (process start included, `--jobs 1` and the default) and TorchFix, side by side.
No assertions.
Usage: python bench/check_vs_ast.py [--files 40] [--repeat 5] [--real-repeat 1] [--no-real]
                                    [--whole N] [--only-whole] [--no-torchfix]
"""

from __future__ import annotations

import argparse
import ast
import compileall
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus import write_corpus
from real_corpus import DEFAULT_MANIFEST, materialise

from torchls.analysis import analyze
from torchls.checker import CheckOptions, ConfigResolver, check_paths

VENV_BIN = Path(sys.executable).parent


def compile_installed() -> None:
    """Write the bytecode of torchls as `pip install` does for a user's copy. An editable
    checkout under PYTHONDONTWRITEBYTECODE (this machine's default) has none for files
    changed since it was last written, and every CLI process would compile them again:
    tens of milliseconds each, a cost no installed torchls (or TorchFix) pays."""
    import torchls

    compileall.compile_dir(Path(torchls.__file__).parent, quiet=1)


def median_seconds(action, repeat: int) -> float:
    """Median wall time of `action`, each run charged with freeing what it left behind: the
    collector runs before the clock starts (earlier garbage is not this run's) and inside the
    timing after the action (garbage in reference cycles is part of what an analysis costs;
    left uncounted it would be paid later, by whatever runs next)."""
    timings = []
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        action()
        gc.collect()
        timings.append(time.perf_counter() - start)
    return statistics.median(timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--real-repeat", type=int, default=1, help="runs per real-corpus figure")
    parser.add_argument("--no-real", action="store_true", help="skip the real corpus")
    parser.add_argument(
        "--whole",
        type=int,
        default=0,
        metavar="N",
        help="also check whole repositories of at most N Python files (e.g. 60)",
    )
    parser.add_argument("--only-whole", action="store_true", help="only the --whole section")
    parser.add_argument("--no-torchfix", action="store_true", help="do not time TorchFix")
    options = parser.parse_args()
    compile_installed()
    if options.only_whole:
        whole_corpus(options.real_repeat, options.whole or 60, not options.no_torchfix)
        return
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
    if not options.no_real:
        real_corpus(options.real_repeat)
    if options.whole:
        whole_corpus(options.real_repeat, options.whole, not options.no_torchfix)


# --- the real corpus ---------------------------------------------------------------------------


def real_projects() -> list[tuple[Path, list[Path]]]:
    """(repository root, its clean corpus files) for every snapshot present here."""
    if not DEFAULT_MANIFEST.is_file():
        return []
    manifest = json.loads(DEFAULT_MANIFEST.read_text(encoding="utf-8"))
    entries = manifest["entries"] if isinstance(manifest, dict) else manifest
    groups: dict[tuple[str, str], list[str]] = {}
    for entry in entries:
        if entry["kind"] == "clean":
            groups.setdefault((entry["repo"], entry["commit"]), []).append(entry["path"])
    projects = []
    for (repo, commit), paths in sorted(groups.items()):
        root = materialise(repo, commit)
        if root is not None:
            files = [root / path for path in paths if (root / path).is_file()]
            if files:
                projects.append((root, files))
    return projects


def floor(paths: list[Path]) -> int:
    """Read, parse and walk each file (what any analysis must at least do); syntax errors."""
    broken = 0
    for path in paths:
        data = path.read_bytes()
        try:
            for _node in ast.walk(ast.parse(data)):
                pass
        except (SyntaxError, ValueError):
            broken += 1
    return broken


def check_in_process(
    projects: list[tuple[Path, list[Path]]], jobs: int, cache: Path | None
) -> list[tuple[str, str, int]]:
    found = []
    for root, files in projects:
        options = CheckOptions(
            root=root,
            jobs=jobs,
            cache=cache is not None,
            cache_dir=cache / root.parent.name / root.name if cache is not None else None,
            config=root / "pyproject.toml",
        )
        for report in check_paths(files, ConfigResolver(root / "pyproject.toml"), options):
            found.extend((report.filename, f.code, f.span.start.row) for f in report.findings)
    return found


def analyse_each(sources: list[tuple[Path, bytes]]) -> int:
    """In-file analysis of each file, keeping only the number of findings: holding thousands
    of results (trees and all) would make every collection scan them, a cost of the bench,
    not of the analysis (the checker keeps only findings too)."""
    return sum(len(analyze(data, str(path)).findings) for path, data in sources)


class Figures(dict):
    """Median seconds by name, each taken over `repeat` runs of an action, and printed as
    rows with their ratio to the floor."""

    def __init__(self, repeat: int) -> None:
        super().__init__()
        self.repeat = repeat

    def measure(self, name: str, action, runs: int | None = None) -> object:
        times, value = [], None
        for _ in range(max(1, self.repeat if runs is None else runs)):
            seconds, value = timed(action)
            times.append(seconds)
        self[name] = statistics.median(times)
        return value

    def row(self, name: str, label: str) -> None:
        seconds = self[name]
        print(f"  {label:58} {seconds * 1000:9.0f} ms  {seconds / self['floor']:6.2f}x floor")


def run_per_project(projects: list[tuple[Path, list[Path]]], command: list[str]) -> int:
    """Run `command + files` in each repository; the number of output lines in all."""
    lines = 0
    for root, files in projects:
        done = subprocess.run(
            [*command, *(str(f.relative_to(root)) for f in files)],
            cwd=root,
            capture_output=True,
            text=True,
            check=False,
        )
        lines += len(done.stdout.splitlines())
    return lines


def timed(action) -> tuple[float, object]:
    """Wall time of one `action` (with its garbage collected, as in `median_seconds`)."""
    gc.collect()
    start = time.perf_counter()
    value = action()
    gc.collect()
    return time.perf_counter() - start, value


def real_corpus(repeat: int) -> None:
    projects = real_projects()
    if not projects:
        print("\nreal corpus: not present on this machine (see bench/real_corpus.py); skipped")
        return
    paths = [path for _, files in projects for path in files]
    lines = sum(path.read_bytes().count(b"\n") for path in paths)
    cores = os.cpu_count() or 1
    print(
        f"\nreal corpus: {len(paths)} files from {len(projects)} repositories, {lines} lines; "
        f"{cores} cores; medians of {repeat} run(s) unless said"
    )
    figures = Figures(repeat)
    measure = figures.measure

    broken = measure("floor", lambda: floor(paths), max(3, repeat))
    sources = [(path, path.read_bytes()) for path in paths]
    measure("in-file", lambda: analyse_each(sources))
    reference = measure("serial", lambda: check_in_process(projects, 1, None))
    parallel = measure("parallel", lambda: check_in_process(projects, cores, None))
    scratch = Path(tempfile.mkdtemp(prefix="torchls-bench-cache-"))
    try:
        cold_times, warm_times = [], []
        for attempt in range(max(1, repeat)):
            folder = scratch / f"in-process-{attempt}"
            seconds, cold = timed(lambda folder=folder: check_in_process(projects, 1, folder))
            cold_times.append(seconds)
            seconds, warm = timed(lambda folder=folder: check_in_process(projects, 1, folder))
            warm_times.append(seconds)
        figures["cold"] = statistics.median(cold_times)
        figures["warm"] = statistics.median(warm_times)
        same = reference == parallel == cold == warm
        torchls = [str(VENV_BIN / "torchls"), "check", "--exit-zero", "--output-format", "json"]
        start = [sys.executable, "-c", "import torchls.cli"]
        measure("process start", lambda: run_per_project(projects, start))
        for jobs in (1, cores):
            folder = scratch / f"cli-{jobs}"
            flags = ["--jobs", str(jobs), "--cache-dir", str(folder)]
            measure(
                f"cli cold -j{jobs}",
                lambda flags=flags, folder=folder: _cold(projects, torchls + flags, folder),
            )
            measure(
                f"cli warm -j{jobs}", lambda flags=flags: run_per_project(projects, torchls + flags)
            )
        torchfix = VENV_BIN / "torchfix"
        if torchfix.is_file():
            measure("torchfix", lambda: run_per_project(projects, [str(torchfix)]), 1)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    row = figures.row

    print(f"  (files with a syntax error the floor skips: {broken})")
    row("floor", "floor: read + ast.parse + ast.walk")
    row("in-file", "analyze(), in-file only (no project), in-process")
    row("serial", "check, cross-file, no cache, serial, in-process")
    row("parallel", f"check, cross-file, no cache, {cores} workers, in-process")
    row("cold", "check, cross-file, cold cache, serial, in-process")
    row("warm", "check, cross-file, warm cache, serial, in-process")
    row("process start", f"interpreter start + import, x{len(projects)} processes")
    for jobs in (1, cores):
        row(f"cli cold -j{jobs}", f"torchls check CLI, cold cache, --jobs {jobs}")
        row(f"cli warm -j{jobs}", f"torchls check CLI, warm cache, --jobs {jobs}")
    print(f"  findings identical serial/parallel/cold/warm: {same}")
    if "torchfix" in figures:
        row("torchfix", "TorchFix, same files, one process per repository")
        fastest_cold = min(figures[f"cli cold -j{jobs}"] for jobs in (1, cores))
        print(
            f"  TorchFix / torchls CLI cold: {figures['torchfix'] / fastest_cold:.1f}x; "
            f"TorchFix / torchls CLI warm: "
            f"{figures['torchfix'] / min(figures[f'cli warm -j{j}'] for j in (1, cores)):.1f}x"
        )
    else:
        print("  TorchFix: not installed in this environment (pip install torchfix); skipped")


def whole_repositories(limit: int) -> list[tuple[Path, list[Path]]]:
    """(root, every Python file `torchls check .` finds there) for each snapshot with at most
    `limit` such files: what a user checks, the modules the scripts import included."""
    from torchls.checker import discover

    found = []
    for root, _ in real_projects():
        files = discover([str(root)], ConfigResolver(root / "pyproject.toml")).files
        if 0 < len(files) <= limit:
            found.append((root, files))
    return found


def whole_corpus(repeat: int, limit: int, with_torchfix: bool = True) -> None:
    """`torchls check .` in each whole repository against the floor of the same files."""
    projects = whole_repositories(limit)
    if not projects:
        print("\nwhole repositories: no snapshots on this machine; skipped")
        return
    paths = [path for _, files in projects for path in files]
    lines = sum(path.read_bytes().count(b"\n") for path in paths)
    rounds = max(1, repeat)
    print(
        f"\nwhole repositories (at most {limit} Python files each): {len(projects)} "
        f"repositories, {len(paths)} files, {lines} lines; medians of {rounds} interleaved "
        "round(s) (each round times every figure once, so a slow spell of a shared machine "
        "weighs on all of them alike); TorchFix once"
    )
    figures = Figures(repeat)

    def in_repository(command: list[str]) -> int:
        lines = 0
        for root, _ in projects:
            done = subprocess.run(command, cwd=root, capture_output=True, text=True, check=False)
            lines += len(done.stdout.splitlines())
        return lines

    torchls = [str(VENV_BIN / "torchls"), "check", "--exit-zero", "--no-cache", "."]
    actions = {
        "floor": lambda: floor(paths),
        "in-file": lambda: analyse_each([(path, path.read_bytes()) for path in paths]),
        "serial": lambda: check_in_process(projects, 1, None),
        "bare start": lambda: in_repository([sys.executable, "-c", "pass"]),
        "process start": lambda: in_repository([sys.executable, "-c", "import torchls.cli"]),
        "cli -j1": lambda: in_repository([*torchls[:-1], "--jobs", "1", "."]),
        "cli": lambda: in_repository(torchls),
    }
    floor(paths)  # the files into the page cache first: the floor is not a disk benchmark
    times: dict[str, list[float]] = {name: [] for name in actions}
    torchfix = VENV_BIN / "torchfix"
    for round_ in range(rounds):
        for name, action in actions.items():
            times[name].append(timed(action)[0])
        if round_ == 0 and torchfix.is_file() and with_torchfix:
            figures["torchfix"] = timed(lambda: in_repository([str(torchfix), "."]))[0]
    for name, taken in times.items():
        figures[name] = statistics.median(taken)
    if rounds > 1:
        ratios = [c / f for c, f in zip(times["serial"], times["floor"], strict=True)]
        print(
            "  check cross-file serial / floor, round by round: "
            + ", ".join(f"{ratio:.2f}x" for ratio in ratios)
        )
    labels = {
        "floor": "floor: read + ast.parse + ast.walk",
        "in-file": "analyze(), in-file only (no project), in-process",
        "serial": "check, cross-file, no cache, serial, in-process",
        "bare start": f"interpreter start alone (python -c pass), x{len(projects)} processes",
        "process start": f"interpreter start + import, x{len(projects)} processes",
        "cli -j1": "torchls check . CLI, no cache, --jobs 1",
        "cli": "torchls check . CLI, no cache, default jobs",
        "torchfix": "TorchFix ., one process per repository",
    }
    for name, label in labels.items():
        if name in figures:
            figures.row(name, label)
    if "torchfix" in figures:
        print(
            f"  TorchFix / torchls CLI: {figures['torchfix'] / figures['cli']:.1f}x "
            f"(default jobs), {figures['torchfix'] / figures['cli -j1']:.1f}x (--jobs 1)"
        )


def _cold(projects: list[tuple[Path, list[Path]]], command: list[str], folder: Path) -> int:
    shutil.rmtree(folder, ignore_errors=True)  # each repetition starts from an empty cache
    return run_per_project(projects, command)


if __name__ == "__main__":
    main()
