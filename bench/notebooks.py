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
  holding the same code-cell sources joined by blank lines (written here, not by torchls, so
  the comparison includes reading the notebook), over `--repeat` runs, and the ratio nb/py;
  then the median of the ratios.

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


def code_cells_text(notebook: Path) -> tuple[int, str]:
    """(number of code cells, their sources joined by a blank line) as a plain .py would hold
    them. IPython lines are kept as written: the .py may then hold a syntax error the
    notebook reader blanks, which torchls skips like any other broken line."""
    document = json.loads(notebook.read_bytes())
    sources = []
    for cell in document.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        sources.append("".join(source) if isinstance(source, list) else str(source))
    return len(sources), "\n\n".join(s.rstrip("\n") for s in sources) + "\n"


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


def key(code: str, cell: int | None, line: int) -> tuple[str, int | None, int]:
    return (code, cell, line)


def score(rows: list[dict], torchls: list[str], repeat: int, timing: bool) -> dict:
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
            times.append(time_pair(torchls, notebook, text, repeat, name))
    return {
        "rules": {code: dict(counts) for code, counts in sorted(rules.items())},
        "notebooks": notebooks,
        "skipped": skipped,
        "unjudged": unjudged,
        "stale": stale,
        "timing": times,
    }


def time_pair(torchls: list[str], notebook: Path, text: str, repeat: int, name: str) -> dict:
    """Median wall time of checking the notebook and a .py with the same code, alternated so
    that a passing load on the machine falls on both."""
    with tempfile.TemporaryDirectory(prefix="torchls-nb-") as tmp:
        script = Path(tmp) / (notebook.stem.replace(" ", "_") + ".py")
        script.write_text(text, encoding="utf-8")
        nb_times, py_times = [], []
        for _ in range(repeat):
            nb_times.append(check(torchls, notebook)[1])
            py_times.append(check(torchls, script)[1])
    nb_ms, py_ms = statistics.median(nb_times) * 1000, statistics.median(py_times) * 1000
    return {
        "notebook": name,
        "lines": text.count("\n"),
        "nb_ms": nb_ms,
        "py_ms": py_ms,
        "ratio": nb_ms / py_ms if py_ms else None,
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
        w("\ntiming (median wall ms of `torchls check --no-cache --jobs 1`, one process each)\n")
        w("notebook                                            lines    nb ms    py ms  nb/py\n")
        for t in report["timing"]:
            ratio = f"{t['ratio']:.2f}" if t["ratio"] else "-"
            w(
                f"{t['notebook'][-50:]:<51} {t['lines']:>5} {t['nb_ms']:>8.0f} "
                f"{t['py_ms']:>8.0f} {ratio:>6}\n"
            )
        ratios = [t["ratio"] for t in report["timing"] if t["ratio"]]
        if ratios:
            w(
                f"median nb/py ratio {statistics.median(ratios):.3f} "
                f"(min {min(ratios):.3f}, max {max(ratios):.3f}, {len(ratios)} notebooks)\n"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", type=Path, default=DEFAULT_MANIFEST)
    parser.add_argument("--torchls", help="the torchls executable (default: .venv's)")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per file (median)")
    parser.add_argument("--no-timing", action="store_true", help="findings only")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    rows = json.loads(args.manifest.read_text())
    if isinstance(rows, dict):
        rows = rows.get("entries", [])
    torchls = [args.torchls] if args.torchls else default_torchls()
    report = score(rows, torchls, max(args.repeat, 1), not args.no_timing)
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print_report(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
