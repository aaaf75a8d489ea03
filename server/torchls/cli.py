"""The `torchls` command line: `check`, `rule`, `repro`, `server`, `--version`.

In: argv. Out: text or JSON on stdout, problems on stderr, and an exit code users script
against: 0 clean, 1 findings, 2 usage error or a file that could not be read (the others are
still reported). Parsing options and choosing exit codes lives here; finding and checking files
is `torchls.checker`, rendering is `torchls.output`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from torchls import __version__, inspect_cli, output, repro_cli
from torchls.analysis import get_rule
from torchls.analysis.catalog import documented_rules, rule_by_name
from torchls.checker import (
    CheckOptions,
    ConfigResolver,
    FileReport,
    check_paths,
    check_stdin,
    closest_rule,
    config_warnings,
    discover,
    selector_problem,
    unknown_selectors,
    with_parse_failures,
)
from torchls.config import ConfigError

EXIT_CLEAN = 0
EXIT_FINDINGS = 1
EXIT_ERROR = 2

OUTPUT_FORMATS = ("text", "json", "sarif", "github")


class UsageError(Exception):
    """A problem with what the user asked for; printed as `torchls: error: ...`, exit 2."""


def run() -> None:
    """The `torchls` command (and `python -m torchls`): `main`, and out with its status. A
    check's process ends as soon as its output is written: the syntax trees and facts it
    built are left to the system to reclaim rather than freed object by object (as mypy
    does too), which is a part of every `torchls check` a pre-commit hook or CI job runs."""
    arguments = sys.argv[1:]
    code = main(arguments)
    if arguments[:1] == ["check"]:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BrokenPipeError:
            pass  # the reader went away (`torchls check | head`); the status still stands
        os._exit(code)
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(arguments[0] if arguments else None)
    args = parser.parse_args(arguments)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    try:
        return args.handler(args)
    except UsageError as error:
        _error(str(error))
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130  # the shell convention for "stopped by Ctrl-C"
    except BrokenPipeError:
        # `torchls check | head`: the reader went away. Point stdout at /dev/null so the
        # interpreter's final flush does not raise a second time.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_ERROR


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; with `command` one of the commands, only that command's
    (what a run of it parses identically, built in a fraction of the time: every `torchls
    check` process builds one). Any other word gets all of them, so help and the error for
    a mistyped command list every command."""
    parser = _Parser(
        prog="torchls",
        description="Find the bugs that make PyTorch training silently wrong.",
    )
    parser.add_argument("--version", action="version", version=f"torchls {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    adders = {
        "check": _add_check,
        "rule": _add_rule,
        "repro": repro_cli.add_parser,
        "inspect": inspect_cli.add_parser,
        "server": _add_server,
    }
    for name, add in adders.items():
        if command not in adders or command == name:
            add(commands)
    return parser


class _Formatter(argparse.HelpFormatter):
    """argparse's own help layout, told the terminal's width as `shutil` would find it.
    argparse imports `shutil` (and the compression modules it pulls in) to ask, in every
    parser it builds, help or not: a few milliseconds of every torchls process."""

    def __init__(
        self,
        prog: str,
        indent_increment: int = 2,
        max_help_position: int = 24,
        width: int | None = None,
    ) -> None:
        if width is None:
            width = _terminal_columns() - 2  # what argparse subtracts from shutil's answer
        super().__init__(prog, indent_increment, max_help_position, width)


class _Parser(argparse.ArgumentParser):
    """An `ArgumentParser` laid out by `_Formatter` (its subcommands' parsers too)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)


def _terminal_columns() -> int:
    """`shutil.get_terminal_size().columns`: $COLUMNS, else the terminal of stdout, else 80."""
    try:
        columns = int(os.environ.get("COLUMNS", 0))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


def _add_server(commands: argparse._SubParsersAction) -> None:
    server = commands.add_parser("server", help="run the language server on stdio")
    # vscode-languageclient appends --stdio for the stdio transport; stdio is all we speak.
    server.add_argument("--stdio", action="store_true", help=argparse.SUPPRESS)
    server.set_defaults(handler=run_server)


def _add_check(commands: argparse._SubParsersAction) -> None:
    check = commands.add_parser(
        "check",
        help="check files or folders",
        description="Check Python files for PyTorch training bugs. "
        "Exit status: 0 clean, 1 findings, 2 usage error or unreadable file. "
        "Files are analysed in parallel, and results are cached in .torchls_cache/ beside "
        "the nearest pyproject.toml: an unchanged file whose imported project modules and "
        "configuration are unchanged too is not analysed again.",
    )
    check.add_argument("paths", nargs="*", metavar="PATH", help="files or folders ('-' = stdin)")
    check.add_argument("--output-format", choices=OUTPUT_FORMATS, default="text")
    for flag, what in (
        ("--select", "enable only these codes or prefixes (replaces the config's select)"),
        ("--ignore", "disable these codes or prefixes"),
        ("--extend-select", "enable these codes or prefixes in addition"),
    ):
        check.add_argument(flag, action="append", metavar="CODES", help=f"{what}; comma list")
    check.add_argument("--fix", action="store_true", help="apply safe fixes, rewriting files")
    check.add_argument(
        "--unsafe-fixes",
        action="store_true",
        help="with --fix also apply unsafe fixes; alone, show them as fixable",
    )
    check.add_argument("--exit-zero", action="store_true", help="exit 0 even with findings")
    check.add_argument(
        "--force-exclude",
        action="store_true",
        help="skip excluded and git-ignored files even when named explicitly (for pre-commit)",
    )
    check.add_argument("--statistics", action="store_true", help="show counts per rule")
    check.add_argument("--config", type=Path, metavar="PYPROJECT", help="use this pyproject.toml")
    check.add_argument(
        "--no-cache",
        action="store_true",
        help="analyse every file, neither reading nor writing the result cache "
        "(.torchls_cache/ beside the nearest pyproject.toml)",
    )
    check.add_argument(
        "--cache-dir", type=Path, metavar="DIR", help="keep the result cache in DIR instead"
    )
    check.add_argument(
        "--jobs",
        "-j",
        type=_positive_int,
        metavar="N",
        help="analyse in N worker processes (default: one per core when there is enough "
        "to analyse, else none; 1: no workers)",
    )
    check.add_argument("--stdin-filename", metavar="PATH", help="the name of the file on stdin")
    _add_color(check)
    check.set_defaults(handler=run_check)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _add_rule(commands: argparse._SubParsersAction) -> None:
    rule = commands.add_parser("rule", help="explain a rule, or list them all")
    rule.add_argument("code", nargs="?", help="a rule code (TL101) or name")
    rule.add_argument("--all", action="store_true", help="list every rule")
    rule.add_argument("--output-format", choices=("text", "json"), default="text")
    _add_color(rule)
    rule.set_defaults(handler=run_rule)


def _add_color(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour output (auto: when stdout is a terminal and NO_COLOR is unset)",
    )


# --- check -----------------------------------------------------------------------------------


def _workspace_root(args: argparse.Namespace) -> Path:
    """The project root for cross-file resolution: the folder of the nearest pyproject.toml
    (or of `--config`), else the current directory."""
    if getattr(args, "config", None):
        return Path(args.config).resolve().parent
    start = Path(args.paths[0]) if getattr(args, "paths", None) else Path.cwd()
    for folder in (start.resolve(), *start.resolve().parents):
        if (folder / "pyproject.toml").is_file() or (folder / ".git").exists():
            return folder
    return Path.cwd()


def run_check(args: argparse.Namespace) -> int:
    options = CheckOptions(
        select=_codes(args.select),
        ignore=_codes(args.ignore) or (),
        extend_select=_codes(args.extend_select) or (),
        fix=args.fix,
        unsafe_fixes=args.unsafe_fixes,
        root=_workspace_root(args),
        cache=not args.no_cache,
        cache_dir=args.cache_dir,
        config=args.config,
        jobs=args.jobs,
    )
    for flag, codes in (
        ("--select", options.select),
        ("--ignore", options.ignore),
        ("--extend-select", options.extend_select),
    ):
        _reject_unknown(flag, unknown_selectors(codes or ()))
    # Like ruff, --stdin-filename without paths means "read stdin".
    paths = args.paths or (["-"] if args.stdin_filename else ["."])
    if "-" in paths and len(paths) > 1:
        raise UsageError("'-' (stdin) cannot be combined with other paths")
    try:
        resolver = ConfigResolver(args.config)
        reports, failed = _collect(paths, args, resolver, options)
        _warn_config(resolver)
    except ConfigError as error:
        raise UsageError(str(error)) from None
    stdout: TextIO = sys.stdout
    if paths == ["-"] and args.fix:
        # Like ruff: the fixed source goes to stdout, the report to stderr.
        stdout = sys.stderr
        sys.stdout.write(reports[0].fixed_text or "")
    _report_problems(reports)
    # A syntax error is an error finding (TL000) in every format, so JSON, SARIF and GitHub
    # readers see it too and the exit status is 1: like any finding, not like an unreadable file
    # (2), since the parseable rest of the file was checked and --exit-zero applies to it.
    checked = [with_parse_failures(r) for r in reports if r.error is None]
    style = output.Style(_use_colour(args.color, stdout))
    incomplete = failed or any(r.error for r in reports)
    stdout.write(_render(checked, args, style, incomplete))
    findings = sum(len(r.findings) for r in checked)
    if incomplete:
        return EXIT_ERROR
    return EXIT_FINDINGS if findings and not args.exit_zero else EXIT_CLEAN


def _collect(
    paths: list[str], args: argparse.Namespace, resolver: ConfigResolver, options: CheckOptions
) -> tuple[list[FileReport], bool]:
    """Check everything named; returns the reports and whether any path was missing."""
    if paths == ["-"]:
        data = sys.stdin.buffer.read()
        return [check_stdin(data, args.stdin_filename, resolver, options)], False
    found = discover(paths, resolver, force_exclude=args.force_exclude)
    for missing in found.missing:
        _error(f"path not found: {missing}")
    if not found.files and not found.missing and not found.unreadable and not args.force_exclude:
        _warn("no Python files found under the given paths")
    progress = _Progress.on(sys.stderr, len(found.files))
    checked = check_paths(found.files, resolver, options, progress)
    if progress is not None:
        progress.clear()
    reports = [*found.unreadable, *checked]
    # One order whatever order the paths were given in, so outputs diff cleanly between runs.
    reports.sort(key=lambda report: report.display)
    return reports, bool(found.missing)


class _Progress:
    """`checked 120/400 files` on one rewritten stderr line, for people watching a terminal.

    Only when stderr is a terminal and the tree is large: logs and CI output stay clean.
    """

    MIN_FILES = 20
    UPDATES = 100  # at most this many redraws, so huge trees don't pay for the printing

    def __init__(self, stream: TextIO, total: int) -> None:
        self.stream = stream
        self.every = max(1, total // self.UPDATES)
        self.width = 0

    @classmethod
    def on(cls, stream: TextIO, total: int) -> _Progress | None:
        isatty = getattr(stream, "isatty", None)
        if total < cls.MIN_FILES or isatty is None or not isatty():
            return None
        return cls(stream, total)

    def __call__(self, done: int, total: int) -> None:
        if done % self.every and done != total:
            return
        text = f"checked {done}/{total} files"
        self.width = max(self.width, len(text))
        self.stream.write(f"\r{text}")
        self.stream.flush()

    def clear(self) -> None:
        """Blank the line so the report (or the shell prompt) starts on a clean one."""
        self.stream.write("\r" + " " * self.width + "\r")
        self.stream.flush()


def _warn_config(resolver: ConfigResolver) -> None:
    """Report unknown codes in each config file that was used, once per file."""
    for config in resolver.configs():
        for line in config_warnings(config):
            print(line, file=sys.stderr)


def _render(
    reports: list[FileReport], args: argparse.Namespace, style: output.Style, incomplete: bool
) -> str:
    unsafe = args.unsafe_fixes
    if args.statistics:
        stats = output.statistics(reports, unsafe)
        if args.output_format == "json":
            return output.json_statistics(stats)
        body = output.text_statistics(stats, style)
        return body + output.text_summary(reports, args.fix, unsafe, style, incomplete)
    if args.output_format == "json":
        return output.json_findings(reports)
    if args.output_format == "sarif":
        return output.sarif_findings(reports)
    if args.output_format == "github":
        return output.github_findings(reports)
    body = output.text_findings(reports, unsafe, style)
    return body + output.text_summary(reports, args.fix, unsafe, style, incomplete)


def _report_problems(reports: list[FileReport]) -> None:
    """Unreadable files, syntax errors and fix trouble, on stderr so stdout stays parseable."""
    for report in reports:
        if report.error is not None:
            print(f"{report.display}: error: {report.error}", file=sys.stderr)
            continue
        for problem in report.syntax_errors[:1]:
            rest = (
                "the file could not be parsed, nothing was checked"
                if report.nothing_parsed
                else "rest of the file was still checked"
            )
            print(
                f"{report.display}:{problem.row}:{problem.column + 1}: error: "
                f"syntax error: {problem.message} ({rest})",
                file=sys.stderr,
            )
        for note in report.notes:
            print(f"{report.display}: warning: {note}", file=sys.stderr)


def _codes(values: list[str] | None) -> tuple[str, ...] | None:
    """`--select TL1,TL2 --select TL3` → ("TL1", "TL2", "TL3"); None when not given."""
    if values is None:
        return None
    return tuple(code.strip() for value in values for code in value.split(",") if code.strip())


def _reject_unknown(flag: str, unknown: list[str]) -> None:
    if unknown:
        raise UsageError(selector_problem(unknown[0], flag))


# --- rule ------------------------------------------------------------------------------------


def run_rule(args: argparse.Namespace) -> int:
    style = output.Style(_use_colour(args.color, sys.stdout))
    if args.all:
        if args.code:
            raise UsageError("give either a rule code or --all, not both")
        rules = documented_rules()
        if args.output_format == "json":
            sys.stdout.write(output.dumps([output.rule_json(r) for r in rules]))
        else:
            sys.stdout.write(output.rules_table(rules, style))
        return EXIT_CLEAN
    if not args.code:
        raise UsageError("give a rule code (torchls rule TL101) or --all")
    rule = get_rule(args.code) or rule_by_name(args.code)
    if rule is None:
        raise UsageError(f"unknown rule {args.code!r}{closest_rule(args.code, documented_rules())}")
    if args.output_format == "json":
        sys.stdout.write(output.dumps(output.rule_json(rule)))
    else:
        sys.stdout.write(output.rule_doc(rule, style))
    return EXIT_CLEAN


# --- server ----------------------------------------------------------------------------------


SERVER_ALLOCATOR = {"PYTHONMALLOC": "malloc", "MALLOC_ARENA_MAX": "2"}
"""How the language server runs on Linux (see `use_system_allocator`)."""
_ALLOCATOR_MARK = "TORCHLS_SERVER_ALLOCATOR"


def run_server(args: argparse.Namespace) -> int:
    use_system_allocator()
    # Imported lazily: pygls is heavy and `check` must not pay for it.
    from torchls.lsp import start_stdio

    return start_stdio()


def use_system_allocator() -> None:
    """On Linux, start the server over again (same process, `exec`) on the C library's
    allocator. Python's own allocator hands memory back only in whole 1 MiB arenas, and a
    few objects that outlive an analysis keep most arenas of a large session: with 200 real
    files closed, the server stayed at about 2.8x its starting size. glibc's allocator gives
    every free page back when the server trims after closes (`release_memory`), at no
    measurable cost to the analysis (bench/memory_soak.py). Two malloc arenas: the server
    has two busy threads, more arenas only scatter the heap. A user's own PYTHONMALLOC is
    left alone; the settings are taken out of the environment once in force, so nothing the
    server starts (the repro, jedi) inherits them."""
    if os.environ.pop(_ALLOCATOR_MARK, None) is not None:
        for name in SERVER_ALLOCATOR:
            os.environ.pop(name, None)
        return
    if not sys.platform.startswith("linux") or "PYTHONMALLOC" in os.environ:
        return
    if not sys.executable or len(sys.orig_argv) < 2:
        return
    env = {**os.environ, **SERVER_ALLOCATOR, _ALLOCATOR_MARK: "1"}
    # The very command line this interpreter was started with (its flags, `-m torchls` or
    # the console script), so the server starts over exactly as the editor started it.
    argv = [sys.executable, *sys.orig_argv[1:]]
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, argv, env)
    except OSError:
        return  # could not start over: serve on Python's allocator


# --- helpers ---------------------------------------------------------------------------------


def _use_colour(choice: str, stream: TextIO) -> bool:
    if choice != "auto":
        return choice == "always"
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    return hasattr(stream, "isatty") and stream.isatty()


def _error(message: str) -> None:
    print(f"torchls: error: {message}", file=sys.stderr)


def _warn(message: str) -> None:
    print(f"torchls: warning: {message}", file=sys.stderr)
