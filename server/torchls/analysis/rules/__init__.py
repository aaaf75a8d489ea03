"""The rule catalog. Importing this package registers every rule (one module per code family)."""

from torchls.analysis.rules import checkpoints, losses, modes  # noqa: F401
