"""Precision and recall of the rules on real, fetched training code (issue #12).

The corpus itself is never committed: `bench/corpus/manifest.json` names each file by
repository, commit and path, and carries a verdict for every finding we have read
(true / defensible / false, with a one-line reason). This script rebuilds the corpus from
repository snapshots when they are present on this machine (bare git folders under
`$TORCHLS_MIRROR`, default `/work/.mirror`, one per `owner+name`), runs `torchls check`
with the repository as the project root (so cross-file resolution works), matches the
findings to the verdicts by (code, line) and prints, per rule:

* on the clean rows: findings, true, defensible, false, unjudged and precision
  ((true + defensible) / judged), for every severity (precision matters for W and E);
* on the bug rows (the parent of an upstream fix commit): how many were caught, i.e. one of
  the row's expected codes was reported on that file, and how many of those codes are still
  reported on the fixed version (a catch that survives the fix may be a coincidence);
* the bug rows' recall split by where the bug lives: `span` "one-function" (the value is made
  and misused in one function body) or "spanning" (it travels through an attribute, a base
  class, a returned tuple, a container, another method or another file; `construct` numbers
  the way, 1..8, as in issue #30), and held-out rows (`heldout`: gathered after the object-model
  work started, never tuned on) against the rest, per code. A spanning row lists every file
  it spans in `paths`; an expected code reported on one of those other files is counted
  apart ("elsewhere"), not as a catch, since the row's `path` is where the finding belongs.

A row whose snapshot is missing is reported and skipped, never an error. Source trees are
materialised once per (repository, commit) with `git ls-tree` / `git cat-file` into
`$TORCHLS_CORPUS_CACHE` (default `~/.cache/torchls-corpus`); only Python sources and project
config files are written, and blobs missing from a snapshot are skipped.

Usage: python bench/real_corpus.py [--manifest PATH ...] [--only-clean | --only-bugs] [--json]
                                   [--torchls PATH] [--no-fixed]
`--manifest` may be given several times (e.g. manifest.json and spanning.json); the rows of all
of them are scored together.
No timings, no thresholds: it prints figures for people to read.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_MANIFEST = HERE / "corpus" / "manifest.json"
MIRROR = Path(os.environ.get("TORCHLS_MIRROR", "/work/.mirror"))
CACHE = Path(os.environ.get("TORCHLS_CORPUS_CACHE", Path.home() / ".cache" / "torchls-corpus"))
KEEP_SUFFIXES = (".py", ".pyi")
KEEP_NAMES = ("pyproject.toml", "setup.cfg")
SEVERITY_ORDER = {"error": 0, "warning": 1, "information": 2, "hint": 3}


@dataclass
class RuleCounts:
    severity: str = ""
    findings: int = 0
    true: int = 0
    defensible: int = 0
    false: int = 0
    unjudged: int = 0
    bug_rows: int = 0
    caught: int = 0
    still_after_fix: int = 0

    def precision(self) -> float | None:
        judged = self.true + self.defensible + self.false
        return (self.true + self.defensible) / judged if judged else None


@dataclass
class Report:
    rules: dict[str, RuleCounts] = field(default_factory=lambda: defaultdict(RuleCounts))
    skipped: list[str] = field(default_factory=list)
    unjudged: list[dict] = field(default_factory=list)
    stale: list[dict] = field(default_factory=list)
    missed: list[dict] = field(default_factory=list)
    clean_files: int = 0
    clean_repos: set[str] = field(default_factory=set)
    bug_rows: int = 0
    caught: int = 0
    groups: dict[str, GroupCounts] = field(default_factory=dict)
    bug_results: list[dict] = field(default_factory=list)


@dataclass
class GroupCounts:
    """Recall of one slice of the bug rows (one-function, spanning, held-out, ...)."""

    rows: int = 0
    caught: int = 0
    elsewhere: int = 0
    kept: int = 0
    per_code: dict[str, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))

    def add(self, expect: list[str], codes: set[str], hit: bool, other: bool, kept: bool) -> None:
        self.rows += 1
        self.caught += hit
        self.elsewhere += other and not hit
        self.kept += kept
        for code in expect:
            self.per_code[code][0] += 1
            self.per_code[code][1] += code in codes


def bug_groups(entry: dict) -> list[str]:
    """The slices a bug row counts in: its span (or "unlabelled") and held-out or not."""
    span = entry.get("span") or "unlabelled"
    names = [f"span: {span}"]
    if span == "spanning" and entry.get("construct"):
        names.append(f"construct {entry['construct']}")
    names.append("held-out" if entry.get("heldout") else "not held-out")
    return names


# --- snapshots -------------------------------------------------------------------------------


def git_dir(repo: str) -> Path | None:
    """The bare git folder of `owner/name` under the mirror, or None when it is absent."""
    base = MIRROR / repo.replace("/", "+")
    for candidate in (base / "repo" / ".git", base / "repo", base / ".git", base):
        if (candidate / "HEAD").is_file() and (candidate / "objects").is_dir():
            return candidate
    return None


def git(gdir: Path, *args: str, data: bytes | None = None) -> bytes:
    done = subprocess.run(
        ["git", f"--git-dir={gdir}", *args], input=data, capture_output=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr.decode("utf-8", "replace").strip())
    return done.stdout


def has_commit(gdir: Path, commit: str) -> bool:
    done = subprocess.run(
        ["git", f"--git-dir={gdir}", "cat-file", "-e", f"{commit}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


def materialise(repo: str, commit: str) -> Path | None:
    """The repository's source tree at `commit` in the cache (built on first use)."""
    gdir = git_dir(repo)
    if gdir is None or not has_commit(gdir, commit):
        return None
    dest = CACHE / repo.replace("/", "+") / commit
    if (dest / ".complete").is_file():
        return dest
    if dest.exists():
        shutil.rmtree(dest)
    listing = git(gdir, "ls-tree", "-r", "-z", commit).split(b"\0")
    wanted: list[tuple[str, str]] = []
    for line in listing:
        if not line:
            continue
        meta, _, name = line.partition(b"\t")
        mode, kind, sha = meta.decode().split()
        path = name.decode("utf-8", "surrogateescape")
        if kind != "blob" or mode == "120000":
            continue
        if path.endswith(KEEP_SUFFIXES) or Path(path).name in KEEP_NAMES:
            wanted.append((sha, path))
    blobs = git(gdir, "cat-file", "--batch", data="".join(f"{s}\n" for s, _ in wanted).encode())
    offset = 0
    for _sha, path in wanted:
        end = blobs.index(b"\n", offset)
        header = blobs[offset:end].split()
        offset = end + 1
        if len(header) < 3 or header[1] != b"blob":  # "<sha> missing": absent from the snapshot
            continue
        size = int(header[2])
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(blobs[offset : offset + size])
        offset += size + 1
    dest.mkdir(parents=True, exist_ok=True)
    if not (dest / "pyproject.toml").exists():
        # Makes the repository root the project root for cross-file resolution.
        (dest / "pyproject.toml").write_text("")
    (dest / ".complete").write_text(commit + "\n")
    return dest


def add_named_files(root: Path, repo: str, commit: str, paths: list[str]) -> None:
    """Files a row names that the source-only tree left out (a notebook): read from the
    snapshot into the tree, so the row is checked instead of skipped as missing."""
    gdir = git_dir(repo)
    for path in paths:
        target = root / path
        if target.exists() or gdir is None:
            continue
        done = subprocess.run(
            ["git", f"--git-dir={gdir}", "show", f"{commit}:{path}"],
            capture_output=True,
            check=False,
        )
        if done.returncode == 0:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(done.stdout)


def parent_of(repo: str, commit: str) -> str | None:
    gdir = git_dir(repo)
    if gdir is None or not has_commit(gdir, commit):
        return None
    return git(gdir, "rev-parse", f"{commit}^").decode().strip()


# --- running the checker ---------------------------------------------------------------------


def run_torchls(torchls: list[str], root: Path, paths: list[str]) -> dict[str, list[dict]]:
    """Findings per repo-relative path, from one `torchls check` run over `paths` in `root`."""
    present = [p for p in paths if (root / p).is_file()]
    result: dict[str, list[dict]] = {p: [] for p in present}
    if not present:
        return result
    command = [
        *torchls,
        "check",
        *present,
        "--output-format",
        "json",
        "--exit-zero",
        "--config",
        str(root / "pyproject.toml"),
    ]
    done = subprocess.run(command, cwd=root, capture_output=True, text=True, check=False)
    if done.returncode not in (0, 1):
        sys.stderr.write(f"torchls failed in {root}: {done.stderr.strip()[:500]}\n")
    try:
        findings = json.loads(done.stdout or "[]")
    except json.JSONDecodeError:
        sys.stderr.write(f"torchls printed no JSON in {root}\n")
        return result
    for finding in findings:
        name = Path(finding["filename"]).resolve()
        try:
            relative = name.relative_to(root.resolve()).as_posix()
        except ValueError:
            relative = finding["filename"]
        result.setdefault(relative, []).append(finding)
    return result


def default_torchls() -> list[str]:
    venv = HERE.parent / ".venv" / "bin" / "torchls"
    if venv.is_file():
        return [str(venv)]
    found = shutil.which("torchls")
    return [found] if found else [sys.executable, "-m", "torchls"]


# --- scoring ---------------------------------------------------------------------------------


def score(entries: list[dict], torchls: list[str], check_fixed: bool) -> Report:
    report = Report()
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for entry in entries:
        groups[(entry["repo"], entry["commit"])].append(entry)
    fixed_groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    outputs: dict[int, list[dict]] = {}
    others: dict[int, list[dict]] = {}  # findings on the row's other files (spanning rows)
    for (repo, commit), rows in sorted(groups.items()):
        root = materialise(repo, commit)
        if root is None:
            for row in rows:
                report.skipped.append(f"{repo}@{commit[:10]}:{row['path']} (no snapshot)")
            continue
        wanted = list(dict.fromkeys(p for row in rows for p in [row["path"], *row_paths(row)]))
        add_named_files(root, repo, commit, wanted)
        found = run_torchls(torchls, root, wanted)
        for row in rows:
            if row["path"] not in found:
                report.skipped.append(f"{repo}@{commit[:10]}:{row['path']} (file missing)")
                continue
            outputs[id(row)] = found[row["path"]]
            others[id(row)] = [f for p in row_paths(row) for f in found.get(p, [])]
            if row["kind"] == "bug" and check_fixed and row.get("fix_commit"):
                fixed_groups[(repo, row["fix_commit"])].append(row)
    fixed_outputs: dict[int, list[dict]] = {}
    for (repo, commit), rows in sorted(fixed_groups.items()):
        root = materialise(repo, commit)
        if root is None:
            continue
        fixed_paths = [row.get("fixed_path", row["path"]) for row in rows]
        add_named_files(root, repo, commit, fixed_paths)
        found = run_torchls(torchls, root, fixed_paths)
        for row in rows:
            fixed_outputs[id(row)] = found.get(row.get("fixed_path", row["path"]), [])
    for entry in entries:
        if id(entry) not in outputs:
            continue
        findings = outputs[id(entry)]
        verdicts = {(f["code"], int(f["line"])): f for f in entry.get("findings", [])}
        reported = {(f["code"], f["location"]["row"]) for f in findings}
        if entry["kind"] == "clean":
            report.clean_files += 1
            report.clean_repos.add(entry["repo"])
        for finding in findings:
            code, line = finding["code"], finding["location"]["row"]
            counts = report.rules[code]
            counts.severity = finding["severity"]
            if entry["kind"] != "clean":
                continue
            counts.findings += 1
            verdict = verdicts.get((code, line), {}).get("verdict")
            if verdict in ("true", "defensible", "false"):
                setattr(counts, verdict, getattr(counts, verdict) + 1)
            else:
                counts.unjudged += 1
                report.unjudged.append(
                    {
                        "repo": entry["repo"],
                        "path": entry["path"],
                        "code": code,
                        "line": line,
                        "severity": finding["severity"],
                        "message": finding["message"],
                    }
                )
        for code, line in verdicts:
            if (code, line) not in reported:
                report.stale.append(
                    {"repo": entry["repo"], "path": entry["path"], "code": code, "line": line}
                )
        if entry["kind"] == "bug":
            report.bug_rows += 1
            codes = {f["code"] for f in findings}
            expect = entry.get("expect", [])
            hit = bool(codes & set(expect))
            report.caught += hit
            after = {f["code"] for f in fixed_outputs.get(id(entry), [])}
            other = bool({f["code"] for f in others.get(id(entry), [])} & set(expect))
            kept = hit and bool(codes & set(expect) & after)
            for name in bug_groups(entry):
                report.groups.setdefault(name, GroupCounts()).add(expect, codes, hit, other, kept)
            report.bug_results.append(
                {
                    "repo": entry["repo"],
                    "path": entry["path"],
                    "fix_commit": entry.get("fix_commit", ""),
                    "expect": expect,
                    "span": entry.get("span") or "unlabelled",
                    "construct": entry.get("construct"),
                    "heldout": bool(entry.get("heldout")),
                    "caught": hit,
                    "elsewhere": other and not hit,
                    "kept_after_fix": kept,
                    "reported": sorted(codes),
                }
            )
            for code in expect:
                counts = report.rules[code]
                counts.bug_rows += 1
                counts.caught += code in codes
                counts.still_after_fix += code in codes and code in after
            if not hit:
                report.missed.append(
                    {
                        "repo": entry["repo"],
                        "path": entry["path"],
                        "fix_commit": entry.get("fix_commit", ""),
                        "expect": expect,
                        "description": entry.get("description", ""),
                    }
                )
    return report


def row_paths(row: dict) -> list[str]:
    """The other files a bug row spans (its `paths` without its own `path`)."""
    return [p for p in row.get("paths", []) if p != row["path"]]


# --- output ----------------------------------------------------------------------------------


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_table(report: Report, out=sys.stdout) -> None:
    write = out.write
    write(
        f"clean files: {report.clean_files} from {len(report.clean_repos)} repositories; "
        f"bug rows: {report.bug_rows}\n\n"
    )
    header = (
        f"{'rule':6} {'sev':4} {'finds':>5} {'true':>5} {'def':>5} {'false':>5} "
        f"{'unj':>5} {'prec':>5}  {'bugs':>4} {'caught':>6} {'recall':>6} {'kept':>4}\n"
    )
    write(header)
    write("-" * (len(header) - 1) + "\n")
    totals = {"warning/error": RuleCounts(), "information": RuleCounts()}
    rows = sorted(report.rules.items())
    for code, c in rows:
        recall = c.caught / c.bug_rows if c.bug_rows else None
        write(
            f"{code:6} {c.severity[:4] or '?':4} {c.findings:5} {c.true:5} {c.defensible:5} "
            f"{c.false:5} {c.unjudged:5} {_fmt(c.precision()):>5}  {c.bug_rows:4} "
            f"{c.caught:6} {_fmt(recall):>6} {c.still_after_fix:4}\n"
        )
        total = totals["information" if c.severity in ("information", "hint") else "warning/error"]
        for name in ("findings", "true", "defensible", "false", "unjudged"):
            setattr(total, name, getattr(total, name) + getattr(c, name))
    write("-" * (len(header) - 1) + "\n")
    for name, t in totals.items():
        write(
            f"{name:13} findings {t.findings}, true {t.true}, defensible {t.defensible}, "
            f"false {t.false}, unjudged {t.unjudged}, precision {_fmt(t.precision())}\n"
        )
    recall = report.caught / report.bug_rows if report.bug_rows else None
    write(f"bug rows caught: {report.caught}/{report.bug_rows} (recall {_fmt(recall)})\n")
    write("(kept: expected code still reported on the fixed version)\n")
    if report.groups:
        print_groups(report, out)
    if report.missed:
        write("\nmissed bug rows:\n")
        for m in report.missed:
            write(
                f"  {m['repo']}:{m['path']} fix {m['fix_commit'][:10]} "
                f"{','.join(m['expect'])}: {m['description']}\n"
            )
    if report.unjudged:
        write("\nunjudged findings:\n")
        for u in report.unjudged:
            write(
                f"  {u['code']} {u['severity'][:4]} {u['repo']}:{u['path']}:{u['line']} "
                f"{u['message']}\n"
            )
    if report.stale:
        write("\nverdicts with no matching finding (the rule changed, or the line moved):\n")
        for s in report.stale:
            write(f"  {s['code']} {s['repo']}:{s['path']}:{s['line']}\n")
    if report.skipped:
        write("\nskipped (snapshot or file not present here):\n")
        for s in report.skipped:
            write(f"  {s}\n")


def _group_order(name: str) -> tuple[int, str]:
    order = ("span: one-function", "span: spanning", "construct", "span: unlabelled", "held-out")
    for rank, prefix in enumerate(order):
        if name.startswith(prefix):
            return rank, name
    return len(order), name


def print_groups(report: Report, out=sys.stdout) -> None:
    """Recall per slice of the bug rows, then per code inside each slice, then every row."""
    write = out.write
    write("\nbug-row recall by slice (elsewhere: expected code only on another file it spans)\n")
    write(f"{'slice':22} {'rows':>4} {'caught':>6} {'recall':>6} {'elsewhere':>9} {'kept':>4}\n")
    for name, g in sorted(report.groups.items(), key=lambda kv: _group_order(kv[0])):
        recall = g.caught / g.rows if g.rows else None
        write(f"{name:22} {g.rows:4} {g.caught:6} {_fmt(recall):>6} {g.elsewhere:9} {g.kept:4}\n")
    write("\nper code inside each slice (caught/rows expecting it)\n")
    for name, g in sorted(report.groups.items(), key=lambda kv: _group_order(kv[0])):
        if name.startswith("construct"):
            continue
        cells = ", ".join(f"{code} {c}/{n}" for code, (n, c) in sorted(g.per_code.items()))
        write(f"  {name:20} {cells}\n")
    write("\nbug rows:\n")
    for r in sorted(report.bug_results, key=lambda r: (r["span"], r["repo"], r["path"])):
        mark = "caught" if r["caught"] else ("elsewhere" if r["elsewhere"] else "missed")
        where = r["span"] + (f"/{r['construct']}" if r["construct"] else "")
        tag = " held-out" if r["heldout"] else ""
        write(
            f"  {mark:9} {where:14} {','.join(r['expect']):11} {r['repo']}:{r['path']}"
            f" fix {r['fix_commit'][:10]}{tag}\n"
        )


def as_json(report: Report) -> dict:
    rules = {}
    for code, c in sorted(report.rules.items()):
        rules[code] = {
            "severity": c.severity,
            "findings": c.findings,
            "true": c.true,
            "defensible": c.defensible,
            "false": c.false,
            "unjudged": c.unjudged,
            "precision": c.precision(),
            "bug_rows": c.bug_rows,
            "caught": c.caught,
            "recall": c.caught / c.bug_rows if c.bug_rows else None,
            "still_after_fix": c.still_after_fix,
        }
    return {
        "clean_files": report.clean_files,
        "clean_repos": len(report.clean_repos),
        "bug_rows": report.bug_rows,
        "caught": report.caught,
        "rules": rules,
        "slices": {
            name: {
                "rows": g.rows,
                "caught": g.caught,
                "recall": g.caught / g.rows if g.rows else None,
                "elsewhere": g.elsewhere,
                "kept_after_fix": g.kept,
                "per_code": {code: {"rows": n, "caught": c} for code, (n, c) in g.per_code.items()},
            }
            for name, g in sorted(report.groups.items(), key=lambda kv: _group_order(kv[0]))
        },
        "bug_results": report.bug_results,
        "missed": report.missed,
        "unjudged": report.unjudged,
        "stale": report.stale,
        "skipped": report.skipped,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--manifest",
        type=Path,
        action="append",
        help="a manifest to score (repeatable; default: corpus/manifest.json)",
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--only-clean", action="store_true", help="only the clean rows")
    which.add_argument("--only-bugs", action="store_true", help="only the bug rows")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--torchls", help="the torchls executable (default: .venv's)")
    parser.add_argument(
        "--no-fixed", action="store_true", help="do not check the fixed version of bug rows"
    )
    args = parser.parse_args(argv)
    entries = []
    for path in args.manifest or [DEFAULT_MANIFEST]:
        manifest = json.loads(path.read_text())
        entries.extend(manifest["entries"] if isinstance(manifest, dict) else manifest)
    if args.only_clean:
        entries = [e for e in entries if e["kind"] == "clean"]
    elif args.only_bugs:
        entries = [e for e in entries if e["kind"] == "bug"]
    torchls = [args.torchls] if args.torchls else default_torchls()
    report = score(entries, torchls, check_fixed=not args.no_fixed)
    if args.json:
        json.dump(as_json(report), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_table(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
