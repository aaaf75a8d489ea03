"""The `torchls` command line: `check`, `rule`, `server`.

(Minimal entry point; the full checker is being built.)
"""

from __future__ import annotations

import argparse
import sys

from torchls import __version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="torchls")
    parser.add_argument("--version", action="version", version=f"torchls {__version__}")
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("server", help="run the language server on stdio")
    args = parser.parse_args(argv)
    if args.command == "server":
        from torchls.lsp import start_stdio

        start_stdio()
        return 0
    parser.print_help(sys.stderr)
    return 2
