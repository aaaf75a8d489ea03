"""A stand-in for torchvision, for the real-script bench only (bench/real_scripts.py).

The torchvision wheels on these machines do not match the CPU torch, and the real scripts would
download their datasets. This package offers the few names those scripts use: datasets that
yield random tensors of the real shapes and label ranges, transforms that keep shapes as the
real ones do, and `utils.save_image` writing a small placeholder file. Never used by torchls.
"""

from torchvision import datasets, transforms, utils

__version__ = "0.0+bench-stub"
__all__ = ["datasets", "transforms", "utils"]
