"""Findings and check time of torchls on real public Jupyter notebooks (issue #32).

The notebooks themselves are never committed: `bench/corpus/notebooks.json` names each one by
repository, commit and path, with its number of code cells and a verdict for every finding we
read (true / defensible / false, one-line reason). This script takes each notebook out of its
repository snapshot when one is present (bare git folders under `$TORCHLS_MIRROR`, default
`/work/.mirror`, one per `owner+name`) into `$TORCHLS_CORPUS_CACHE/notebooks` (default
`~/.cache/torchls-corpus/notebooks`), runs `torchls check --output-format json --no-cache`
on it, matches the findings to the verdicts by (code, cell, line) and prints:

* per rule: findings, true, defensible, false, unjudged and precision ((true + defensible) /
  judged), with the verdicts listed for a finding no longer reported (stale);
* per notebook: code cells and findings;
* timing: for each notebook the median wall time of `torchls check` on the .ipynb and on a .py
  holding the same code-cell sources joined by blank lines, IPython lines commented out
  (written here, not by torchls's notebook reader, so the ratio includes reading the
  notebook JSON and mapping rows back to cells), over `--repeat` alternated runs, and the
  ratio nb/py; then the median of the ratios. Each run is one process (`--jobs 1`), so
  interpreter start-up is in both figures; the summary also gives the median difference.

A row whose snapshot (or commit, or path) is missing is reported and skipped, never an error.
Usage: python bench/notebooks.py [--manifest PATH] [--repeat N] [--no-timing] [--json]
No thresholds: it prints figures for people to read.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_corpus import CACHE, default_torchls, git, git_dir, has_commit

HERE = Path(__file__).resolve().parent
DEFAULT_MANIFEST = HERE / "corpus" / "notebooks.json"
NB_CACHE = Path(os.environ.get("TORCHLS_CORPUS_CACHE", CACHE)) / "notebooks"


def extract(row: dict) -> Path | None:
    """The notebook of `row` in the cache (written on first use); None when the snapshot, the
    commit or the path is absent."""
    gdir = git_dir(row["repo"])
    if gdir is None or not has_commit(gdir, row["commit"]):
        return None
    dest = NB_CACHE / row["repo"].replace("/", "+") / row["commit"] / row["path"]
    if dest.is_file():
        return dest
    try:
        data = git(gdir, "cat-file", "blob", f"{row['commit']}:{row['path']}")
    except RuntimeError:
        return None
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(data)
    return dest


# Cell magics whose body is Python (as IPython runs it); any other cell magic's body is not.
PYTHON_CELL_MAGICS = ("%%time", "%%timeit", "%%capture", "%%prun", "%%debug", "%%memit")


def _as_python(source: str) -> str:
    """A cell's source as a plain .py would hold it: IPython lines (`%magic`, `!shell`, a
    non-Python cell magic's body) turned into comments of the same length, so both files have
    the same lines and nearly the same bytes. A line is IPython only outside brackets: a
    continuation such as `   %(epoch, loss))` is Python."""
    lines = source.split("\n")
    if lines and lines[0].lstrip().startswith("%%"):
        if not lines[0].lstrip().startswith(PYTHON_CELL_MAGICS):
            return "\n".join("#" + line for line in lines)
        lines[0] = "#" + lines[0]
    depth = 0
    for at, line in enumerate(lines):
        if depth == 0 and line.lstrip().startswith(("%", "!")):
            lines[at] = "#" + line
            continue
        # Bracket depth by counting: strings holding brackets are rare enough in notebook code
        # for a timing input.
        depth = max(
            depth + sum(line.count(c) for c in "([{") - sum(line.count(c) for c in ")]}"), 0
        )
    return "\n".join(lines)


def code_cells_text(notebook: Path) -> tuple[int, str]:
    """(number of code cells, their sources as Python joined by a blank line)."""
    document = json.loads(notebook.read_bytes())
    sources = []
    for cell in document.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        text = "".join(source) if isinstance(source, list) else str(source)
        sources.append(_as_python(text.rstrip("\n")))
    return len(sources), "\n\n".join(sources) + "\n"


def check(torchls: list[str], path: Path) -> tuple[list[dict], float]:
    """The JSON findings of one `torchls check --no-cache` on `path` and its wall time (s)."""
    command = [*torchls, "check", str(path), "--output-format", "json", "--no-cache"]
    command += ["--exit-zero", "--jobs", "1"]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=path.parent)
    elapsed = time.perf_counter() - start
    if done.returncode not in (0, 1):
        sys.stderr.write(f"torchls failed on {path}: {done.stderr.strip()[:300]}\n")
    try:
        return json.loads(done.stdout or "[]"), elapsed
    except json.JSONDecodeError:
        sys.stderr.write(f"torchls printed no JSON on {path}\n")
        return [], elapsed


# One in-process `check_paths` on argv[1] after a warm-up on a tiny unrelated file (imports and
# first-call set-up paid there), in a fresh interpreter so nothing of the file is kept from an
# earlier run (a process parses each file version once). Prints seconds and findings.
IN_PROCESS = """
import sys, tempfile, time
from pathlib import Path
from torchls.checker import CheckOptions, ConfigResolver, check_paths
options = CheckOptions(cache=False, jobs=1)
with tempfile.TemporaryDirectory() as tmp:
    warm = Path(tmp) / "warm.py"
    warm.write_text("import torch\\nmodel = torch.nn.Linear(2, 2)\\nmodel(torch.ones(2))\\n")
    check_paths([warm], ConfigResolver(), options)
path = Path(sys.argv[1])
start = time.perf_counter()
reports = check_paths([path], ConfigResolver(), options)
print(time.perf_counter() - start, sum(len(r.findings) for r in reports))
"""


def check_in_process(python: str, path: Path) -> float:
    """Seconds of the analysis of `path` alone (no interpreter start-up, no imports)."""
    done = subprocess.run(
        [python, "-c", IN_PROCESS, str(path)], capture_output=True, text=True, check=False
    )
    try:
        return float(done.stdout.split()[0])
    except (IndexError, ValueError):
        sys.stderr.write(f"in-process check failed on {path}: {done.stderr.strip()[-300:]}\n")
        return float("nan")


def key(code: str, cell: int | None, line: int) -> tuple[str, int | None, int]:
    return (code, cell, line)


def score(rows: list[dict], torchls: list[str], python: str, repeat: int, timing: bool) -> dict:
    """Findings matched to verdicts, per rule and per notebook, and the timings."""
    rules: dict[str, dict] = defaultdict(lambda: defaultdict(int))
    notebooks: list[dict] = []
    skipped: list[str] = []
    unjudged: list[dict] = []
    stale: list[dict] = []
    times: list[dict] = []
    for row in rows:
        name = f"{row['repo']}:{row['path']}"
        notebook = extract(row)
        if notebook is None:
            skipped.append(name)
            continue
        findings, _ = check(torchls, notebook)
        verdicts = {key(v["code"], v.get("cell"), v["line"]): v for v in row.get("findings", [])}
        seen = set()
        for finding in findings:
            k = key(finding["code"], finding.get("cell"), finding["location"]["row"])
            counts = rules[finding["code"]]
            counts["severity"] = finding["severity"]
            counts["findings"] += 1
            verdict = verdicts.get(k)
            if verdict is None:
                counts["unjudged"] += 1
                unjudged.append({"notebook": name, "code": k[0], "cell": k[1], "line": k[2]})
            else:
                counts[verdict["verdict"]] += 1
                seen.add(k)
        stale += [
            {"notebook": name, **{f: v.get(f) for f in ("code", "cell", "line")}}
            for k, v in verdicts.items()
            if k not in seen
        ]
        cells, text = code_cells_text(notebook)
        notebooks.append({"notebook": name, "cells": cells, "findings": len(findings)})
        if timing:
            times.append(time_pair(torchls, python, notebook, text, repeat, name))
    return {
        "rules": {code: dict(counts) for code, counts in sorted(rules.items())},
        "notebooks": notebooks,
        "skipped": skipped,
        "unjudged": unjudged,
        "stale": stale,
        "timing": times,
    }


def time_pair(
    torchls: list[str], python: str, notebook: Path, text: str, repeat: int, name: str
) -> dict:
    """Median wall time of checking the notebook and a .py with the same code, alternated so
    that a passing load on the machine falls on both."""
    with tempfile.TemporaryDirectory(prefix="torchls-nb-") as tmp:
        script = Path(tmp) / (notebook.stem.replace(" ", "_") + ".py")
        script.write_text(text, encoding="utf-8")
        nb_times, py_times, nb_inner, py_inner = [], [], [], []
        for _ in range(repeat):
            nb_findings, elapsed = check(torchls, notebook)
            nb_times.append(elapsed)
            py_findings, elapsed = check(torchls, script)
            py_times.append(elapsed)
            nb_inner.append(check_in_process(python, notebook))
            py_inner.append(check_in_process(python, script))
    nb_ms, py_ms = statistics.median(nb_times) * 1000, statistics.median(py_times) * 1000
    nb_in, py_in = statistics.median(nb_inner) * 1000, statistics.median(py_inner) * 1000
    return {
        "notebook": name,
        "lines": text.count("\n"),
        "nb_ms": nb_ms,
        "py_ms": py_ms,
        "ratio": nb_ms / py_ms if py_ms else None,
        "nb_in_ms": nb_in,
        "py_in_ms": py_in,
        "in_ratio": nb_in / py_in if py_in else None,
        # The same code should give the same findings; a difference points at the reader.
        "nb_findings": len(nb_findings),
        "py_findings": len(py_findings),
    }


def _precision(counts: dict) -> str:
    judged = counts.get("true", 0) + counts.get("defensible", 0) + counts.get("false", 0)
    if not judged:
        return "-"
    return f"{(counts.get('true', 0) + counts.get('defensible', 0)) / judged:.2f}"


def print_report(report: dict, out=sys.stdout) -> None:
    w = out.write
    w(f"{len(report['notebooks'])} notebooks checked, {len(report['skipped'])} skipped\n")
    for name in report["skipped"]:
        w(f"  skipped (snapshot, commit or path missing): {name}\n")
    w("\nrule   sev          findings  true  def  false  unjudged  precision\n")
    for code, c in report["rules"].items():
        w(
            f"{code:<6} {c.get('severity', ''):<12} {c.get('findings', 0):>8} "
            f"{c.get('true', 0):>5} {c.get('defensible', 0):>4} {c.get('false', 0):>6} "
            f"{c.get('unjudged', 0):>9}  {_precision(c):>9}\n"
        )
    total = defaultdict(int)
    for c in report["rules"].values():
        for field in ("findings", "true", "defensible", "false", "unjudged"):
            total[field] += c.get(field, 0)
    w(
        f"{'all':<6} {'':<12} {total['findings']:>8} {total['true']:>5} "
        f"{total['defensible']:>4} {total['false']:>6} {total['unjudged']:>9}  "
        f"{_precision(total):>9}\n"
    )
    w("\nnotebook                                                          cells  findings\n")
    for row in report["notebooks"]:
        w(f"{row['notebook'][-64:]:<65} {row['cells']:>5} {row['findings']:>9}\n")
    for label, items in (("unjudged", report["unjudged"]), ("stale verdict", report["stale"])):
        for item in items:
            where = f"{item['code']} cell {item['cell']} line {item['line']}"
            w(f"{label}: {item['notebook']} {where}\n")
    if report["timing"]:
        w(
            "\ntiming, median ms: CLI = wall time of `torchls check --no-cache --jobs 1` (one"
            " process, start-up included);\nin-proc = one check_paths call in a warmed fresh"
            " interpreter (the analysis alone)\n"
        )
        w(
            "notebook                                     lines  CLI nb  CLI py  ratio"
            "  in nb  in py  ratio  findings nb/py\n"
        )
        for t in report["timing"]:
            w(
                f"{t['notebook'][-44:]:<44} {t['lines']:>5} {t['nb_ms']:>7.0f} "
                f"{t['py_ms']:>7.0f} {_ratio(t['ratio']):>6} {t['nb_in_ms']:>6.1f} "
                f"{t['py_in_ms']:>6.1f} {_ratio(t['in_ratio']):>6}  "
                f"{t['nb_findings']:>5}/{t['py_findings']}\n"
            )
        for label, field, nb, py in (
            ("CLI", "ratio", "nb_ms", "py_ms"),
            ("in-process", "in_ratio", "nb_in_ms", "py_in_ms"),
        ):
            ratios = [t[field] for t in report["timing"] if t[field]]
            if not ratios:
                continue
            extra = statistics.median(t[nb] - t[py] for t in report["timing"])
            w(
                f"{label}: median nb/py {statistics.median(ratios):.3f} (min {min(ratios):.3f},"
                f" max {max(ratios):.3f}, {len(ratios)} notebooks); median nb - py"
                f" {extra:+.1f} ms\n"
            )


def _ratio(value: float | None) -> str:
    return f"{value:.2f}" if value else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", type=Path, default=DEFAULT_MANIFEST)
    parser.add_argument("--torchls", help="the torchls executable (default: .venv's)")
    parser.add_argument(
        "--python", help="interpreter with torchls for the in-process timing (default: this one)"
    )
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per file (median)")
    parser.add_argument("--no-timing", action="store_true", help="findings only")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    rows = json.loads(args.manifest.read_text())
    if isinstance(rows, dict):
        rows = rows.get("entries", [])
    torchls = [args.torchls] if args.torchls else default_torchls()
    python = args.python or sys.executable
    report = score(rows, torchls, python, max(args.repeat, 1), not args.no_timing)
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print_report(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
