"""`python -m torchls ...`: how editors start the server with a chosen interpreter."""

from torchls.cli import main

raise SystemExit(main())
