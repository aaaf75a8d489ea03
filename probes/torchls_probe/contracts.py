"""Loss-contract checks run on the real tensors just before a loss function is called.

In: the loss function's name and its call arguments. Out: `Violation`s (severity + message)
for targets and inputs that break the loss's contract: probabilities given as logits, float or
out-of-range class targets, `[N,1]` vs `[N]` broadcasting in regression losses. They run before
the call so that a violation is reported even when the call then raises. Hand-written
differences (`(pred - y) ** 2`) are checked by `broadcast_pair` at the subtraction itself.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Violation:
    severity: str  # "error" or "warning"
    message: str


CLASS_LOSSES = {"cross_entropy", "nll_loss"}
REGRESSION_LOSSES = {"mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss"}
BINARY_LOSSES = {"binary_cross_entropy", "binary_cross_entropy_with_logits"}

LOSS_FUNCTIONS: dict[Callable[..., Any], str] = {
    getattr(F, name): name
    for name in (*CLASS_LOSSES, *REGRESSION_LOSSES, *BINARY_LOSSES, "kl_div")
    if hasattr(F, name)
}

_SIGNATURES: dict[str, inspect.Signature] = {}
_POSITIONAL: dict[str, list[str]] = {}


def shape_text(shape: Any) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def _bind(name: str, func: Callable[..., Any], args: tuple, kwargs: dict) -> dict | None:
    """The call's arguments by parameter name (defaults left out: callers use `.get`), or None
    when they do not fit the signature. Positional parameters are matched by hand, as
    `Signature.bind` would, since this runs at every step's loss."""
    signature = _SIGNATURES.get(name)
    if signature is None:
        signature = _SIGNATURES[name] = inspect.signature(func)
        _POSITIONAL[name] = [
            p.name
            for p in signature.parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    names = _POSITIONAL[name]
    if len(args) <= len(names) and not any(k in names[: len(args)] for k in kwargs):
        known = signature.parameters
        if all(k in known for k in kwargs):
            values = dict(zip(names, args))  # noqa: B905 - args may be shorter, on purpose
            values.update(kwargs)
            return values
    try:
        return dict(signature.bind(*args, **kwargs).arguments)
    except TypeError:
        return None


def check_loss(func: Callable[..., Any], args: tuple, kwargs: dict) -> list[Violation]:
    name = LOSS_FUNCTIONS.get(func)
    if name is None:
        return []
    values = _bind(name, func, args, kwargs)
    if values is None:
        return []  # the call itself will raise; the exception is reported instead
    x, t = values.get("input"), values.get("target")
    if not isinstance(x, torch.Tensor) or not isinstance(t, torch.Tensor):
        return []
    with torch.no_grad():
        x, t = x.detach(), t.detach()
        if name in CLASS_LOSSES:
            return _class_loss(name, x, t, values.get("ignore_index", -100))
        if name in REGRESSION_LOSSES:
            return _regression_loss(name, x, t)
        if name in BINARY_LOSSES:
            return _binary_loss(name, x, t)
        if not values.get("log_target", False) and x.numel() and bool((x > 0).any()):
            return [
                Violation(
                    "warning",
                    "kl_div expects log-probabilities as input but got positive values; "
                    "pass log_softmax(...) (and log_target=True if the target is in log space)",
                )
            ]
    return []


def _class_loss(name: str, x: torch.Tensor, t: torch.Tensor, ignore_index: int) -> list[Violation]:
    found: list[Violation] = []
    if not x.is_floating_point():
        found.append(Violation("error", f"{name} input must be floating point, got {x.dtype}"))
        return found
    if t.dtype == torch.bool:
        return [Violation("error", f"{name} target is bool; class targets must be torch.long")]
    class_dim = 1 if x.dim() >= 2 else 0
    expected = list(x.shape[:class_dim]) + list(x.shape[class_dim + 1 :])
    if t.is_floating_point():
        if list(t.shape) != list(x.shape):
            found.append(
                Violation(
                    "error",
                    f"{name} got a float target of shape {shape_text(t.shape)} for input "
                    f"{shape_text(x.shape)}: class-index targets must be torch.long of shape "
                    f"{shape_text(expected)} (use target.long())",
                )
            )
        return found
    if list(t.shape) != expected:
        hint = " (use target.squeeze(1))" if list(t.shape) == [*expected, 1] else ""
        found.append(
            Violation(
                "error",
                f"{name} target has shape {shape_text(t.shape)} but input "
                f"{shape_text(x.shape)} needs class indices of shape {shape_text(expected)}{hint}",
            )
        )
    classes = int(x.shape[class_dim])
    bounds = _class_range(t, ignore_index)
    if bounds is not None:
        low, high = bounds
        if low < 0 or high >= classes:
            bad = high if high >= classes else low
            found.append(
                Violation(
                    "error",
                    f"{name} target contains class {bad}, outside [0, {classes}) for input with "
                    f"{classes} classes",
                )
            )
    if x.dim() >= 2 and classes > 1 and x.numel():
        found.extend(_probabilities_as_logits(name, x, class_dim))
    return found


def _class_range(t: torch.Tensor, ignore_index: int) -> tuple[int, int] | None:
    """(lowest, highest) class index in `t` other than `ignore_index`; None if none is left.
    One `aminmax` (this runs at every step's loss); the ignored entries are masked out only
    when the smallest value is the ignore index itself."""
    if not t.numel():
        return None
    low, high = (int(v) for v in torch.aminmax(t))
    if ignore_index < 0 and low != ignore_index:
        return low, high
    valid = t[t != ignore_index]
    if not valid.numel():
        return None
    low, high = (int(v) for v in torch.aminmax(valid))
    return low, high


def _range(x: torch.Tensor) -> tuple[float, float]:
    """(min, max) in one reduction and one device->host transfer."""
    low, high = torch.aminmax(x)
    return tuple(torch.stack([low, high]).tolist())


def _probabilities_as_logits(name: str, x: torch.Tensor, class_dim: int) -> list[Violation]:
    low, high = _range(x)
    if name == "cross_entropy":
        # The row sums only for values that could be probabilities (one pass less otherwise).
        if (
            low >= 0.0
            and high <= 1.0
            and bool(torch.allclose(s := x.float().sum(class_dim), torch.ones_like(s), atol=1e-3))
        ):
            return [
                Violation(
                    "warning",
                    "cross_entropy input looks like probabilities (values in [0, 1], rows sum to "
                    "1): it applies log_softmax itself, so pass the logits (drop the softmax)",
                )
            ]
        exp_sums = x.float().exp().sum(class_dim)
        if high <= 0.0 and bool(torch.allclose(exp_sums, torch.ones_like(exp_sums), atol=1e-3)):
            return [
                Violation(
                    "warning",
                    "cross_entropy input looks like log-probabilities (log_softmax applied): "
                    "use nll_loss, or pass the logits",
                )
            ]
    elif name == "nll_loss" and high > 0.0:
        return [
            Violation(
                "warning",
                "nll_loss expects log-probabilities (<= 0) but got positive values: apply "
                "log_softmax first, or use cross_entropy on the logits",
            )
        ]
    return []


def _regression_loss(name: str, x: torch.Tensor, t: torch.Tensor) -> list[Violation]:
    found: list[Violation] = []
    if not t.is_floating_point():
        found.append(
            Violation("error", f"{name} target is {t.dtype}; it needs a floating target (.float())")
        )
    if list(x.shape) != list(t.shape):
        violation = broadcast_pair(name, x.shape, t.shape, "input", "target")
        if violation is not None:
            found.append(violation)
    return found


def broadcast_pair(
    what: str, a: torch.Size, b: torch.Size, a_name: str, b_name: str
) -> Violation | None:
    """A violation when `a` and `b` broadcast to more elements than either has, else None."""
    try:
        joint = torch.broadcast_shapes(a, b)
    except RuntimeError:
        return Violation(
            "error",
            f"{what}: {a_name} {shape_text(a)} and {b_name} {shape_text(b)} do not broadcast",
        )
    size = _numel(joint)
    largest = max(_numel(a), _numel(b))
    if size <= largest:
        return None
    hint = ""
    column = a_name if len(a) == len(b) + 1 and int(a[-1]) == 1 else None
    if len(b) == len(a) + 1 and int(b[-1]) == 1:
        column = b_name
    if column is not None:
        hint = (
            f"; use {column}.squeeze(-1)"
            if column.isidentifier()
            else f"; apply .squeeze(-1) to the {column}"
        )
    return Violation(
        "error",
        f"{what}: {a_name} {shape_text(a)} and {b_name} {shape_text(b)} broadcast to "
        f"{shape_text(joint)}, comparing {size} pairs instead of {largest}{hint}",
    )


def _numel(shape: Any) -> int:
    total = 1
    for dim in shape:
        total *= int(dim)
    return total


def _binary_loss(name: str, x: torch.Tensor, t: torch.Tensor) -> list[Violation]:
    found: list[Violation] = []
    if list(x.shape) != list(t.shape):
        found.append(
            Violation(
                "error",
                f"{name}: input {shape_text(x.shape)} and target {shape_text(t.shape)} must "
                "have the same shape",
            )
        )
    if not t.is_floating_point():
        found.append(Violation("error", f"{name} target is {t.dtype}; use a float target"))
    elif t.numel() and ((bounds := _range(t))[0] < 0.0 or bounds[1] > 1.0):
        found.append(Violation("error", f"{name} targets must lie in [0, 1]"))
    if not x.is_floating_point() or not x.numel():
        return found
    low, high = _range(x)
    if name == "binary_cross_entropy" and (low < 0.0 or high > 1.0):
        found.append(
            Violation(
                "error",
                "binary_cross_entropy expects probabilities in [0, 1] but got logits: use "
                "binary_cross_entropy_with_logits (BCEWithLogitsLoss)",
            )
        )
    elif name == "binary_cross_entropy_with_logits" and x.numel() > 1 and 0.0 <= low <= high <= 1.0:
        found.append(
            Violation(
                "warning",
                "binary_cross_entropy_with_logits input lies entirely within [0, 1]: it looks "
                "like probabilities (sigmoid applied twice?); pass the raw logits",
            )
        )
    return found
