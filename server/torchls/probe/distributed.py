"""`torchls repro --nproc N`: the bounded run under torchrun, and one report from N ranks.

In: a prepared run whose options name `nproc` (and maybe `nnodes`, `rdzv_endpoint`). Out: the
same `ReproReport` a single-process run gives, built from every rank's report:

- launch: `python -m torch.distributed.run --standalone --nproc-per-node N -m torchls_probe`
  in the user's interpreter, inside one sandbox for all ranks (bubblewrap's network namespace
  has its own loopback, so the rendezvous works and nothing else does; without bubblewrap the
  private network namespace gets its loopback brought up). With `--nnodes`/`--rdzv-endpoint`
  the c10d rendezvous at that endpoint replaces `--standalone`, for runs across machines
  (an endpoint off this machine needs `--network`). Each local rank writes its own report
  file, bound into the sandbox like the single report; they share the output file.
- merge: the report of rank 0 (the lowest rank that wrote one) is the one shown, lines and
  all; every rank's findings are kept once each (those of some ranks only say which); TL908
  is built here from the hang a rank declared and the stacks every rank took at that moment
  (with the branch condition around the collective, read from the source); a rank without a
  report gets a finding saying how it ended (torchrun's failure summary gives its exit code);
  lines whose values differ between ranks are marked, with the other ranks' values; a run in
  which no rank ever started is reported as a rendezvous that never completed.
- the distributed findings (TL908, TL909, TL910 and TL803 from the run) honour `# noqa` on
  their line, as the static ones do: that is how a script says a model is per-rank on purpose.
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import socket
import time
from pathlib import Path
from typing import Any

from torchls.probe import untrusted
from torchls.probe.launch import (
    REPORT_READ_LIMIT,
    LaunchSpec,
    Left,
    ProgressCallback,
    Run,
    Strategy,
    execute,
    forward_progress,
    not_started,
    probe_command,
    read_output,
)
from torchls.probe.options import LOOPBACK
from torchls.probe.prepare import Prepared
from torchls.probe.process import Ended
from torchls.probe.report import load_probe_report, synthesize
from torchls.probe.sandbox import Layer, SandboxPlan, bwrap_works, can_unshare_net
from torchls.probe.scratch import RunFolder
from torchls.probe.sources import ProjectSources

DEFAULT_COLLECTIVE_TIMEOUT_S = 5.0
# Processes a run may start, per rank (torchrun and each rank hold a handful of threads, which
# the process limits count).
PROCESSES_PER_RANK = 64
DISTRIBUTED_CODES = ("TL908", "TL909", "TL910", "TL803")
MARKED_LINES = 200  # lines marked as differing between ranks, at most
_FAILURE = re.compile(
    r"rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*(?P<local>\d+)\)\s*\n\s*exitcode\s*:\s*"
    r"(?P<code>-?\d+)"
)
_STATUS_ORDER = ("crashed", "memory", "timeout", "error", "ok")


def torchrun_arguments(options: Any) -> list[str]:
    if options.nnodes is None and options.rdzv_endpoint is None:
        rendezvous = ["--standalone"]
    else:
        rendezvous = [
            "--nnodes",
            str(options.nnodes or "1"),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            options.rdzv_endpoint or "127.0.0.1:29400",
            "--rdzv-id",
            "torchls-repro",
        ]
    return [
        *rendezvous,
        "--nproc-per-node",
        str(options.nproc),
        "--max-restarts",
        "0",
        "--monitor-interval",
        "0.1",
        "--shutdown-timeout",
        "2",
    ]


def run_in(
    prepared: Prepared,
    folder: RunFolder,
    started: float,
    on_progress: ProgressCallback | None,
    cancel_event: Any,
) -> dict[str, Any]:
    """One distributed cold run in `folder`: the report document (launch.py's sequence with
    the `Ranks` strategy)."""
    options = prepared.resolved.options
    nproc = int(options.nproc)
    taken = _endpoint_taken(options)
    if taken is not None:
        return _refused(prepared, taken)
    reports = tuple(folder.report.parent / f"report.rank{index}.json" for index in range(nproc))
    for path in reports:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    launcher = ("-m", "torch.distributed.run", *torchrun_arguments(options))
    spec = LaunchSpec(
        command=tuple(probe_command(prepared, folder, launcher)),
        outputs=reports,
        request={
            "distributed": {
                "nproc": nproc,
                "reports": [str(path) for path in reports],
                "exchange": str(folder.home / ".torchls-ranks"),
                "collective_timeout_s": options.collective_timeout_s
                or DEFAULT_COLLECTIVE_TIMEOUT_S,
                "launched_unix": time.time(),
            }
        },
        max_processes=max(options.max_processes, PROCESSES_PER_RANK * (nproc + 1)),
        loopback=True,
        tree=True,
        start_message=f"starting torchrun with {nproc} ranks",
    )
    strategy = Ranks(nproc, reports, " ".join([*launcher[1:], "-m", "torchls_probe"]))
    return execute(
        prepared,
        spec,
        folder,
        strategy,
        started=started,
        on_progress=on_progress,
        cancel_event=cancel_event,
    )


class Ranks(Strategy):
    """A cold run under torchrun: the ranks' progress relabelled (the bar follows rank 0), one
    report merged from theirs, and a layer saying where the ranks ran."""

    def __init__(self, nproc: int, reports: tuple[Path, ...], launcher: str) -> None:
        self.nproc = nproc
        self.reports = reports
        self.launcher = launcher
        self.started_ranks: set[int] = set()

    def on_message(self, message: dict[str, Any], on_progress: ProgressCallback | None) -> None:
        rank = message.get("rank")
        if isinstance(rank, int) and not isinstance(rank, bool):
            self.started_ranks.add(rank)
            if rank != 0:
                # The bar follows rank 0; the others' stages are named, not counted.
                message = {**message, "step": None, "total": None}
                message["message"] = f"rank {rank}: {message.get('message', '')}"
        forward_progress(message, on_progress)

    def collect(self, run: Run, ended: Ended) -> Left:
        per_rank = [load_probe_report(path, REPORT_READ_LIMIT) for path in self.reports]
        merged = merge(
            run.prepared,
            run.request,
            per_rank,
            stderr=ended.stderr,
            killed_for=ended.killed_for,
            started_ranks=self.started_ranks,
            launcher=self.launcher,
        )
        return Left(merged, None, read_output(run.folder.output))

    def layers(self, run: Run, ended: Ended) -> list[Layer]:
        return [*super().layers(run, ended), _ranks_layer(self.nproc, run.sandbox)]


def _endpoint_taken(options: Any) -> str | None:
    """Why a loopback rendezvous endpoint on the host's own network cannot be this run's: a
    process already listens there (torchrun would connect to it as if it were the store and
    wait). Inside the sandbox's network namespace every port is free, so only a run that
    shares the host's network (`--network`, or no namespace here) is checked."""
    endpoint = options.rdzv_endpoint
    if endpoint is None or options.nnodes not in (None, "1"):
        return None
    isolated = not options.network and (
        (options.sandbox != "none" and bwrap_works()[0]) or can_unshare_net()
    )
    host, _, port = endpoint.rpartition(":")
    if isolated or not port.isdigit() or not LOOPBACK.match(host):
        return None
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host.strip("[]"), int(port)))
        except OSError:
            return (
                f"the rendezvous endpoint {endpoint} is already in use by another process: "
                "choose a free port, or leave out --rdzv-endpoint (--standalone picks one)"
            )
    return None


def _refused(prepared: Prepared, why: str) -> dict[str, Any]:
    request = prepared.request(None, None)
    data = synthesize(
        status="error",
        file=str(prepared.file),
        code="TL905",
        stopped_by="rendezvous",
        message=why,
        request=request,
    )
    data["distributed"] = {"nproc": prepared.resolved.options.nproc, "ranks": [], "stacks": []}
    return not_started(prepared, data)


def _ranks_layer(nproc: int, sandbox: SandboxPlan) -> Layer:
    network = next((layer for layer in sandbox.layers if layer.name == "network"), None)
    where = (
        "one private network namespace with its own loopback: the rendezvous works, nothing "
        "else does"
        if network is not None and network.held
        else "the host's network"
    )
    return Layer(
        "ranks",
        True,
        f"{nproc} ranks under torchrun, all in this sandbox with the limits above each; {where}",
    )


# -- merging the ranks' reports ----------------------------------------------------------------


def merge(
    prepared: Prepared,
    request: dict[str, Any],
    per_rank: list[tuple[dict[str, Any] | None, str | None]],
    *,
    stderr: str,
    killed_for: str | None,
    started_ranks: set[int],
    launcher: str,
) -> dict[str, Any]:
    """One report from the ranks' reports (see the module docstring)."""
    options = prepared.resolved.options
    file = str(prepared.file)
    present = [(index, data) for index, (data, _problem) in enumerate(per_rank) if data]
    failures = torchrun_failures(stderr)
    if not present:
        return _nobody_reported(prepared, request, per_rank, stderr, killed_for, started_ranks)
    base_index, base = present[0]
    merged: dict[str, Any] = json.loads(json.dumps(base))
    rank_of = {index: _rank(data, index) for index, data in present}
    findings = _merge_findings(present, rank_of)
    missing = [index for index in range(len(per_rank)) if per_rank[index][0] is None]
    for index in missing:
        findings.append(_missing_rank(file, index, per_rank[index][1], failures, killed_for))
    hang = _hang_finding(prepared, present, rank_of, missing)
    if hang is not None:
        findings.insert(0, hang)
    sources = ProjectSources(str(prepared.root), allow=(file,))
    merged["findings"] = [f for f in findings if not _silenced(f, sources)]
    statuses = [data.get("status", "crashed") for _, data in present]
    merged["status"] = _worst(statuses + ["crashed"] * len(missing))
    if merged["status"] != base.get("status"):
        # The header says how the worst rank ended, not the shown one ("stopped: a peer").
        worst = (
            next(d for _, d in present if d.get("status") == merged["status"])
            if (merged["status"] in statuses)
            else None
        )
        merged["stopped_by"] = worst.get("stopped_by") if worst is not None else "crash"
    if hang is not None:
        merged["stopped_by"] = "hang"
        if merged["status"] == "ok":
            merged["status"] = "error"
    if merged.get("exception") is None:
        merged["exception"] = next(
            (data["exception"] for _, data in present if data.get("exception")), None
        )
    notes = list(merged.get("notes") or [])
    for index, data in present[1:]:
        notes += [f"rank {rank_of[index]}: {note}" for note in data.get("notes") or []]
    if hang is None and not any(
        (data.get("distributed") or {}).get("initialized") for _, data in present
    ):
        notes.append(
            "the script never set up a process group (init_process_group): each rank ran it "
            "on its own, so the ranks were not compared"
        )
    merged["notes"] = notes[:200]
    _mark_lines(merged, present[1:], rank_of)
    merged["distributed"] = _block(
        options, request, present, rank_of, per_rank, failures, launcher, base_index
    )
    return merged


def _rank(data: dict[str, Any], index: int) -> int:
    rank = (data.get("distributed") or {}).get("rank")
    return rank if isinstance(rank, int) and not isinstance(rank, bool) else index


def _merge_findings(
    present: list[tuple[int, dict[str, Any]]], rank_of: dict[int, int]
) -> list[dict[str, Any]]:
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for index, data in present:
        for item in data.get("findings") or []:
            key = tuple(item.get(k) for k in ("code", "filename", "line", "column", "message"))
            if key in merged:
                merged[key]["ranks"].append(rank_of[index])
            else:
                merged[key] = {**item, "ranks": [rank_of[index]]}
    everyone = len(present)
    found = []
    for item in merged.values():
        ranks = sorted(set(item["ranks"]))
        item["ranks"] = ranks
        if len(ranks) < everyone and everyone > 1 and item.get("code") not in DISTRIBUTED_CODES:
            label = "rank" if len(ranks) == 1 else "ranks"
            item["message"] = f"{label} {', '.join(map(str, ranks))}: {item.get('message', '')}"
        found.append(item)
    return found


def _worst(statuses: list[str]) -> str:
    for status in _STATUS_ORDER:
        if status in statuses:
            return status
    return "crashed"


def torchrun_failures(stderr: str) -> dict[int, int]:
    """local rank -> exit code, from torchrun's failure summary (a signal is negative)."""
    found: dict[int, int] = {}
    for match in _FAILURE.finditer(stderr or ""):
        found.setdefault(int(match.group("local")), int(match.group("code")))
    return found


def _position(file: str, line: int = 1) -> dict[str, Any]:
    return {"filename": file, "line": line, "column": 1, "end_line": line, "end_column": 1}


def _missing_rank(
    file: str, index: int, problem: str | None, failures: dict[int, int], killed_for: str | None
) -> dict[str, Any]:
    code = failures.get(index)
    finding = "TL905"
    if problem is not None:
        how = f"its report was refused: {problem}"
    elif code is not None and code < 0:
        name = _signal_name(-code)
        if -code == signal.SIGXCPU:
            finding, how = "TL906", "it was stopped by the CPU-time limit"
        elif -code == signal.SIGKILL:
            how = f"it was killed by {name} (the out-of-memory killer or the CPU-time limit?)"
        else:
            how = f"it was killed by {name}"
    elif code is not None:
        how = f"it exited with status {code}"
    elif killed_for == "deadline":
        finding, how = "TL906", "the wall-clock limit struck first"
    else:
        how = "no reason is known (torchrun printed none)"
    name = "probe-limit" if finding == "TL906" else "probe-error"
    severity = "warning" if finding == "TL906" else "error"
    return {
        "code": finding,
        "name": name,
        "severity": severity,
        **_position(file),
        "message": f"rank {index} ended without a report: {how}",
        "related": [],
        "ranks": [index],
    }


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _nobody_reported(
    prepared: Prepared,
    request: dict[str, Any],
    per_rank: list[tuple[dict[str, Any] | None, str | None]],
    stderr: str,
    killed_for: str | None,
    started_ranks: set[int],
) -> dict[str, Any]:
    """No rank wrote a report: say whether the ranks ever started (a rendezvous that never
    completed: a port in use, nodes that never joined) or how they ended."""
    options = prepared.resolved.options
    file = str(prepared.file)
    text = stderr or ""
    last = untrusted.one_line(text.strip().splitlines()[-1], 300) if text.strip() else ""
    if "No module named 'torch'" in text:
        # torchrun itself needs torch: the interpreter is the wrong one, as for one process.
        data = synthesize(
            status="error",
            file=file,
            code="TL905",
            stopped_by="setup",
            message=f"torch cannot be imported by {prepared.python}",
            request=request,
        )
        data["exception"] = {
            "kind": "setup",
            "type": "ModuleNotFoundError",
            "message": f"torch cannot be imported by {prepared.python}: torchrun needs it "
            "(choose the interpreter that has your torch with --python)",
            "traceback": [],
        }
    elif started_ranks:
        failures = torchrun_failures(text)
        first = _missing_rank(file, 0, per_rank[0][1], failures, killed_for)
        data = synthesize(
            status="timeout" if killed_for == "deadline" else "crashed",
            file=file,
            code=first["code"],
            stopped_by="timeout" if killed_for == "deadline" else "crash",
            message=f"no rank wrote a report; {first['message'].split(': ', 1)[1]}",
            request=request,
        )
    else:
        cause = _rendezvous_cause(text, options)
        if killed_for == "deadline":
            message = (
                f"stopped by the wall-clock limit of {request['timeout_s']:g} s before any rank "
                f"started: torchrun's rendezvous never completed ({cause})"
            )
            data = synthesize(
                status="timeout",
                file=file,
                code="TL906",
                stopped_by="rendezvous",
                message=message,
                request=request,
            )
        else:
            known = "in use" in cause or "timed out" in cause
            message = (
                "torchrun failed before any rank started"
                + (f" ({cause})" if known else "")
                + (f": {last}" if last else "")
            )
            data = synthesize(
                status="crashed",
                file=file,
                code="TL905",
                stopped_by="rendezvous",
                message=message,
                request=request,
            )
    data["notes"].append(f"stderr: {text[-2000:]}" if text else "stderr: empty")
    data["distributed"] = {
        "nproc": options.nproc,
        "launcher": "torch.distributed.run",
        "ranks": [],
        "started_ranks": sorted(started_ranks),
        "stacks": [],
    }
    return data


def _rendezvous_cause(stderr: str, options: Any) -> str:
    lowered = stderr.lower()
    if "address already in use" in lowered or "eaddrinuse" in lowered:
        endpoint = options.rdzv_endpoint or "the rendezvous port"
        return f"{endpoint} is already in use by another process"
    if options.nnodes not in (None, "1", 1):
        return f"--nnodes {options.nnodes}: torchrun waits for the other nodes to join"
    if "rendezvous" in lowered and "timeout" in lowered:
        return "the rendezvous timed out"
    return "the rendezvous or the start of the ranks took too long"


# -- TL908 ---------------------------------------------------------------------------------------


def _hang_finding(
    prepared: Prepared,
    present: list[tuple[int, dict[str, Any]]],
    rank_of: dict[int, int],
    missing: list[int],
) -> dict[str, Any] | None:
    declared = None
    for _index, data in present:
        hang = (data.get("distributed") or {}).get("hang")
        if isinstance(hang, dict) and isinstance(hang.get("filename"), str):
            declared = hang
            break
    if declared is None or not isinstance(declared.get("line"), int):
        return None
    line = declared["line"]
    op = _span(prepared, declared) or untrusted.one_line(str(declared.get("op") or "?"), 80)
    snapshots = {
        rank_of[index]: snap
        for index, data in present
        if isinstance(snap := (data.get("distributed") or {}).get("snapshot"), dict)
    }
    reached: list[int] = []
    elsewhere: list[tuple[int, dict[str, Any]]] = []
    for rank, snap in sorted(snapshots.items()):
        pending = snap.get("pending") or {}
        if pending.get("op") == declared.get("op") and pending.get("line") == line:
            reached.append(rank)
        else:
            elsewhere.append((rank, snap))
    declarer = declared.get("rank")
    if isinstance(declarer, int) and declarer not in reached and declarer not in snapshots:
        reached.append(declarer)
    absent = sorted(set(rank_of.values()) - set(reached) - {r for r, _ in elsewhere})
    absent += [index for index in missing if index not in reached]
    condition = _branch_condition(prepared, declared["filename"], line)
    waited = declared.get("timeout_s")
    within = f" within {waited:g} s" if isinstance(waited, (int, float)) else ""
    not_reached = [rank for rank, _ in elsewhere] + absent
    message = (
        f"{op} on line {line} was reached by {_who(reached)}"
        + (f" but not by {_who(not_reached)}" if not_reached else " but did not complete")
        + within
        + (f" (it runs under `{condition[0]}`, line {condition[1]})" if condition else "")
    )
    related = []
    parts = []
    for rank, snap in elsewhere:
        text, where = _describe(snap)
        parts.append(f"rank {rank} {text}")
        if where is not None:
            related.append({**where, "message": f"rank {rank} {text}"})
    for rank in absent:
        parts.append(f"rank {rank} left no stack (it ended or was killed before)")
    if parts:
        message += ": " + "; ".join(parts)
    message += ". Every rank must make the same collectives in the same order"
    return {
        "code": "TL908",
        "name": "collective-hang",
        "severity": "error",
        "filename": declared["filename"],
        "line": line,
        "column": declared.get("column", 1),
        "end_line": declared.get("end_line", line),
        "end_column": declared.get("end_column", 1),
        "message": message,
        "related": related[:20],
        "ranks": sorted(rank_of.values()),
    }


def _span(prepared: Prepared, item: dict[str, Any]) -> str | None:
    """The code a position covers, as `text` (from the source, which the report cannot pick)."""
    sources = ProjectSources(str(prepared.root), allow=(str(prepared.file),))
    text = sources.line(item.get("filename"), item.get("line"))
    start, end = item.get("column"), item.get("end_column")
    if not text or not isinstance(start, int) or not isinstance(end, int) or end <= start:
        return None
    return f"`{untrusted.one_line(text[start - 1 : end - 1], 80)}`"


def _who(ranks: list[int]) -> str:
    if not ranks:
        return "no rank"
    label = "rank" if len(ranks) == 1 else "ranks"
    return f"{label} {', '.join(map(str, sorted(ranks)))}"


def _describe(snap: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    state = str(snap.get("state") or "running")
    where = snap.get("where") if isinstance(snap.get("where"), dict) else None
    if where is not None and not isinstance(where.get("line"), int):
        where = None
    source = untrusted.one_line(str((where or {}).get("source") or ""), 80)
    at = f" at line {where['line']}" if where is not None else ""
    code = f" (`{source}`)" if source else ""
    steps = snap.get("steps")
    if state == "finished":
        done = f" ({steps} optimizer step{'s' if steps != 1 else ''})" if steps else ""
        return f"had finished its bounded run{done}{at}", where
    if state.startswith("waiting in "):
        return f"was {untrusted.one_line(state, 80)}{at}{code}", where
    return f"was running{at}{code}", where


def _branch_condition(prepared: Prepared, filename: str, line: int) -> tuple[str, int] | None:
    """The test of the innermost `if`/`while` whose body holds `line`, with its line."""
    sources = ProjectSources(str(prepared.root), allow=(str(prepared.file),))
    lines = sources.lines(filename)
    if lines is None:
        return None
    try:
        tree = ast.parse("\n".join(lines))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    best: tuple[str, int] | None = None
    best_start = -1
    for node in ast.walk(tree):
        if not isinstance(node, (ast.If, ast.While)):
            continue
        for branch in (node.body, node.orelse):
            if not branch:
                continue
            start, end = branch[0].lineno, branch[-1].end_lineno or branch[-1].lineno
            if start <= line <= end and node.lineno > best_start:
                test = ast.get_source_segment("\n".join(lines), node.test) or "?"
                keyword = "while" if isinstance(node, ast.While) else "if"
                if branch is node.orelse:
                    test = f"not ({test})"
                best = (untrusted.one_line(f"{keyword} {test}:", 80), node.lineno)
                best_start = node.lineno
    return best


# -- noqa, lines, the block ----------------------------------------------------------------------


def _silenced(item: dict[str, Any], sources: ProjectSources) -> bool:
    """A `# noqa` for the code on the finding's line, or on a line of the same file it names
    as related (TL909 is at its cause, the seed or the construction; a noqa written where the
    model is used says the same)."""
    if item.get("code") not in DISTRIBUTED_CODES:
        return False
    from torchls.analysis.noqa import ALL, noqa_map

    lines = sources.lines(item.get("filename"))
    if lines is None:
        return False
    rows = [item.get("line")] + [
        related.get("line")
        for related in item.get("related") or []
        if isinstance(related, dict) and related.get("filename") == item.get("filename")
    ]
    for line in rows:
        if isinstance(line, int) and 1 <= line <= len(lines):
            codes = noqa_map([lines[line - 1]]).get(1, set())
            if ALL in codes or item["code"] in codes:
                return True
    return False


def _signature(record: dict[str, Any]) -> list[Any]:
    found = []
    for entry in record.get("entries") or []:
        outputs = entry.get("outputs") or [{}]
        first = outputs[0] if isinstance(outputs[0], dict) else {}
        found.append(
            (
                entry.get("op"),
                entry.get("column"),
                json.dumps(first.get("shape")),
                first.get("dtype"),
                first.get("min"),
                first.get("max"),
                first.get("mean"),
            )
        )
    return found


def _mark_lines(
    merged: dict[str, Any], others: list[tuple[int, dict[str, Any]]], rank_of: dict[int, int]
) -> None:
    """Mark the shown rank's lines whose tensors differ on another rank, with its values."""
    if not others:
        return
    tables = [
        (rank_of[index], {(r.get("filename"), r.get("line")): r for r in data.get("lines") or []})
        for index, data in others
    ]
    marked = 0
    for record in merged.get("lines") or []:
        if marked >= MARKED_LINES:
            break
        key = (record.get("filename"), record.get("line"))
        mine = _signature(record)
        differing = []
        for rank, table in tables:
            theirs = table.get(key)
            if theirs is not None and _signature(theirs) != mine:
                entries = [
                    {**entry, "outputs": (entry.get("outputs") or [])[:1]}
                    for entry in (theirs.get("entries") or [])[:4]
                ]
                differing.append({"rank": rank, "entries": entries})
        if differing:
            record["ranks"] = {"differ": True, "values": differing[:4]}
            marked += 1


def _block(
    options: Any,
    request: dict[str, Any],
    present: list[tuple[int, dict[str, Any]]],
    rank_of: dict[int, int],
    per_rank: list[tuple[dict[str, Any] | None, str | None]],
    failures: dict[int, int],
    launcher: str,
    base_index: int,
) -> dict[str, Any]:
    by_index = dict(present)
    base = (by_index[base_index].get("distributed") or {}) if base_index in by_index else {}
    ranks = []
    stacks = []
    for index in range(len(per_rank)):
        data = by_index.get(index)
        block = (data or {}).get("distributed") or {}
        ranks.append(
            {
                "rank": rank_of.get(index, index),
                "local_rank": index,
                "report": data is not None,
                "provisional": bool((data or {}).get("provisional")),
                "status": (data or {}).get("status", "crashed"),
                "stopped_by": (data or {}).get("stopped_by"),
                "optimizer_steps": ((data or {}).get("progress") or {}).get("optimizer_steps"),
                "exit_code": failures.get(index),
                "backend": (block.get("backend") or {}).get("used"),
            }
        )
        snap = block.get("snapshot")
        if isinstance(snap, dict):
            stacks.append({"rank": rank_of.get(index, index), **snap})
    backend = dict(base.get("backend") or {})
    return {
        "nproc": options.nproc,
        "nnodes": options.nnodes or "1",
        "rdzv_endpoint": options.rdzv_endpoint,
        "launcher": launcher,
        "world_size": base.get("world_size", options.nproc),
        "initialized": bool(base.get("initialized")),
        "backend": backend,
        "collective_timeout_s": request["distributed"]["collective_timeout_s"],
        "shown_rank": rank_of.get(base_index, base_index),
        "ranks": ranks,
        "hang": next(
            (
                (d.get("distributed") or {}).get("hang")
                for _, d in present
                if (d.get("distributed") or {}).get("hang")
            ),
            None,
        ),
        "stacks": stacks,
    }
