"""Allows `python -m torchls ...` (what editors use to start the server with a chosen interpreter)."""

from torchls.cli import main

raise SystemExit(main())
