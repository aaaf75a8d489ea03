"""Readable, stable names for the torch callables the tracer sees.

In: the `func` a TorchFunctionMode handler receives. Out: `torch.log`, `F.linear`, `Tensor.sub`,
or None for calls that are not worth recording (reprs, size queries, property reads other than
the transposes). Cached per callable because the same few hundred functions repeat every step.
"""

from __future__ import annotations

import contextlib
from typing import Any

# Property reads (`t.grad`, `t.shape`) reach the mode as a getset descriptor's `__get__`; only the
# ones that produce a new tensor are worth a table entry.
_VIEW_PROPERTIES = {"T", "mT", "H", "mH", "real", "imag"}

_SKIP = {
    "__repr__",
    "__format__",
    "__str__",
    "__len__",
    "__bool__",
    "__hash__",
    "__index__",
    "__int__",
    "__float__",
    "__complex__",
    "__array__",
    "__reduce_ex__",
    "__deepcopy__",
    "__dlpack__",
    "__dlpack_device__",
    "__contains__",
    "__iter__",
    "__setitem__",
    "__setstate__",
    "dim",
    "size",
    "numel",
    "nelement",
    "ndimension",
    "item",
    "tolist",
    "numpy",
    "is_floating_point",
    "is_complex",
    "data_ptr",
    "element_size",
    "stride",
    "storage_offset",
    "is_contiguous",
    "untyped_storage",
    "get_device",
    "register_hook",
    "register_post_accumulate_grad_hook",
    "retain_grad",
    "requires_grad_",
    "_is_view",
    "_record_function_enter",
    "_record_function_enter_new",
    "_record_function_exit",
}

_MODULE_PREFIX = {
    "torch": "torch",
    "torch.functional": "torch",
    "torch._C._VariableFunctions": "torch",
    "torch._C._nn": "F",
    "torch.nn.functional": "F",
    "torch._C._linalg": "torch.linalg",
    "torch.linalg": "torch.linalg",
    "torch._C._fft": "torch.fft",
    "torch.fft": "torch.fft",
    "torch._C._special": "torch.special",
    "torch.special": "torch.special",
    "torch.autograd": "torch.autograd",
}

_CACHE: dict[Any, str | None] = {}


def op_name(func: Any) -> str | None:
    try:
        return _CACHE[func]
    except (KeyError, TypeError):
        pass
    name = _compute(func)
    with contextlib.suppress(TypeError):  # an unhashable callable: just don't cache it
        _CACHE[func] = name
    return name


def _compute(func: Any) -> str | None:
    name = getattr(func, "__name__", "") or ""
    if name in ("__get__", "__set__", "__delete__"):
        attr = getattr(getattr(func, "__self__", None), "__name__", "")
        return f"Tensor.{attr}" if name == "__get__" and attr in _VIEW_PROPERTIES else None
    if name in _SKIP or not name:
        return None
    qualname = getattr(func, "__qualname__", name) or name
    if qualname.split(".")[0] in ("TensorBase", "_TensorBase", "Tensor"):
        return f"Tensor.{name}"
    module = getattr(func, "__module__", None) or ""
    prefix = _MODULE_PREFIX.get(module)
    if prefix is not None:
        return f"{prefix}.{name}"
    if module.startswith("torch"):
        return f"{module}.{qualname}"
    return f"{module}.{qualname}" if module else qualname
