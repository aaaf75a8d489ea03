"""`python -m torchls ...`: how editors start the server with a chosen interpreter."""

from torchls.cli import run

run()
