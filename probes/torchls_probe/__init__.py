"""torchls_probe: the bounded, traced repro that runs inside the user's own interpreter.

It is started by `torchls.probe` (never imported by it) as `python -m torchls_probe`, reads a
JSON request, runs the user's script or training step under a tracer for a few steps and writes
a JSON report. It needs only the standard library and torch, so it works in any environment that
can train the user's model, and it never imports torchls.
"""

__version__ = "0.1.0"

# Bumped whenever a report field changes meaning or disappears (docs/probe-report.md).
SCHEMA_VERSION = 2
