"""Transforms that act on `[C, H, W]` float tensors the way the real ones act on pictures.

`ToTensor` passes tensors through (the stub datasets already yield them); resizing, cropping,
padding and flipping change the tensor as the real transforms change the picture, so every
shape downstream is the real one; `Normalize` is the real arithmetic.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F


def _pair(size: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(size, int):
        return size, size
    return int(size[0]), int(size[-1])


class Compose:
    def __init__(self, transforms: Sequence[Callable[[Any], Any]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, image: Any) -> Any:
        for transform in self.transforms:
            image = transform(image)
        return image


class ToTensor:
    def __call__(self, image: Any) -> torch.Tensor:
        tensor = torch.as_tensor(image)
        if not tensor.is_floating_point():
            tensor = tensor.float() / 255
        return tensor


class Normalize:
    def __init__(self, mean: Sequence[float], std: Sequence[float], inplace: bool = False) -> None:
        self.mean = torch.tensor(list(mean)).view(-1, 1, 1)
        self.std = torch.tensor(list(std)).view(-1, 1, 1)

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        return (tensor - self.mean) / self.std


class Resize:
    def __init__(self, size: int | Sequence[int], **_: Any) -> None:
        self.size = size

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        height, width = tensor.shape[-2:]
        if isinstance(self.size, int):  # the shorter side becomes `size`, as torchvision does
            scale = self.size / min(height, width)
            target = (round(height * scale), round(width * scale))
        else:
            target = _pair(self.size)
        if target == (height, width):
            return tensor
        return F.interpolate(tensor[None], size=target, mode="bilinear", align_corners=False)[0]


class CenterCrop:
    def __init__(self, size: int | Sequence[int]) -> None:
        self.size = _pair(size)

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        height, width = tensor.shape[-2:]
        top, left = (height - self.size[0]) // 2, (width - self.size[1]) // 2
        return tensor[..., top : top + self.size[0], left : left + self.size[1]]


class Pad:
    def __init__(self, padding: int, fill: float = 0, **_: Any) -> None:
        self.padding = padding
        self.fill = fill

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        p = self.padding
        return F.pad(tensor, (p, p, p, p), value=self.fill)


class RandomCrop:
    def __init__(self, size: int | Sequence[int], padding: int | None = None, **_: Any) -> None:
        self.size = _pair(size)
        self.padding = padding

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.padding:
            tensor = Pad(self.padding)(tensor)
        height, width = tensor.shape[-2:]
        top = random.randint(0, height - self.size[0])
        left = random.randint(0, width - self.size[1])
        return tensor[..., top : top + self.size[0], left : left + self.size[1]]


class RandomHorizontalFlip:
    def __init__(self, p: float = 0.5) -> None:
        self.p = p

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.flip(-1) if random.random() < self.p else tensor


class Grayscale:
    def __init__(self, num_output_channels: int = 1) -> None:
        self.channels = num_output_channels

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        grey = tensor.mean(dim=0, keepdim=True)
        return grey.expand(self.channels, *grey.shape[1:]).clone()
