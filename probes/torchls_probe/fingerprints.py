"""Fingerprints that let ranks compare what they hold without sending it to each other.

In: a model, or a batch from a DataLoader. Out: small numbers that are equal exactly when the
values are: per replicated tensor of a model, an exact digest of its bits plus its float sum
and largest magnitude (so that the same values summed in another order are not taken for a
difference); per sample of a batch, one number from every tensor whose first dimension is the
batch size. The arithmetic is wrapping int64 over the values' bit patterns, on the tensors'
own device, so a fingerprint costs one pass over the data and one transfer.
"""

from __future__ import annotations

from typing import Any

import torch

from torchls_probe.stats import tensors_in

DIGEST_NAMES = 2000  # parameters and buffers fingerprinted per model
SAMPLES_PER_BATCH = 512


def replicated(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The tensors every rank should hold alike: the parameters, and the buffers other than the
    running statistics of norm layers that nothing synchronises (those follow each rank's data
    by design; SyncBatchNorm's do not)."""
    found: list[tuple[str, torch.Tensor]] = list(model.named_parameters())
    local_stats = {
        id(buffer)
        for module in model.modules()
        if isinstance(module, torch.nn.modules.batchnorm._NormBase)
        and not isinstance(module, torch.nn.SyncBatchNorm)
        for buffer in module.buffers(recurse=False)
    }
    found += [(n, b) for n, b in model.named_buffers() if id(b) not in local_stats]
    return found[:DIGEST_NAMES]


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns as int64, one row per leading index (the first dim kept)."""
    flat = t.detach().reshape(t.shape[0] if t.dim() else 1, -1)
    if flat.dtype == torch.bool:
        return flat.to(torch.int64)
    if flat.is_floating_point() or flat.is_complex():
        size = flat.element_size()
        flat = flat.contiguous().view(_INT_OF_SIZE.get(size, torch.int64))
    return flat.to(torch.int64)


def _mix(bits: torch.Tensor) -> torch.Tensor:
    """Per row, a position-weighted sum of the bits (wrapping int64 arithmetic)."""
    columns = bits.shape[1]
    weights = torch.arange(columns, dtype=torch.int64, device=bits.device) * 2654435761 + 40503
    return (bits * weights).sum(dim=1) * 31 + bits.sum(dim=1) + columns


def model_digests(model: torch.nn.Module) -> dict[str, list[Any]]:
    """name -> [exact digest, float sum, largest magnitude] for each replicated tensor."""
    found: dict[str, list[Any]] = {}
    for name, tensor in replicated(model):
        if tensor.numel() == 0 or tensor.is_sparse or tensor.device.type == "meta":
            continue
        digest = int(_mix(_bits(tensor.reshape(1, -1))).sum())
        values = tensor.detach().double() if not tensor.is_complex() else tensor.detach().abs()
        found[name] = [f"{tensor.numel()}:{digest}", float(values.sum()), float(values.abs().max())]
    return found


def sample_fingerprints(batch: Any) -> list[int]:
    """One number per sample of a batch, from the tensors whose first dimension is the batch
    size: equal samples give equal numbers whatever their position in the batch."""
    tensors = [t for t in tensors_in(batch, 8) if t.dim() >= 1 and t.numel() > 0]
    if not tensors:
        return []
    size = tensors[0].shape[0]
    total = None
    for index, tensor in enumerate(t for t in tensors if t.shape[0] == size):
        mixed = _mix(_bits(tensor[:SAMPLES_PER_BATCH])) * (2 * index + 1)
        total = mixed if total is None else total + mixed
    return [int(v) for v in total.tolist()] if total is not None else []
