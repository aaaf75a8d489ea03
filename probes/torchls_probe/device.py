"""The device the repro runs on: the user's choice, made effective, never silently replaced.

In: the requested device (`auto|cpu|cuda|cuda:N|mps`) and whether a fallback is allowed. Out:
the environment changes that must precede `import torch` (hiding or selecting CUDA devices), the
resolved device, and the `device` block of the report, including the devices tensors were really
seen on and a warning when those differ from the resolved one.
"""

from __future__ import annotations

import os
from typing import Any


class DeviceError(RuntimeError):
    """The requested device is not available and no fallback was allowed."""


def prepare_environment(requested: str) -> dict[str, str]:
    """Environment changes made before torch is imported; returns what was set."""
    changed: dict[str, str] = {}
    if requested == "cpu":
        # Hide CUDA devices so `"cuda" if torch.cuda.is_available() else "cpu"` picks the CPU.
        changed["CUDA_VISIBLE_DEVICES"] = ""
    elif requested.startswith("cuda:"):
        index = int(requested.split(":", 1)[1])
        visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        if visible:
            changed["CUDA_VISIBLE_DEVICES"] = visible[index] if index < len(visible) else "-1"
        else:
            changed["CUDA_VISIBLE_DEVICES"] = str(index)
    os.environ.update(changed)
    return changed


def _mps_available(torch: Any) -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def resolve(requested: str, allow_fallback: bool) -> dict[str, Any]:
    """The `device` report block without `observed`; raises DeviceError when unavailable."""
    import torch

    cuda_ok = bool(torch.cuda.is_available())
    mps_ok = _mps_available(torch)
    info: dict[str, Any] = {
        "requested": requested,
        "resolved": None,
        "torch_device": None,
        "fallback": False,
        "cuda_available": cuda_ok,
        "mps_available": mps_ok,
        "warnings": [],
    }
    kind = requested.split(":", 1)[0]
    if requested == "auto":
        kind = "cuda" if cuda_ok else "mps" if mps_ok else "cpu"
    available = {"cpu": True, "cuda": cuda_ok, "mps": mps_ok}[kind]
    if not available:
        why = _why_unavailable(torch, kind)
        if not allow_fallback:
            raise DeviceError(f"device {requested!r} is not available: {why}")
        info["fallback"] = True
        info["warnings"].append(f"{requested} is not available ({why}); fell back to cpu")
        kind = "cpu"
    # With cuda:N, CUDA_VISIBLE_DEVICES already selects the one device: inside it is cuda:0.
    info["resolved"] = requested if kind == "cuda" and requested.startswith("cuda:") else kind
    info["torch_device"] = "cuda:0" if kind == "cuda" else kind
    if kind == "cuda":
        info["name"] = torch.cuda.get_device_name(0)
        info["capability"] = list(torch.cuda.get_device_capability(0))
        info["count"] = torch.cuda.device_count()
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        info["cuda_visible_devices"] = os.environ["CUDA_VISIBLE_DEVICES"]
    if os.environ.get("PYTORCH_ENABLE_MPS_FALLBACK"):
        info["mps_fallback_env"] = os.environ["PYTORCH_ENABLE_MPS_FALLBACK"]
    return info


def _why_unavailable(torch: Any, kind: str) -> str:
    if kind == "cuda":
        if torch.version.cuda is None:
            return "this torch is a CPU-only build"
        return "torch.cuda.is_available() is False (no visible CUDA device or driver)"
    if kind == "mps":
        return "torch.backends.mps.is_available() is False"
    return "unknown device"


def observe(info: dict[str, Any], observed: list[str]) -> None:
    """Add what tensors were really on, and warn when that differs from the resolved device."""
    info["observed"] = sorted(observed)
    resolved = info.get("resolved")
    if not resolved or not observed:
        return
    wanted = str(resolved).split(":", 1)[0]
    kinds = {device.split(":", 1)[0] for device in observed}
    if wanted not in kinds:
        info["warnings"].append(
            f"{resolved} was resolved but tensors were only seen on {', '.join(sorted(kinds))}: "
            "is the model or batch moved to the device?"
        )
    strays = sorted(kinds - {wanted, "cpu"})
    if strays:
        info["warnings"].append(f"tensors were also seen on {', '.join(strays)}")
