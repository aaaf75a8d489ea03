"""Summaries of tensors: shape, dtype, device and finite-value statistics, cheaply.

In: tensors. Out: small JSON-ready dicts (never tensor values). The fast path is one fused
reduction and one device->host transfer (`aminmax` + `sum` in fp32); NaN and Inf propagate into
those, so the exact (slower) counts run only for tensors that are not finite. Floats are
rounded to 6 significant digits so that reports compare equal across runs. `suspects` and
`all_finite` answer for a whole list of tensors at once (the tracer's queue, every gradient
before an optimizer step) with a few reductions and one device->host transfer.
"""

from __future__ import annotations

import math
from typing import Any

import torch

_SKIP_LAYOUTS = {torch.sparse_coo}


def rounded(value: float) -> float | None:
    """6 significant digits; None for NaN/Inf so the JSON stays strict."""
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.6g}")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _plain(t: torch.Tensor) -> bool:
    return t.layout not in _SKIP_LAYOUTS and t.device.type != "meta" and not t.is_quantized


def version_of(t: torch.Tensor) -> int:
    """`t._version`, or -1 for a tensor made under `torch.inference_mode()`: those keep no
    version counter and raise when asked, and evaluation loops decorated with
    `@torch.inference_mode()` are common between training steps."""
    try:
        return t._version
    except RuntimeError:
        return -1


def is_finite(t: torch.Tensor) -> bool:
    """Whether every element is finite. One reduction plus one sync for floating tensors."""
    if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0 or not _plain(t):
        return True
    with torch.no_grad():
        total = t.detach().sum(dtype=_accumulator(t))
        if bool(torch.isfinite(total)):
            return True
        # The sum may merely have overflowed (3e38 + 3e38): ask exactly.
        return bool(torch.isfinite(t.detach()).all())


# Tensors below this many elements are copied into one flat buffer and summed together: for the
# many small outputs of a step, one copy and one reduction cost less than a reduction each.
_FLATTEN_BELOW = 1 << 12


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every element of every tensor is finite (what `is_finite` says of each)."""
    return all(is_finite(tensors[i]) for i in suspects(tensors))


def suspects(tensors: list[torch.Tensor]) -> list[int]:
    """The indices of the tensors that may hold a NaN or an infinity: none at all for a clean
    batch, decided with a few reductions and one device->host transfer.

    NaN and +-inf propagate into a sum, so the small tensors are copied into one flat buffer
    (integers and booleans too: they are finite, and skipping them would cost more than
    copying them) and summed once, each larger tensor is summed on its own, and the sums are
    stacked and tested together. A tensor whose sum is finite is finite; the others (and all
    of the small ones when their common sum is not) are only suspects, for `is_finite` to
    judge exactly: a sum may merely have overflowed. A batch that mixes devices or unusual
    layouts is all suspect.
    """
    if not tensors:
        return []
    try:
        with torch.no_grad():
            small: list[int] = []
            large: list[int] = []
            for index, t in enumerate(tensors):
                (small if t.numel() < _FLATTEN_BELOW else large).append(index)
            sums = [tensors[i].sum(dtype=_accumulator(tensors[i])) for i in large]
            if small:
                flat = torch._C._nn.flatten_dense_tensors([tensors[i] for i in small])
                sums.append(flat.sum(dtype=_accumulator(flat)))
            flags = torch.isfinite(torch.stack(sums)).tolist()  # the one transfer
    except (RuntimeError, TypeError, ValueError):
        return list(range(len(tensors)))  # several devices, sparse or nested tensors
    found = [i for i, ok in zip(large, flags) if not ok]  # noqa: B905 - flags may be longer
    if small and not flags[-1]:
        found.extend(small)
    return found


def _accumulator(t: torch.Tensor) -> torch.dtype:
    if t.is_complex():
        return t.dtype
    if t.dtype == torch.float64:
        return torch.float64
    return torch.float32


def summary(t: torch.Tensor, *, uninitialized: bool = False) -> dict[str, Any]:
    """The per-tensor record of a report; see docs/probe-report.md."""
    info: dict[str, Any] = {
        "shape": list(t.shape),
        "dtype": dtype_name(t.dtype),
        "device": str(t.device),
        "requires_grad": bool(t.requires_grad),
    }
    if uninitialized:
        info["uninitialized"] = True
        return info
    if t.numel() == 0 or not _plain(t) or t.is_complex():
        return info
    with torch.no_grad():
        x = t.detach()
        if x.dtype == torch.bool:
            x = x.to(torch.uint8)
        if not x.is_floating_point():
            lo, hi = torch.aminmax(x)
            mean = x.sum(dtype=torch.float64) / x.numel()
            values = torch.stack([lo.double(), hi.double(), mean]).tolist()
            info.update(
                finite=True, min=int(values[0]), max=int(values[1]), mean=rounded(values[2])
            )
            return info
        acc = _accumulator(x)
        lo, hi = torch.aminmax(x)
        values = torch.stack([lo.to(acc), hi.to(acc), x.sum(dtype=acc)]).tolist()
        if all(math.isfinite(v) for v in values):
            info.update(
                finite=True,
                min=rounded(values[0]),
                max=rounded(values[1]),
                mean=rounded(values[2] / x.numel()),
            )
            return info
        return _slow(x, info)


def _slow(x: torch.Tensor, info: dict[str, Any]) -> dict[str, Any]:
    finite = torch.isfinite(x)
    nan = int(torch.isnan(x).sum())
    posinf = int(torch.isposinf(x).sum())
    neginf = int(torch.isneginf(x).sum())
    count = int(finite.sum())
    info["finite"] = nan == 0 and posinf == 0 and neginf == 0
    if count:
        values = x[finite].double()
        info.update(
            min=rounded(float(values.min())),
            max=rounded(float(values.max())),
            mean=rounded(float(values.mean())),
        )
    else:
        info.update(min=None, max=None, mean=None)
    if not info["finite"]:
        info["nonfinite"] = {"nan": nan, "posinf": posinf, "neginf": neginf, "numel": x.numel()}
    return info


def tensors_in(value: Any, limit: int = 16) -> list[torch.Tensor]:
    """Tensors directly inside `value` (a tensor, or a list/tuple/dict of them), in order."""
    found: list[torch.Tensor] = []
    stack = [value]
    seen = 0
    while stack and len(found) < limit and seen < 256:
        item = stack.pop(0)
        seen += 1
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return found
