"""`torchls repro FILE`: run a bounded, sandboxed repro and print its report.

In: the parsed `repro` arguments. Out: the report as text or JSON on stdout, problems on stderr,
and an exit status: 0 the repro ran and found nothing, 1 findings (including a run that raised,
timed out, ran out of memory or crashed: those are TL905/TL906 findings), 2 usage error or a
repro that could not run at all (missing file, bad spec, no interpreter, torch not importable
there, device unavailable, a bubblewrap installed but failing: the sandbox refuses), 130
interrupted. Kept apart from cli.py so that `check` never loads the probe machinery.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the probe's modules are imported when a repro runs, not at start-up
    from torchls.probe.document import Report
from torchls.config import DEFAULT_MEMORY_MB, DEFAULT_STEPS, DEFAULT_TIMEOUT_S, DEVICE_CHOICES

EXIT_CLEAN = 0
EXIT_FINDINGS = 1
EXIT_ERROR = 2


def add_parser(commands: argparse._SubParsersAction) -> None:
    repro = commands.add_parser(
        "repro",
        help="run a bounded, sandboxed repro of a training script",
        description="Run FILE (or the functions named in --spec) for a few optimizer steps in "
        "a sandboxed interpreter, tracing tensors back to your lines. Exit status: 0 no "
        "findings, 1 findings, 2 usage error or the repro could not run.",
    )
    repro.add_argument("file", metavar="FILE", help="the training script")
    # One quoted string: argparse cannot pass `-- ARGS` through a subcommand. A value that
    # starts with a dash (`--args '--fast'`) is joined to the flag before argparse sees it.
    repro.add_argument(
        "--args",
        default=None,
        metavar="'ARGS'",
        help="arguments for the script, e.g. '--lr 0.1' (default: [tool.torchls.probe] args)",
    )
    parse = repro.parse_known_args

    def parse_known_args(args=None, namespace=None):
        return parse(join_dashed_values(args), namespace)

    repro.parse_known_args = parse_known_args
    repro.add_argument("--device", help=f"{DEVICE_CHOICES} (default auto)")
    repro.add_argument(
        "--steps", type=int, help=f"optimizer steps before stopping (default {DEFAULT_STEPS})"
    )
    repro.add_argument("--batches", type=int, help="DataLoader batches before stopping (= steps)")
    repro.add_argument(
        "--timeout", type=float, help=f"wall-clock seconds (default {DEFAULT_TIMEOUT_S:g})"
    )
    repro.add_argument(
        "--memory", type=int, help=f"memory limit in MB (default {DEFAULT_MEMORY_MB})"
    )
    repro.add_argument("--python", help="interpreter with your torch (default: the project venv)")
    repro.add_argument("--spec", help="YAML repro spec naming setup and step functions")
    repro.add_argument(
        "--allow-fallback",
        action="store_true",
        default=None,
        help="run on the CPU when the requested device is unavailable",
    )
    repro.add_argument("--seed", type=int, help="seed for every RNG (default 0)")
    repro.add_argument(
        "--root", help="project root: lines under it are yours (default: FILE's folder)"
    )
    repro.add_argument(
        "--cwd",
        help="the folder the script runs from (default: where you launched torchls); seen "
        "through the project's copy",
    )
    repro.add_argument(
        "--writable",
        action="append",
        default=[],
        metavar="FOLDER",
        help="also let the run write in FOLDER, seen through a copy (nothing reaches FOLDER); "
        "repeatable",
    )
    repro.add_argument(
        "--keep-outputs",
        metavar="DIR",
        help="copy the files the run wrote (listed in the report) into DIR afterwards",
    )
    repro.add_argument(
        "--network",
        action="store_true",
        help="let the run reach the network (off by default; never for code you do not trust)",
    )
    repro.add_argument(
        "--sandbox",
        choices=("auto", "bwrap", "none"),
        default="auto",
        help="auto: bubblewrap when installed (installed but failing: the run is refused), "
        "else limits only, said on every run; bwrap: require it; none: limits only",
    )
    repro.add_argument(
        "--nproc",
        type=int,
        metavar="N",
        help="run the script under torchrun on N ranks (python -m torch.distributed.run "
        "--standalone --nproc-per-node N), every rank in the sandbox; finds collective hangs "
        "(TL908), rank divergence (TL909) and duplicated data (TL910)",
    )
    repro.add_argument(
        "--nnodes",
        help="with --nproc: passed to torchrun for a run across machines (with --rdzv-endpoint; "
        "an endpoint on another machine needs --network)",
    )
    repro.add_argument(
        "--rdzv-endpoint",
        metavar="HOST:PORT",
        help="with --nproc: torchrun's c10d rendezvous endpoint instead of --standalone",
    )
    repro.add_argument(
        "--collective-timeout",
        type=float,
        metavar="S",
        help="with --nproc: seconds a rank may wait in a collective that not every rank "
        "reached before it is reported as a hang (default 5)",
    )
    repro.add_argument("--output-format", choices=("text", "json"), default="text")
    repro.add_argument(
        "--compare",
        metavar="BASELINE",
        help="compare with BASELINE (a git revision of the project, e.g. HEAD, or another "
        "file) on the same bounded run: exit 0 when this version removes the baseline's "
        "warning/error findings and adds none",
    )
    repro.add_argument(
        "--repeat", type=int, default=1, metavar="K", help="with --compare: K seeds per side"
    )
    repro.add_argument(
        "--report",
        metavar="HTML",
        help="also write a self-contained HTML report with charts (gradient flow, activations, "
        "loss per step) to HTML",
    )
    repro.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from torchls.config import ConfigError, load_config
    from torchls.probe import ReproOptions, ReproUsageError, run_repro, untrusted
    from torchls.probe.options import with_project
    from torchls.probe.text import render

    options = ReproOptions(
        device=args.device,
        steps=args.steps,
        batches=args.batches,
        timeout_s=args.timeout,
        memory_mb=args.memory,
        python=args.python,
        spec=args.spec,
        allow_fallback=args.allow_fallback,
        seed=args.seed,
        root=args.root,
        argv=tuple(shlex.split(args.args)) if args.args is not None else (),
        cwd=args.cwd,
        writable=tuple(args.writable),
        network=args.network,
        keep_outputs=args.keep_outputs,
        sandbox=args.sandbox,
        nproc=args.nproc,
        nnodes=args.nnodes,
        rdzv_endpoint=args.rdzv_endpoint,
        collective_timeout_s=args.collective_timeout,
        command=" ".join(["torchls", *sys.argv[1:]]) if sys.argv[1:2] == ["repro"] else None,
    )
    try:
        # [tool.torchls.probe] of the script's project fills what the flags leave unset.
        options = with_project(options, load_config(args.file).probe)
    except (ConfigError, OSError) as error:
        print(f"torchls: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    options = _launch_folder(options)
    if args.compare:
        return _compare(args, options)
    progress = _progress if args.output_format == "text" and sys.stderr.isatty() else None
    try:
        report = run_repro(args.file, options, on_progress=progress)
    except ReproUsageError as error:
        print(f"torchls: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    if progress is not None:
        sys.stderr.write("\r\x1b[K")
    weaker = sandbox_line(report.data)
    if args.output_format == "json":
        sys.stdout.write(report.to_json() + "\n")
    else:
        # Fewer protections than the full set is the first thing the report says.
        sys.stdout.write((f"torchls: {weaker}\n" if weaker else "") + render(report))
    if args.report:
        from torchls.probe.html_report import render_html

        if not _write_report(args.report, render_html(report)):
            return EXIT_ERROR
    if weaker:  # on every run, also when stdout goes to a file or another program
        print(f"torchls: warning: {weaker}", file=sys.stderr)
    if report.setup_error is not None:
        print(f"torchls: error: {untrusted.terminal(report.setup_error)}", file=sys.stderr)
        return EXIT_ERROR
    # Information (a warning Python printed, advice) never fails a CI gate.
    serious = [f for f in report.findings if f.severity in ("error", "warning")]
    return EXIT_FINDINGS if serious else EXIT_CLEAN


def sandbox_line(data: Report) -> str | None:
    """The report's line naming the active and missing protections (None: all held)."""
    from torchls.probe import untrusted
    from torchls.probe.sandbox import protections_line

    sandbox = data.get("sandbox")
    if sandbox is None:
        return None
    line = sandbox.get("summary") or protections_line(sandbox["layers"])
    return untrusted.one_line(line, 2000) if line else None


def join_dashed_values(args: list[str] | None) -> list[str] | None:
    """`--args --fast` as `--args=--fast`: argparse would take `--fast` for a flag of ours."""
    if args is None:
        return None
    joined: list[str] = []
    pending = False
    for token in args:
        if pending:
            joined[-1] = f"--args={token}"
            pending = False
            continue
        joined.append(token)
        pending = token == "--args"
    return joined


def _launch_folder(options: object) -> object:
    """The script runs from where torchls was launched, unless --cwd or [tool.torchls.probe]
    say otherwise; a launch folder the sandbox cannot show (a home folder) gives the root."""
    import os
    from pathlib import Path

    from torchls.probe.prepare import unfit_folder
    from torchls.records import replace

    if getattr(options, "cwd", None) is not None:
        return options
    here = Path(os.getcwd())
    problem = unfit_folder(here)
    if problem is not None:
        note = f"torchls: note: running from the project root, not {here}: {problem}"
        print(note, file=sys.stderr)
        return options
    return replace(options, cwd=str(here))


def _write_report(path: str, page: str) -> bool:
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(page)
    except OSError as error:
        print(f"torchls: error: cannot write {path}: {error.strerror}", file=sys.stderr)
        return False
    print(f"torchls: HTML report written to {path}", file=sys.stderr)
    return True


def _compare(args: argparse.Namespace, options: object) -> int:
    import json
    from pathlib import Path

    from torchls import compare
    from torchls.probe import ReproUsageError, untrusted

    kept: list = []
    try:
        result = compare.run_compare(Path(args.file), args.compare, options, args.repeat, kept)
    except ReproUsageError as error:
        print(f"torchls: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    if args.report and kept:
        from torchls.probe.html_report import render_html

        page = render_html(
            kept[1], title="torchls repro --compare", other=("baseline", kept[0]), comparison=result
        )
        if not _write_report(args.report, page):
            return EXIT_ERROR
    if args.output_format == "json":
        sys.stdout.write(json.dumps(result, indent=2, default=str) + "\n")
    else:
        sys.stdout.write(untrusted.terminal(compare.render(result)))
    return int(result["exit_status"])


def _progress(event: object) -> None:
    message = getattr(event, "message", "")
    sys.stderr.write(f"\r\x1b[K{message}")
    sys.stderr.flush()
