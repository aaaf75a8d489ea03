"""`python -m torchls_probe`: run one bounded, traced repro and write its JSON report.

In: `--request FILE` (JSON, see request.py; `-` reads stdin), or for a person trying it by
hand `python -m torchls_probe train.py [--steps N] [--device D] [--out report.json]`.
`--progress stdout` turns the original stdout into the progress channel (one JSON line per
event) before the user's output is redirected. Out: the report file (or stdout without --out)
and exit status 0 when a report was written, 2 for a bad request, 3 when no report could be.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    parser = argparse.ArgumentParser(prog="python -m torchls_probe")
    parser.add_argument("file", nargs="?", help="script to run (instead of --request)")
    parser.add_argument("--request", help="JSON request file, '-' for stdin")
    parser.add_argument("--progress", choices=("none", "stdout"), default="none")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--out", help="report file (default: stdout)")
    args = parser.parse_args(argv)

    from torchls_probe.progress import Progress
    from torchls_probe.request import RequestError, parse_request

    try:
        if args.request:
            if args.request == "-":
                data = json.load(sys.stdin)
            else:
                with open(args.request, encoding="utf-8") as handle:
                    data = json.load(handle)
        elif args.file:
            path = os.path.abspath(args.file)
            data = {
                "file": path,
                "root": os.path.dirname(path),
                "steps": args.steps,
                "device": args.device,
                "timeout_s": args.timeout,
                "out": args.out,
                "command": " ".join(["python -m torchls_probe", *(argv or sys.argv[1:])]),
            }
        else:
            parser.error("give a script or --request FILE")
        request = parse_request(data)
    except (OSError, ValueError, RequestError) as error:
        print(f"torchls_probe: error: {error}", file=sys.stderr)
        return 2
    channel = os.dup(1) if args.progress == "stdout" else None
    if channel is not None and request.output_file is None:
        # Without an output file the user's prints would corrupt the progress channel.
        request.output_file = os.devnull
    progress = Progress(channel)

    from torchls_probe.runner import run

    return run(request, progress, started)


if __name__ == "__main__":
    code = main()
    for stream in (sys.stdout, sys.__stdout__):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    # os._exit: user threads or atexit handlers must not keep a finished probe alive.
    os._exit(code)
