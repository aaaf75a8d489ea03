"""Datasets with the shapes, lengths and label ranges of the real ones, filled with noise.

Items are `(image, label)` with `image` a float tensor `[C, H, W]` in [0, 1] (what `ToTensor`
would have made of the real picture) and `label` an int. A small pool of random images is
drawn once per dataset and indexed modulo its size: building all 60,000 MNIST images would
only cost time, and the scripts under test cannot tell the difference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

_POOL = 256


class _Noise(torch.utils.data.Dataset):
    shape: tuple[int, int, int] = (1, 28, 28)
    classes_count = 10

    def __init__(
        self,
        root: Any = None,
        train: bool = True,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        download: bool = False,
        size: int | None = None,
    ) -> None:
        self.root = root
        self.train = train
        self.transform = transform
        self.target_transform = target_transform
        self.length = size if size is not None else self.default_length(train)
        generator = torch.Generator().manual_seed(1 if train else 2)
        self._images = torch.rand((_POOL, *self.shape), generator=generator)
        self._labels = torch.randint(0, self.classes_count, (_POOL,), generator=generator)
        self.classes = [str(i) for i in range(self.classes_count)]

    @staticmethod
    def default_length(train: bool) -> int:
        return 60000 if train else 10000

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        if not 0 <= index < self.length:
            raise IndexError(index)
        image: Any = self._images[index % _POOL]
        label: Any = int(self._labels[index % _POOL])
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return image, label

    @property
    def targets(self) -> torch.Tensor:
        return self._labels.repeat(self.length // _POOL + 1)[: self.length]


class MNIST(_Noise):
    shape = (1, 28, 28)


class FashionMNIST(MNIST):
    pass


class CIFAR10(_Noise):
    shape = (3, 32, 32)

    @staticmethod
    def default_length(train: bool) -> int:
        return 50000 if train else 10000


class FakeData(_Noise):
    """torchvision's own random dataset: `size` images of `image_size`."""

    def __init__(
        self,
        size: int = 1000,
        image_size: tuple[int, int, int] = (3, 224, 224),
        num_classes: int = 10,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        random_offset: int = 0,
    ) -> None:
        self.shape = tuple(image_size)  # type: ignore[assignment]
        self.classes_count = num_classes
        super().__init__(None, True, transform, target_transform, size=size)
