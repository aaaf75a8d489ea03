"""The rule catalog. Importing this package registers every rule (one module per code family)."""

from torchls.analysis.rules import (  # noqa: F401
    autograd,
    checkpoints,
    distributed,
    keras,
    lightning,
    losses,
    modes,
    numerics,
    optimization,
    shapes,
)
