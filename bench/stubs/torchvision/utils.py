"""`save_image` and `make_grid` with the real signatures; the file written is a placeholder.

The bench only needs the scripts to write *something* where they would write a picture (so
the repro's list of written files is exercised), not a decodable PNG.
"""

from __future__ import annotations

import os
from typing import Any

import torch


def make_grid(tensor: Any, nrow: int = 8, padding: int = 2, **_: Any) -> torch.Tensor:
    if isinstance(tensor, (list, tuple)):
        tensor = torch.stack(list(tensor))
    if tensor.dim() == 4:
        return torch.cat(list(tensor.detach()), dim=-1)
    return tensor.detach()


def save_image(tensor: Any, fp: Any, nrow: int = 8, padding: int = 2, **_: Any) -> None:
    grid = make_grid(tensor, nrow=nrow, padding=padding)
    text = f"stub image {tuple(grid.shape)}\n".encode()
    if isinstance(fp, (str, os.PathLike)):
        with open(fp, "wb") as handle:
            handle.write(text)
    else:
        fp.write(text)
