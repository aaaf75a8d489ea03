"""The bench's gymnasium stand-in under the older package name (scripts that `import gym` and
use the new step API, as minimalRL does). Never used by torchls."""

from gymnasium import __version__, make

__all__ = ["__version__", "make"]
