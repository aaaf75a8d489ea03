"""Bounded repro on real public training scripts, unmodified and with planted bugs (issue #15).

Nothing fetched is stored in this repository: `bench/corpus/scripts.json` names each script by
repository, commit and path, with its own arguments, the stubs it needs and the data files it
would have downloaded or prepared. This bench

1. materialises each repository from its snapshot (bare git folders under `$TORCHLS_MIRROR`,
   default `/work/.mirror`, one per `owner+name`) into `$TORCHLS_REAL_CACHE` (default
   `/tmp/torchls-real-scripts`, outside the repository), writes the data files the manifest
   asks for (random tokens of the right dtype, random text) into that copy, and builds an
   interpreter there (a venv whose `.pth` adds this checkout's `.venv` site-packages, the stub
   packages of `bench/stubs/` and the repositories a script expects installed, as
   `pip install -e` would);
2. runs `torchls repro SCRIPT --steps 2 --device cpu` with only the script's own arguments,
   cold (the CLI, a fresh process) and warm (`ReproSession`, forked from a worker), and the same
   script plain (this file's `--plain-child` mode: no tracing, no sandbox, stopped at the same
   boundary: the N-th optimizer step, the N-th backward when no optimizer was made, or the
   (N+1)-th batch); checks the step bound was reached, that no warning/error finding was
   reported and that nothing was written into the project folder;
3. applies the manifest's planted bugs (a textual replacement in a copy of a script) and checks
   that each is reported with the expected code on the line the patch marks.

Prints two tables (and `--json` the rows). Figures for people to read; no thresholds.
Usage: python bench/real_scripts.py [--only NAME ...] [--skip-warm] [--skip-plain]
                                    [--no-planted] [--only-planted] [--json]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pickle
import pty
import random
import shlex
import shutil
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MANIFEST = HERE / "corpus" / "scripts.json"
STUBS = HERE / "stubs"
MIRROR = Path(os.environ.get("TORCHLS_MIRROR", "/work/.mirror"))
CACHE = Path(os.environ.get("TORCHLS_REAL_CACHE", "/tmp/torchls-real-scripts"))
TORCHLS = ROOT / ".venv" / "bin" / "torchls"
MAX_BLOB = 8 << 20  # larger files are left out of the materialised copy (none is needed)
STEPS = 2


# --- snapshots and copies ----------------------------------------------------------------------


def git_dir(repo: str) -> Path:
    folder = MIRROR / repo.replace("/", "+")
    return folder / "repo" if (folder / "repo").is_dir() else folder


def materialise(repo: str, commit: str) -> Path:
    """The repository's files at `commit`, once per (repo, commit); missing blobs are skipped."""
    target = CACHE / "trees" / f"{repo.replace('/', '+')}@{commit[:12]}"
    if (target / ".complete").exists():
        return target
    if target.exists():
        shutil.rmtree(target)
    gd = str(git_dir(repo))
    listing = subprocess.run(
        ["git", f"--git-dir={gd}", "ls-tree", "-r", "-l", "-z", commit],
        capture_output=True,
        check=True,
    ).stdout.decode()
    wanted: list[tuple[str, str]] = []
    for row in filter(None, listing.split("\0")):
        meta, path = row.split("\t", 1)
        mode, kind, sha, size = meta.split()
        if kind == "blob" and mode != "120000" and size.isdigit() and int(size) <= MAX_BLOB:
            wanted.append((sha, path))
    batch = subprocess.Popen(
        ["git", f"--git-dir={gd}", "cat-file", "--batch"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert batch.stdin is not None and batch.stdout is not None
    for sha, path in wanted:
        batch.stdin.write(f"{sha}\n".encode())
        batch.stdin.flush()
        header = batch.stdout.readline().decode().split()
        if len(header) < 3 or header[1] == "missing":
            continue
        data = batch.stdout.read(int(header[2]))
        batch.stdout.read(1)
        out = target / path
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
    batch.stdin.close()
    batch.wait()
    (target / ".complete").write_text(commit)
    return target


def write_data(project: Path, items: list[dict[str, Any]]) -> None:
    """The files a script would have downloaded or prepared, with random content of the right
    format: `tokens` (a flat array of `dtype` values below `vocab`), `meta` (nanoGPT's
    vocabulary pickle), `text` (random characters, always containing `must_contain`) and `words`
    (lines of random words)."""
    rng = random.Random(0)
    for item in items:
        path = project / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        kind = item["kind"]
        if kind == "tokens":
            import numpy as np  # only nanoGPT-style data needs it

            values = np.random.default_rng(0).integers(0, item["vocab"], item["count"])
            values.astype(item["dtype"]).tofile(path)
        elif kind == "meta":
            chars = [chr(32 + i) for i in range(item["vocab"])]
            meta = {
                "vocab_size": item["vocab"],
                "itos": dict(enumerate(chars)),
                "stoi": {c: i for i, c in enumerate(chars)},
            }
            path.write_bytes(pickle.dumps(meta))
        elif kind == "text":
            alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ ,.!?;:'\n"
            body = "".join(rng.choice(alphabet) for _ in range(item["chars"]))
            path.write_text(item.get("must_contain", "") + body)
        elif kind == "words":
            vocab = [f"w{i}" for i in range(item.get("vocab", 2000))]
            lines = (" ".join(rng.choices(vocab, k=12)) for _ in range(item["lines"]))
            path.write_text("\n".join(lines) + "\n")
        else:
            raise ValueError(f"unknown data kind {kind!r}")


def project_copy(entry: dict[str, Any], kind: str, patched: dict[str, str] | None = None) -> Path:
    """A fresh copy of the entry's repository (plus its data files) at a stable path, so that
    the interpreter's `.pth` can name the folders a script expects installed."""
    tree = materialise(entry["repo"], entry["commit"])
    project = CACHE / kind / slug(entry["name"])
    if project.exists():
        shutil.rmtree(project)
    shutil.copytree(tree, project, ignore=shutil.ignore_patterns(".complete"))
    write_data(project, entry.get("data", []))
    for path, text in (patched or {}).items():
        (project / path).write_text(text)
    return project


def slug(name: str) -> str:
    return name.replace("/", "_")


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under `folder` with its size and modification time."""
    seen = {}
    for path in folder.rglob("*"):
        if path.is_file() or path.is_symlink():
            stat = path.lstat()
            seen[str(path.relative_to(folder))] = (stat.st_size, stat.st_mtime_ns)
    return seen


def changed(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> list[str]:
    paths = set(before) | set(after)
    return sorted(p for p in paths if before.get(p) != after.get(p))


# --- the interpreter ---------------------------------------------------------------------------


def interpreter(entries: list[dict[str, Any]]) -> Path:
    """A venv over this checkout's `.venv` packages plus the stubs and editable folders."""
    env = CACHE / "env"
    python = env / "bin" / "python"
    if not python.exists():
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", "--without-pip", str(env)], check=True)
    site = subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "python"),
            "-c",
            "import site; print(site.getsitepackages()[0])",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    own_site = subprocess.run(
        [str(python), "-c", "import site; print(site.getsitepackages()[0])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    lines = [site, str(STUBS)]
    for entry in entries:
        for kind in ("projects", "planted", "plain", "overhead"):
            for folder in entry.get("installed", []):
                lines.append(str(CACHE / kind / slug(entry["name"]) / folder))
    Path(own_site, "torchls_bench.pth").write_text("\n".join(dict.fromkeys(lines)) + "\n")
    return python


# --- runs --------------------------------------------------------------------------------------


def repro_cold(entry: dict[str, Any], project: Path, python: Path) -> tuple[float, dict]:
    command = [
        str(TORCHLS),
        "repro",
        str(project / entry["path"]),
        "--steps",
        str(STEPS),
        "--device",
        "cpu",
        "--root",
        str(project),
        "--cwd",
        str(project / entry.get("cwd", ".")),
        "--python",
        str(python),
        "--output-format",
        "json",
    ]
    if entry.get("args"):
        command += ["--args", shlex.join(entry["args"])]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=project)
    wall = time.perf_counter() - started
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        report = {"status": "no-report", "stderr": done.stderr[-2000:], "findings": []}
    return wall, report


def repro_options(entry: dict[str, Any], project: Path, python: Path) -> Any:
    from torchls.probe import ReproOptions

    return ReproOptions(
        device="cpu",
        steps=STEPS,
        python=str(python),
        root=str(project),
        cwd=str(project / entry.get("cwd", ".")),
        argv=tuple(entry.get("args", [])),
    )


def repro_warm(entry: dict[str, Any], project: Path, python: Path) -> tuple[float, dict]:
    """The editor's path: a worker that has imported torch forks a child for the run."""
    from torchls.probe.prepare import prepare
    from torchls.probe.warm import ReproSession

    options = repro_options(entry, project, python)
    path = project / entry["path"]
    session = ReproSession()
    try:
        session.prewarm_prepared(prepare(path, options), wait=True)
        started = time.perf_counter()
        report = session.run(path, options)
        wall = time.perf_counter() - started
    finally:
        session.close()
    return wall, report.data


def plain(entry: dict[str, Any], python: Path) -> tuple[float, str]:
    """The same script in a fresh interpreter, untraced, unsandboxed, stopped at the same bound."""
    project = project_copy(entry, "plain")
    cwd = project / entry.get("cwd", ".")
    command = [str(python), str(Path(__file__).resolve()), "--plain-child", str(STEPS)]
    command += [str(project / entry["path"]), *entry.get("args", [])]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONDONTWRITEBYTECODE="1", MPLBACKEND="Agg")
    # A terminal on stdin, as in a shell (and in the repro): pytorch-cifar asks `stty size`.
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    started = time.perf_counter()
    try:
        done = subprocess.run(
            command, stdin=follower, capture_output=True, text=True, cwd=cwd, env=env, timeout=600
        )
    finally:
        os.close(follower)
        os.close(leader)
    wall = time.perf_counter() - started
    stopped = "?"
    for line in done.stderr.splitlines():
        if line.startswith("PLAIN-STOP "):
            stopped = line.split()[1]
    if stopped == "?":
        stopped = f"rc={done.returncode}: {done.stderr.strip().splitlines()[-1:]}"
    return wall, stopped


def plain_child(steps: int, script: str, argv: list[str]) -> None:
    """Run `script` as __main__ with no probe, stopping where the probe would stop."""
    import runpy

    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.utils.data import DataLoader

    class Stop(BaseException):
        pass

    counts = {"steps": 0, "backwards": 0, "batches": 0, "optimizers": 0}

    def after_step(*_: Any) -> None:
        counts["steps"] += 1
        if counts["steps"] >= steps:
            raise Stop("steps")

    register_optimizer_step_post_hook(after_step)
    original_init = torch.optim.Optimizer.__init__

    def counting_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        counts["optimizers"] += 1

    torch.optim.Optimizer.__init__ = counting_init  # type: ignore[method-assign]
    original_backward = torch.Tensor.backward

    def counting_backward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if counts["optimizers"] == 0 and counts["backwards"] >= steps:
            raise Stop("backwards")
        counts["backwards"] += 1
        return original_backward(self, *args, **kwargs)

    torch.Tensor.backward = counting_backward  # type: ignore[method-assign]
    original_iter = DataLoader.__iter__

    def counting_iter(loader: Any) -> Any:
        for batch in original_iter(loader):
            yield batch
            counts["batches"] += 1
            if counts["batches"] >= steps:
                raise Stop("batches")

    DataLoader.__iter__ = counting_iter  # type: ignore[method-assign]
    sys.argv = [script, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    reason = "end"
    try:
        runpy.run_path(script, run_name="__main__")
    except Stop as stop:
        reason = str(stop)
    except SystemExit as error:
        reason = f"exit:{error.code}"
    print(f"PLAIN-STOP {reason}", file=sys.stderr, flush=True)
    os._exit(0)  # DataLoader workers and the like would only delay the measurement


# --- the tables --------------------------------------------------------------------------------


def loud(report: dict) -> list[str]:
    return [
        f"{f['code']}@{f['line']}"
        for f in report.get("findings", [])
        if f.get("severity") in ("warning", "error")
    ]


def written_count(report: dict) -> int:
    return len((report.get("written") or {}).get("files", []))


def run_clean(entry: dict[str, Any], python: Path, args: argparse.Namespace) -> dict[str, Any]:
    project = project_copy(entry, "projects")
    before = snapshot(project)
    cold, report = repro_cold(entry, project, python)
    touched = changed(before, snapshot(project))
    row: dict[str, Any] = {
        "name": entry["name"],
        "status": report.get("status"),
        "stopped_by": report.get("stopped_by"),
        "loud": loud(report),
        "info": sorted(
            {
                f"{f['code']} {Path(f['filename']).name}:{f['line']}: {f['message'][:110]}"
                for f in report.get("findings", [])
                if f.get("severity") == "information"
            }
        ),
        "written": written_count(report),
        "touched": touched,
        "cold_s": cold,
        "exception": (report.get("exception") or {}).get("message"),
        "limit": report.get("limit_message") or report.get("stderr"),
        "notes": report.get("notes", [])[:3],
    }
    if not args.skip_warm:
        project = project_copy(entry, "projects")
        before = snapshot(project)
        warm, warm_report = repro_warm(entry, project, python)
        row["warm_s"] = warm
        row["warm_stopped_by"] = warm_report.get("stopped_by")
        row["warm_runner"] = (warm_report.get("timing") or {}).get("runner")
        row["touched"] = sorted(set(touched) | set(changed(before, snapshot(project))))
    if not args.skip_plain:
        row["plain_s"], row["plain_stop"] = plain(entry, python)
    return row


def run_planted(entry: dict[str, Any], bug: dict[str, Any], python: Path) -> dict[str, Any]:
    tree = materialise(entry["repo"], entry["commit"])
    target = bug.get("file", entry["path"])
    source = (tree / target).read_text()
    if source.count(bug["find"]) != 1:
        return {"name": f"{entry['name']}: {bug['bug']}", "ok": False, "got": "patch misses"}
    patched = source.replace(bug["find"], bug["replace"])
    line = patched.count("\n", 0, patched.index(bug["expect_at"])) + 1
    project = project_copy(entry, "planted", {target: patched})
    wall, report = repro_cold(entry, project, python)
    got = [
        (f["code"], f["line"], f["severity"], Path(f["filename"]).name)
        for f in report.get("findings", [])
    ]
    name = Path(target).name
    hit = any(code == bug["code"] and at == line and file == name for code, at, _, file in got)
    return {
        "name": f"{entry['name']}: {bug['bug']}",
        "expected": f"{bug['code']}@{line}"
        + (f" ({Path(target).name})" if target != entry["path"] else ""),
        "got": ", ".join(
            f"{c}@{n}" + (f" ({f})" if f != Path(entry["path"]).name else "")
            for c, n, s, f in got
            if s != "information" or c == bug["code"]
        )
        or "-",
        "ok": hit,
        "stopped_by": report.get("stopped_by"),
        "wall_s": wall,
    }


def fmt(value: float | None) -> str:
    return f"{value:6.1f}" if isinstance(value, (int, float)) else "     -"


def print_clean(rows: list[dict[str, Any]]) -> None:
    print("\nUnmodified scripts: torchls repro SCRIPT --steps 2 --device cpu")
    head = (
        f"{'script':30} {'stopped_by':10} {'warn/err':9} {'wrote':>5} {'proj':>4} "
        f"{'cold s':>6} {'warm s':>6} {'plain s':>7} {'cold/pl':>7} {'warm/pl':>7}"
    )
    print(head)
    print("-" * len(head))
    for row in rows:
        plain_s = row.get("plain_s")
        ratio_cold = row["cold_s"] / plain_s if plain_s else None
        ratio_warm = row.get("warm_s") / plain_s if plain_s and row.get("warm_s") else None
        print(
            f"{row['name']:30} {row['stopped_by']!s:10} {len(row['loud']) or 'none':>9} "
            f"{row['written']:>5} {len(row['touched']) or 'none':>4} {fmt(row['cold_s'])} "
            f"{fmt(row.get('warm_s'))} {fmt(plain_s):>7} "
            f"{(f'{ratio_cold:.2f}x' if ratio_cold else '-'):>7} "
            f"{(f'{ratio_warm:.2f}x' if ratio_warm else '-'):>7}"
        )
    for row in rows:
        extra = []
        if row["loud"]:
            extra.append(f"findings {row['loud']}")
        if row["stopped_by"] not in ("steps", "backwards", "batches"):
            extra.append(f"status {row['status']}: {row['exception'] or row['limit']}")
        if row.get("plain_stop") not in (None, "steps", "backwards", "batches"):
            extra.append(f"plain run: {row['plain_stop']}")
        if row.get("warm_stopped_by") not in (None, row["stopped_by"]):
            extra.append(f"warm stopped_by {row['warm_stopped_by']}")
        if row["touched"]:
            extra.append(f"project changed: {row['touched'][:5]}")
        if extra:
            print(f"  {row['name']}: " + "; ".join(extra))
        for info in row["info"]:
            print(f"  {row['name']}: information: {info}")


def print_planted(rows: list[dict[str, Any]]) -> None:
    print("\nPlanted bugs (default settings, --steps 2 --device cpu)")
    head = f"{'script: bug':66} {'expected':20} {'ok':3} {'stopped_by':10} reported (warn/err)"
    print(head)
    print("-" * len(head))
    for row in rows:
        ok = "yes" if row["ok"] else "NO"
        print(
            f"{row['name']:66} {row.get('expected', '-'):20} {ok:3} "
            f"{row.get('stopped_by')!s:10} {row['got']}"
        )


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--plain-child":
        plain_child(int(sys.argv[2]), sys.argv[3], sys.argv[4:])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", nargs="*", default=None, help="entry names to run")
    parser.add_argument("--skip-warm", action="store_true")
    parser.add_argument("--skip-plain", action="store_true")
    parser.add_argument("--no-planted", action="store_true")
    parser.add_argument("--only-planted", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "server"))
    entries = json.loads(MANIFEST.read_text())["scripts"]
    chosen = [e for e in entries if args.only is None or e["name"] in args.only]
    python = interpreter(entries)
    clean: list[dict[str, Any]] = []
    planted: list[dict[str, Any]] = []
    if not args.only_planted:
        for entry in chosen:
            print(f"running {entry['name']} ...", file=sys.stderr, flush=True)
            clean.append(run_clean(entry, python, args))
        print_clean(clean)
    if not args.no_planted:
        for entry in chosen:
            for bug in entry.get("planted", []):
                print(f"planted {entry['name']}: {bug['bug']} ...", file=sys.stderr, flush=True)
                planted.append(run_planted(entry, bug, python))
        print_planted(planted)
    if args.json:
        print(json.dumps({"clean": clean, "planted": planted}, indent=1, default=str))


if __name__ == "__main__":
    main()
