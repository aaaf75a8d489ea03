"""`torchls repro FILE --compare BASELINE [--repeat K]`: a baseline and a candidate on the same
bounded run, side by side.

In: the candidate script, a baseline (another file, or a git revision of the project, taken
with `git archive` into a scratch folder: the user's tree is never touched), the repro options
and K. Out: a `Comparison` (JSON-ready) and its text: loss per step, the first non-finite
value, gradient and update norms per layer at the first step, findings that disappeared,
appeared or stayed, and lines whose traced tensors changed shape, dtype or finiteness; with
K > 1, counts per side ("NaN in 3 of 5 baseline runs") and the spread of the final loss.

Both sides run cold in the same sandbox settings with the same seed per repeat; the candidate's
models start from the baseline's initial weights wherever names and shapes match (the probe
copies them at each model's first call), so a difference comes from the code, not the draw.
Exit status (`exit_status`): 0 when the candidate removes the baseline's warning and error
findings and adds none, 1 otherwise.
"""

from __future__ import annotations

import os
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from torchls.probe import ReproOptions, ReproUsageError
from torchls.probe.document import Finding, Summary
from torchls.probe.prepare import prepare
from torchls.probe.report import ReproReport
from torchls.probe.runner import Extras, run_cold
from torchls.probe.sources import ProjectSources
from torchls.records import field, record, replace

SERIOUS = ("error", "warning")
MAX_REPEAT = 20


@record
class Side:
    """One side's runs: the file it ran, its root and a report per repeat."""

    label: str
    file: Path
    root: Path
    reports: list[ReproReport] = field(default_factory=list)


def materialise(file: Path, root: Path, baseline: str, scratch: Path) -> tuple[Path, Path]:
    """(baseline file, baseline root): `baseline` is a file, or a git revision of the project
    holding `file`, written out with `git archive` (never a checkout of the user's tree); the
    root is then the candidate's project root as it was at that revision."""
    candidate = Path(baseline).expanduser()
    if candidate.is_file():
        return candidate.absolute(), candidate.absolute().parent
    folder = file.parent
    try:
        top = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "--show-toplevel"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
        subprocess.run(
            ["git", "-C", top, "rev-parse", "--verify", "--quiet", f"{baseline}^{{commit}}"],
            capture_output=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        raise ReproUsageError(
            f"--compare {baseline}: neither a file nor a git revision of the project"
        ) from None
    archive = scratch / "baseline.tar"
    with open(archive, "wb") as out:
        done = subprocess.run(
            ["git", "-C", top, "archive", "--format=tar", baseline],
            stdout=out,
            stderr=subprocess.PIPE,
            timeout=300,
            check=False,
        )
    if done.returncode != 0:
        raise ReproUsageError(f"--compare {baseline}: git archive failed: {done.stderr[:200]!r}")
    tree = scratch / "baseline"
    tree.mkdir()
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")  # no links out, no absolute paths
    top_path = Path(top).resolve()
    relative = file.resolve().relative_to(top_path)
    target = tree / relative
    if not target.is_file():
        raise ReproUsageError(f"--compare {baseline}: {relative} does not exist at that revision")
    inside = root.resolve().is_relative_to(top_path)
    return target, (tree / root.resolve().relative_to(top_path)) if inside else target.parent


def run_compare(
    file: Path,
    baseline: str,
    options: ReproOptions,
    repeat: int,
    keep: list[ReproReport] | None = None,
) -> dict[str, Any]:
    """Run both sides `repeat` times (the candidate from the baseline's weights) and compare
    them while the baseline's tree still exists; `keep` receives the first baseline and
    candidate reports (for the HTML report)."""
    if not 1 <= repeat <= MAX_REPEAT:
        raise ReproUsageError(f"--repeat must be between 1 and {MAX_REPEAT}")
    file = file.absolute()
    with tempfile.TemporaryDirectory(prefix="torchls-compare-") as folder:
        scratch = Path(folder)
        root = Path(options.root).absolute() if options.root else file.parent
        is_revision = not Path(baseline).expanduser().is_file()
        base_file, base_root = materialise(file, root, baseline, scratch)
        base = Side("baseline", base_file, base_root)
        cand = Side("candidate", file, root)
        seed = options.seed or 0
        base_options = replace(options, root=str(base_root))
        prepared_base = prepare(base_file, base_options)
        prepared_cand = prepare(file, options)
        same_start: list[dict[str, Any]] = []
        for k in range(repeat):
            weights = scratch / f"initial-{k}.pt"
            extras = Extras(save_initial_to=weights, seed=seed + k)
            base.reports.append(run_cold(prepared_base, None, None, extras))
            load = weights if weights.is_file() and weights.stat().st_size else None
            extras = Extras(load_initial_from=load, seed=seed + k)
            report = run_cold(prepared_cand, None, None, extras)
            cand.reports.append(report)
            same_start.append((report.data.get("training") or {}).get("same_start") or {})
        notes = {"baseline": baseline, "revision": is_revision, "same_start": same_start}
        if keep is not None:
            keep += [base.reports[0], cand.reports[0]]
        return compare(base, cand, notes)


# --- what changed ------------------------------------------------------------------------------


def _line_text(sources: ProjectSources, filename: Any, line: Any) -> str:
    return " ".join(sources.line(filename, line).split())


def finding_keys(side: Side, report: ReproReport) -> dict[tuple[str, str], Finding]:
    """Findings keyed by (code, the text of their line): line numbers move between versions."""
    sources = ProjectSources(side.root, allow=(str(side.file),))
    keyed: dict[tuple[str, str], Finding] = {}
    for item in report.data["findings"]:
        text = _line_text(sources, item["filename"], item["line"])
        keyed.setdefault((item["code"], text or str(item["line"])), item)
    return keyed


def _serious(items: dict[tuple[str, str], Finding]) -> set[tuple[str, str]]:
    return {key for key, item in items.items() if item["severity"] in SERIOUS}


def traced_lines(side: Side, report: ReproReport) -> dict[str, dict[str, Any]]:
    """The first output of each traced line, keyed by the line's text."""
    sources = ProjectSources(side.root, allow=(str(side.file),))
    found: dict[str, dict[str, Any]] = {}
    for line_record in report.data["lines"]:
        filename, line = line_record["filename"], line_record["line"]
        if os.path.realpath(filename) != os.path.realpath(side.file):
            continue
        text = _line_text(sources, filename, line) or str(line)
        entries = line_record["entries"]
        outputs: list[Summary] = (entries[-1].get("outputs") or [{}]) if entries else [{}]
        first = outputs[0]
        found.setdefault(
            text,
            {
                "line": line,
                "shape": first.get("shape"),
                "dtype": first.get("dtype"),
                "finite": not any(e.get("nonfinite_count") for e in entries),
            },
        )
    return found


def _losses(report: ReproReport) -> list[float | None]:
    return [item["value"] for item in (report.data.get("training") or {}).get("loss") or []]


def _first_nonfinite(side: Side, report: ReproReport) -> dict[str, Any] | None:
    first = next((f for f in report.data["findings"] if f["code"] == "TL901"), None)
    if first is None:
        return None
    sources = ProjectSources(side.root, allow=(str(side.file),))
    return {
        "line": first["line"],
        "text": _line_text(sources, first["filename"], first["line"]),
        "message": first["message"],
    }


def compare(base: Side, cand: Side, notes: dict[str, Any]) -> dict[str, Any]:
    """The comparison document (documented in docs/probe-report.md)."""
    b0, c0 = base.reports[0], cand.reports[0]
    base_found, cand_found = finding_keys(base, b0), finding_keys(cand, c0)
    fixed = sorted(_serious(base_found) - _serious(cand_found))
    introduced = sorted(_serious(cand_found) - _serious(base_found))
    stayed = sorted(set(base_found) & set(cand_found))
    base_lines, cand_lines = traced_lines(base, b0), traced_lines(cand, c0)
    changed = []
    for text, before in base_lines.items():
        after = cand_lines.get(text)
        if after is None:
            continue
        what = [key for key in ("shape", "dtype", "finite") if before[key] != after[key]]
        if what:
            changed.append({"text": text, "line": after["line"], "changed": what})
            changed[-1].update(baseline=before, candidate=after)
    base_layers = (b0.data.get("training") or {}).get("layers") or {}
    cand_layers = (c0.data.get("training") or {}).get("layers") or {}
    layers = {
        name: {"baseline": base_layers.get(name), "candidate": cand_layers.get(name)}
        for name in dict.fromkeys([*base_layers, *cand_layers])
    }

    def describe(items: list[tuple[str, str]], found: dict) -> list[dict[str, Any]]:
        return [
            {
                "code": key[0],
                "line_text": key[1],
                "line": found[key].get("line"),
                "message": found[key].get("message"),
            }
            for key in items
        ]

    result: dict[str, Any] = {
        "baseline": {
            "ref": notes["baseline"],
            # A revision's copy lives in a scratch folder that is gone by now: name it as git does.
            "file": (
                f"{notes['baseline']}:{cand.file.name}" if notes["revision"] else str(base.file)
            ),
        },
        "candidate": {"file": str(cand.file)},
        "repeat": len(base.reports),
        "same_start": notes["same_start"],
        "loss": {"baseline": _losses(b0), "candidate": _losses(c0)},
        "first_nonfinite": {
            "baseline": _first_nonfinite(base, b0),
            "candidate": _first_nonfinite(cand, c0),
        },
        "layers": layers,
        "findings": {
            "fixed": describe(fixed, base_found),
            "introduced": describe(introduced, cand_found),
            "stayed": describe(stayed, cand_found),
        },
        "changed_lines": changed,
    }
    if len(base.reports) > 1:
        result["runs"] = {side.label: _counts(side) for side in (base, cand)}
    # Every warning/error of the candidate is either one the baseline had (not removed) or a
    # new one (added): the candidate passes only with none left.
    result["exit_status"] = 1 if _serious(cand_found) else 0
    return result


def _counts(side: Side) -> dict[str, Any]:
    nan = sum(1 for r in side.reports if any(f["code"] == "TL901" for f in r.data["findings"]))
    finals = [loss[-1] for r in side.reports if (loss := _losses(r)) and loss[-1] is not None]
    return {
        "runs": len(side.reports),
        "nonfinite": nan,
        "serious": sum(
            1 for r in side.reports if any(f["severity"] in SERIOUS for f in r.data["findings"])
        ),
        "final_loss": {"min": min(finals), "max": max(finals)} if finals else None,
    }


# --- text ----------------------------------------------------------------------------------------


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, int | float) else "non-finite"


def render(result: dict[str, Any]) -> str:
    lines = [
        f"torchls repro --compare {result['baseline']['ref']}: baseline "
        f"{result['baseline']['file']} vs candidate {result['candidate']['file']}"
    ]
    start = result["same_start"][0] if result["same_start"] else {}
    if start.get("tensors"):
        lines.append(
            f"same start: {start.get('matched')} of {start.get('tensors')} weight tensors "
            "copied from the baseline"
        )
    base_loss, cand_loss = result["loss"]["baseline"], result["loss"]["candidate"]
    if base_loss or cand_loss:
        lines.append("loss per step:      baseline     candidate")
        for step in range(max(len(base_loss), len(cand_loss))):
            b = _number(base_loss[step]) if step < len(base_loss) else "—"
            c = _number(cand_loss[step]) if step < len(cand_loss) else "—"
            lines.append(f"  step {step + 1:<3}        {b:>12}  {c:>12}")
    for label in ("baseline", "candidate"):
        first = result["first_nonfinite"][label]
        where = f"line {first['line']}: {first['text']}" if first else "none"
        lines.append(f"first non-finite ({label}): {where}")
    findings = result["findings"]
    for kind in ("fixed", "introduced", "stayed"):
        for item in findings[kind]:
            lines.append(f"{kind}: {item['code']} line {item['line']}: {item['message']}")
    for item in result["changed_lines"]:
        what = ", ".join(item["changed"])
        lines.append(f"changed ({what}): line {item['line']}: {item['text']}")
    runs = result.get("runs")
    if runs:
        b, c = runs["baseline"], runs["candidate"]
        lines.append(
            f"NaN/Inf in {b['nonfinite']} of {b['runs']} baseline runs, "
            f"{c['nonfinite']} of {c['runs']} candidate runs"
        )
        for label, counts in (("baseline", b), ("candidate", c)):
            spread = counts["final_loss"]
            if spread:
                lines.append(
                    f"final loss ({label}): {_number(spread['min'])} .. {_number(spread['max'])}"
                )
    verdict = (
        "the candidate fixes the baseline's problems and adds none"
        if (result["exit_status"] == 0)
        else "the candidate keeps or adds warning/error findings"
    )
    lines.append(verdict)
    return "\n".join(lines) + "\n"
