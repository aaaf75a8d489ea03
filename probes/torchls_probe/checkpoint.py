"""`torchls inspect`: what a checkpoint file holds, and whether `torch.load(weights_only=True)`
takes it, without ever running code from it.

In: a path (a file `torch.save` wrote, zip or legacy format, or a `.safetensors` file). Out: a
JSON-ready dict: the format, `weights_only` (does it load that way, and if not the globals that
block it and where each sits, e.g. `ckpt["args"]: argparse.Namespace`), the structure (a tree of
keys; tensors with shape, dtype, the device they were saved from and bytes), totals, the
training state found (model, optimizer with learning rates, scheduler, scaler, RNG, epoch/step)
and what is missing to resume.

The file is untrusted. Its pickle is read by `_StructureUnpickler`, which resolves *every*
global to an inert stand-in class: calling it, building it or filling it only records the
arguments, so `os.system` in a hostile pickle is listed, never run, and nothing is imported.
Tensor data is never read: storages become (dtype, device, size) records. The pickle is read
into memory up to `MAX_PICKLE` bytes; a safetensors header up to `MAX_HEADER`. The verdict on
`weights_only` comes from torch itself where it can say (`torch.load(..., weights_only=True,
mmap=True)`, whose unpickler refuses unknown globals; `get_unsafe_globals_in_checkpoint`).
Imports only the standard library, and torch only for that verdict.
"""

from __future__ import annotations

import collections
import io
import json
import os
import pickle
import struct
import zipfile
from typing import Any

MAX_PICKLE = 256 << 20
MAX_HEADER = 64 << 20
MAX_NODES = 5000  # entries of the structure tree kept in the report
ZIP_MAGIC = b"PK\x03\x04"
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C

_DTYPES = {
    "FloatStorage": ("float32", 4),
    "DoubleStorage": ("float64", 8),
    "HalfStorage": ("float16", 2),
    "BFloat16Storage": ("bfloat16", 2),
    "LongStorage": ("int64", 8),
    "IntStorage": ("int32", 4),
    "ShortStorage": ("int16", 2),
    "CharStorage": ("int8", 1),
    "ByteStorage": ("uint8", 1),
    "BoolStorage": ("bool", 1),
    "ComplexFloatStorage": ("complex64", 8),
    "ComplexDoubleStorage": ("complex128", 16),
    "UntypedStorage": ("uint8", 1),
}
_SAFETENSORS_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2}
_SAFETENSORS_SIZES.update({"I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1})
# Globals torch's weights_only unpickler accepts without an allow-list (used where torch cannot
# be asked: legacy files, or a torch without get_unsafe_globals_in_checkpoint).
_SAFE_PREFIXES = (
    "collections.OrderedDict",
    "torch._utils._rebuild_",
    "torch.Size",
    "torch.device",
    "torch.serialization._get_layout",
    "torch._tensor._rebuild_from_type_v2",
    "torch.nn.parameter.Parameter",
    "builtins.set",
    "builtins.frozenset",
    "builtins.bytearray",
    "builtins.complex",
    "builtins.slice",
    "builtins.range",
    "collections.Counter",
)


class InspectError(Exception):
    """The file is not something this can inspect: the message says what it is."""


# --- inert stand-ins for everything a pickle names -----------------------------------------------


class Stub:
    """An object a pickle asked for: records how it was made, runs nothing."""

    global_name = ""

    def __new__(cls, *args: Any, **kwargs: Any) -> Stub:
        obj = object.__new__(cls)
        obj.__dict__.update(args_=args, state_=None, items_={}, list_=[])
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if args and not self.args_:
            self.args_ = args

    def __setstate__(self, state: Any) -> None:
        self.state_ = state

    def __setitem__(self, key: Any, value: Any) -> None:
        self.items_[key] = value

    def append(self, value: Any) -> None:
        self.list_.append(value)

    def extend(self, values: Any) -> None:
        self.list_.extend(values)


class Storage:
    """A tensor storage named by the pickle: its data stays on disk."""

    def __init__(self, dtype: str, itemsize: int, location: str, numel: int) -> None:
        self.dtype, self.itemsize, self.location, self.numel = dtype, itemsize, location, numel


class _StructureUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.globals: dict[str, None] = {}
        self._classes: dict[str, type] = {}

    def find_class(self, module: str, name: str) -> type:
        full = f"{module}.{name}"
        self.globals.setdefault(full, None)
        cls = self._classes.get(full)
        if cls is None:
            cls = type(name, (Stub,), {"global_name": full, "__module__": "torchls_probe.stub"})
            self._classes[full] = cls
        return cls

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage":
            kind = getattr(pid[1], "global_name", str(pid[1])).rsplit(".", 1)[-1]
            dtype, itemsize = _DTYPES.get(kind, (kind, 1))
            numel = pid[4] if isinstance(pid[4], int) else 0
            return Storage(dtype, itemsize, str(pid[3]), numel)
        return Storage("unknown", 1, "unknown", 0)


def _structure(data: bytes) -> tuple[Any, list[str]]:
    unpickler = _StructureUnpickler(data)
    try:
        root = unpickler.load()
    except Exception as error:  # a truncated or corrupted pickle
        raise InspectError(f"the pickle in this file is corrupted: {error}") from None
    return root, list(unpickler.globals)


# --- formats --------------------------------------------------------------------------------------


def detect(path: str) -> str:
    with open(path, "rb") as handle:
        head = handle.read(16)
    if head.startswith(ZIP_MAGIC):
        return "zip"
    if len(head) >= 9 and head[8:9] == b"{":
        (size,) = struct.unpack("<Q", head[:8])
        if 0 < size <= os.path.getsize(path) - 8:
            return "safetensors"
    if head[:1] == b"\x80" and 2 <= head[1] <= 5:
        return "legacy"
    if head.lstrip()[:1] == b"{" and path.endswith(".json"):
        return "index"
    raise InspectError(
        "not a checkpoint: neither a torch.save file (zip or legacy) nor safetensors"
    )


def _zip_pickle(path: str) -> tuple[bytes, str]:
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as error:
        raise InspectError(f"the zip archive is truncated or corrupted: {error}") from None
    with archive:
        names = [n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
        if not names:
            raise InspectError("a zip file, but not one torch.save wrote (no data.pkl inside)")
        info = archive.getinfo(names[0])
        if info.file_size > MAX_PICKLE:
            raise InspectError(f"its pickle is {info.file_size} bytes, over {MAX_PICKLE}")
        try:
            return archive.read(names[0]), names[0].rsplit("/", 1)[0]
        except (zipfile.BadZipFile, OSError, EOFError) as error:
            raise InspectError(f"the zip archive is truncated or corrupted: {error}") from None


def _legacy_pickle(path: str) -> bytes:
    """The main pickle of a legacy (pre-1.6) torch.save file: the one after its magic number,
    protocol version and system info."""
    with open(path, "rb") as handle:
        data = handle.read(MAX_PICKLE)
    stream = io.BytesIO(data)
    try:
        first = _HeaderUnpickler(stream)
        if first.load() != LEGACY_MAGIC:
            raise InspectError("a pickle, but not one torch.save wrote (no torch magic number)")
        first.load()  # protocol version
        first.load()  # system info
    except InspectError:
        raise
    except Exception as error:
        raise InspectError(f"a pickle, but not one torch.save wrote: {error}") from None
    return data[stream.tell() :]


class _HeaderUnpickler(pickle.Unpickler):
    """The small pickles before a legacy file's main one hold plain data only."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"global {module}.{name} in a legacy header")


def _safetensors(path: str) -> dict[str, Any]:
    with open(path, "rb") as handle:
        (size,) = struct.unpack("<Q", handle.read(8))
        if size > MAX_HEADER:
            raise InspectError(f"its safetensors header is {size} bytes, over {MAX_HEADER}")
        raw = handle.read(size)
    try:
        header = json.loads(raw)
    except ValueError:
        raise InspectError("the safetensors header is not valid JSON") from None
    if not isinstance(header, dict):
        raise InspectError("the safetensors header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    tensors = []
    total = 0
    for name, info in list(header.items())[:MAX_NODES]:
        if not isinstance(info, dict):
            continue
        shape = [d for d in info.get("shape") or [] if isinstance(d, int)]
        dtype = str(info.get("dtype"))
        count = _product(shape)
        size_bytes = count * _SAFETENSORS_SIZES.get(dtype, 4)
        total += size_bytes
        tensors.append({"path": name, "kind": "tensor", "shape": shape, "dtype": dtype})
        tensors[-1].update(device="cpu", bytes=size_bytes)
    return {
        "format": "safetensors",
        "weights_only": {
            "loads": True,
            "note": "safetensors holds tensors only: nothing to unpickle",
            "blocking": [],
        },
        "tree": tensors,
        "metadata": metadata if isinstance(metadata, dict) else None,
        "totals": {"tensors": len(tensors), "bytes": total, "parameters": None},
        "training_state": {"model": bool(tensors)},
        "missing": [],
    }


def _index(path: str) -> dict[str, Any]:
    with open(path, "rb") as handle:
        raw = handle.read(MAX_HEADER)
    try:
        index = json.loads(raw)
    except ValueError:
        raise InspectError("a JSON file, but not a sharded checkpoint index") from None
    weights = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weights, dict):
        raise InspectError("a JSON file, but not a sharded checkpoint index (no weight_map)")
    shards = sorted({str(v) for v in weights.values()})
    return {
        "format": "sharded",
        "weights_only": {
            "loads": None,
            "note": f"an index of {len(shards)} shard(s): inspect each shard file on its own",
            "blocking": [],
        },
        "tree": [{"path": shard, "kind": "shard"} for shard in shards[:MAX_NODES]],
        "totals": {"tensors": len(weights), "bytes": None, "parameters": None},
        "training_state": {"model": True},
        "missing": [],
    }


# --- the structure as a tree --------------------------------------------------------------------


def _product(shape: list[int]) -> int:
    count = 1
    for d in shape:
        count *= d
    return count


def _tensor_of(value: Any) -> dict[str, Any] | None:
    """A tensor rebuilt by `_rebuild_tensor_v2` / `_rebuild_parameter`, as a record."""
    name = getattr(value, "global_name", "")
    if name.endswith("_rebuild_parameter") and value.args_:
        inner = _tensor_of(value.args_[0])
        return {**inner, "parameter": True} if inner else None
    if not name.startswith("torch._utils._rebuild_tensor") or len(value.args_) < 3:
        return None
    storage, shape = value.args_[0], value.args_[2]
    if not isinstance(storage, Storage):
        return None
    if isinstance(shape, Stub) and shape.args_:  # torch.Size((2, 3))
        shape = shape.args_[0]
    dims = [d for d in shape if isinstance(d, int)] if isinstance(shape, tuple | list) else []
    count = _product(dims)
    return {
        "kind": "tensor",
        "shape": dims,
        "dtype": storage.dtype,
        "device": storage.location,
        "bytes": count * storage.itemsize,
    }


def _mapping(value: Any) -> dict[Any, Any] | None:
    if isinstance(value, dict):
        return value
    if isinstance(value, Stub):
        if value.items_:
            return value.items_
        if isinstance(value.state_, dict):
            return value.state_
        if value.state_ is None and value.args_ and isinstance(value.args_[0], list):
            pairs = value.args_[0]  # OrderedDict([(k, v), ...])
            if all(isinstance(p, tuple) and len(p) == 2 for p in pairs):
                return dict(pairs)
    return None


def _label(path: str, key: Any) -> str:
    return f"{path}[{key!r}]"


class _Walker:
    def __init__(self, unsafe: set[str]) -> None:
        self.unsafe = unsafe
        self.nodes: list[dict[str, Any]] = []
        self.blocking: list[dict[str, str]] = []
        self.tensors = 0
        self.bytes = 0
        self.devices: dict[str, None] = {}
        self.per_entry: dict[str, dict[str, int]] = {}  # top-level key -> tensors, bytes

    def walk(self, value: Any, path: str, depth: int = 0) -> None:
        if depth > 40:
            return
        tensor = _tensor_of(value)
        if tensor is not None:
            self.tensors += 1
            self.bytes += tensor["bytes"]
            self.devices.setdefault(tensor["device"], None)
            top = path.split("]", 1)[0] + "]" if "[" in path else path
            entry = self.per_entry.setdefault(top, {"tensors": 0, "bytes": 0})
            entry["tensors"] += 1
            entry["bytes"] += tensor["bytes"]
            self._node(path, tensor)
            return
        if isinstance(value, Stub):
            name = value.global_name
            if name in self.unsafe:
                self.blocking.append({"path": path, "global": name, **_hint(name)})
            plain = _mapping(value)
            fields = _plain_fields(plain) if plain is not None else None
            self._node(path, {"kind": "object", "global": name, "fields": fields})
            children = plain if plain is not None else {}
            for key, child in list(children.items())[:1000]:
                self.walk(child, _label(path, key), depth + 1)
            for index, item in enumerate(value.list_[:1000]):
                self.walk(item, f"{path}[{index}]", depth + 1)
            for index, arg in enumerate(value.args_[:8]):
                if isinstance(arg, Stub | dict | list | tuple):
                    self.walk(arg, f"{path}<arg {index}>", depth + 1)
            return
        if isinstance(value, dict):
            self._node(path, {"kind": "dict", "keys": len(value)})
            for key, child in list(value.items())[:1000]:
                self.walk(child, _label(path, key), depth + 1)
            return
        if isinstance(value, list | tuple):
            self._node(path, {"kind": type(value).__name__, "items": len(value)})
            for index, item in enumerate(value[:1000]):
                self.walk(item, f"{path}[{index}]", depth + 1)
            return
        if isinstance(value, bool | int | float | str | type(None)):
            shown = value if not isinstance(value, str) else value[:200]
            self._node(path, {"kind": type(value).__name__, "value": shown})
            return
        self._node(path, {"kind": type(value).__name__})

    def _node(self, path: str, record: dict[str, Any]) -> None:
        if len(self.nodes) < MAX_NODES:
            self.nodes.append({"path": path, **record})


def _plain_fields(mapping: dict[Any, Any]) -> dict[str, Any]:
    """The simple fields of a config object, as the plain data it should have been saved as."""
    out: dict[str, Any] = {}
    for key, value in list(mapping.items())[:200]:
        if isinstance(value, bool | int | float | str | type(None)):
            out[str(key)] = value if not isinstance(value, str) else value[:200]
        elif isinstance(value, list | tuple) and all(
            isinstance(v, bool | int | float | str) for v in value[:50]
        ):
            out[str(key)] = list(value[:50])
    return out


# Globals that run code when a pickle calls them: a file naming them is hostile or broken.
_RUNS_CODE = ("os.", "posix.", "nt.", "subprocess.", "builtins.eval", "builtins.exec")
_RUNS_CODE += ("builtins.__import__", "builtins.getattr", "builtins.compile", "runpy.", "shutil.")


def _hint(name: str) -> dict[str, str]:
    if name.startswith(_RUNS_CODE):
        return {
            "fix": f"the file calls {name} when unpickled: it would run code on your machine. "
            "Do not load it with weights_only=False",
            "allow": "never allow-list it",
        }
    if name == "argparse.Namespace":
        plain = "save vars(args) instead of args"
    else:
        plain = (
            "save plain data instead of this object: dataclasses.asdict(cfg) for a dataclass, "
            "vars(obj) or a dict of its fields otherwise"
        )
    allow = f"or, for files you trust: torch.serialization.add_safe_globals([{name}])"
    return {"fix": plain, "allow": allow}


def _training_state(root: Any, walker: _Walker) -> tuple[dict[str, Any], list[str]]:
    top = _mapping(root) if isinstance(root, Stub) else root if isinstance(root, dict) else None
    state: dict[str, Any] = {
        "model": False,
        "optimizer": None,
        "scheduler": False,
        "scaler": False,
        "rng": False,
    }
    counters: dict[str, Any] = {}
    if top is None:
        state["model"] = _tensor_of(root) is None and bool(walker.tensors)
        return state, []
    if top and all(_tensor_of(v) is not None for v in top.values()):
        state["model"] = True  # the file is a state_dict itself
    for key, value in top.items():
        inner = _mapping(value) if isinstance(value, Stub) else value
        if isinstance(inner, dict):
            keys = {str(k) for k in inner}
            if {"state", "param_groups"} <= keys:
                groups = inner.get("param_groups")
                lrs = [
                    g.get("lr")
                    for g in (groups if isinstance(groups, list) else [])
                    if isinstance(g, dict) and isinstance(g.get("lr"), int | float)
                ]
                state["optimizer"] = {"key": str(key), "param_groups": len(lrs), "lr": lrs[:8]}
            elif "last_epoch" in keys and ({"base_lrs", "_last_lr"} & keys):
                state["scheduler"] = True
            elif {"scale", "growth_factor"} <= keys:
                state["scaler"] = True
            elif inner and all(_tensor_of(v) is not None for v in inner.values()):
                state["model"] = True
        if "rng" in str(key).lower():
            state["rng"] = True
        if isinstance(value, int | float) and not isinstance(value, bool):
            lowered = str(key).lower()
            if lowered in ("epoch", "step", "global_step", "iteration", "iter") or (
                lowered.startswith("best")
            ):
                counters[str(key)] = value
    state["counters"] = counters
    missing = []
    bare = bool(top) and all(_tensor_of(v) is not None for v in top.values())
    if bare:
        missing.append(
            "a bare state_dict (weights only): enough for inference or fine-tuning, not to "
            "resume training (no optimizer state, no epoch)"
        )
    elif state["model"] and state["optimizer"] is None:
        missing.append(
            "no optimizer state: training cannot resume where it stopped (save "
            "optimizer.state_dict() too; TL304)"
        )
    return state, missing


# --- the verdict ---------------------------------------------------------------------------------


def _torch_verdict(path: str, kind: str) -> tuple[bool | None, str, list[str] | None]:
    """(loads, what torch said, unsafe globals per torch) — None where torch cannot tell."""
    try:
        import torch
    except Exception as error:
        return None, f"torch cannot be imported: {error}", None
    unsafe = None
    finder = getattr(torch.serialization, "get_unsafe_globals_in_checkpoint", None)
    if finder is not None and kind == "zip":
        try:
            unsafe = list(finder(path))
        except Exception:
            unsafe = None
    if kind != "zip":
        return None, "legacy format: judged from its pickle (torch cannot mmap it)", unsafe
    try:
        torch.load(path, weights_only=True, mmap=True, map_location="cpu")
    except pickle.UnpicklingError as error:
        # torch's message is long (and styled); its "Unsupported global" line is the point.
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        said = next((line for line in lines if "Unsupported global" in line), None)
        if said is not None:
            said = said.split(" Please use", 1)[0]
        return False, (said or "torch.load(weights_only=True) refuses it")[:300], unsafe
    except Exception as error:
        return False, f"{type(error).__name__}: {str(error)[:300]}", unsafe
    return True, "torch.load(weights_only=True) loads it", unsafe


def inspect(path: str) -> dict[str, Any]:
    """The inspection record of the checkpoint at `path` (see the module docstring)."""
    if os.path.isdir(path):
        raise InspectError("a folder: give the checkpoint file, or its .index.json for shards")
    kind = detect(path)
    if kind == "safetensors":
        return _safetensors(path)
    if kind == "index":
        return _index(path)
    if kind == "zip":
        data, _ = _zip_pickle(path)
    else:
        data = _legacy_pickle(path)
    root, names = _structure(data)
    loads, said, torch_unsafe = _torch_verdict(path, kind)
    unsafe = set(torch_unsafe) if torch_unsafe is not None else None
    if unsafe is None:
        unsafe = {n for n in names if not n.startswith(_SAFE_PREFIXES) and _looks_unsafe(n)}
    walker = _Walker(unsafe)
    walker.walk(root, "ckpt")
    if loads is None:
        loads = not walker.blocking and not unsafe
    state, missing = _training_state(root, walker)
    parameters = sum(
        _product(node["shape"]) for node in walker.nodes if node.get("kind") == "tensor"
    )
    return {
        "format": "zip" if kind == "zip" else "legacy",
        "weights_only": {
            "loads": loads,
            "note": said,
            "blocking": walker.blocking or [{"path": "?", "global": n, **_hint(n)} for n in unsafe],
        },
        "tree": walker.nodes,
        "totals": {"tensors": walker.tensors, "bytes": walker.bytes, "parameters": parameters},
        "per_entry": walker.per_entry,
        "saved_on": list(walker.devices),
        "map_location_needed": any(d != "cpu" for d in walker.devices),
        "training_state": state,
        "missing": missing,
        "globals": names[:200],
    }


def _looks_unsafe(name: str) -> bool:
    """Without torch to ask: dtypes and storages are fine, anything else blocks."""
    module, _, attr = name.rpartition(".")
    return not (module == "torch" and (attr.endswith("Storage") or attr in _TORCH_DTYPES))


_TORCH_DTYPES = {"float32", "float64", "float16", "bfloat16", "int64", "int32", "uint8", "bool"}


# --- --rewrite-plain ------------------------------------------------------------------------------


def _plain_copy(value: Any, path: str, changed: list[str], depth: int = 0) -> Any:
    """`value` with configs and simple objects turned into dicts; tensors are kept as they are
    (the same objects, so the copy holds no duplicate data)."""
    import argparse
    import dataclasses

    import torch

    if depth > 60 or isinstance(value, torch.Tensor | bool | int | float | str | bytes):
        return value
    if value is None or isinstance(value, torch.dtype | torch.device | torch.Size):
        return value
    if isinstance(value, dict):
        copy = type(value)() if type(value) in (dict, collections.OrderedDict) else {}
        for key, item in value.items():
            copy[key] = _plain_copy(item, f"{path}[{key!r}]", changed, depth + 1)
        return copy
    if isinstance(value, list | tuple):
        items = [_plain_copy(v, f"{path}[{i}]", changed, depth + 1) for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, torch.nn.Module):
        changed.append(f"{path}: {type(value).__name__} module -> its state_dict()")
        return value.state_dict()
    if isinstance(value, argparse.Namespace):
        changed.append(f"{path}: argparse.Namespace -> dict (vars)")
        return _plain_copy(dict(vars(value)), path, [], depth + 1)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changed.append(f"{path}: {type(value).__name__} dataclass -> dict of its fields")
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return _plain_copy(fields, path, [], depth + 1)
    if hasattr(value, "__dict__") and not callable(value):
        changed.append(f"{path}: {type(value).__name__} -> dict of its attributes")
        return _plain_copy(dict(vars(value)), path, [], depth + 1)
    return value


def _tensors(value: Any, path: str, found: dict[str, Any], depth: int = 0) -> None:
    import torch

    if depth > 60:
        return
    if isinstance(value, torch.Tensor):
        found[path] = value
    elif isinstance(value, dict):
        for key, item in value.items():
            _tensors(item, f"{path}[{key!r}]", found, depth + 1)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _tensors(item, f"{path}[{index}]", found, depth + 1)


def rewrite_plain(path: str, out: str) -> dict[str, Any]:
    """Load `path` fully (the user said they trust it), save a plain-data copy to `out`, and
    check that the copy loads with `weights_only=True` and holds equal tensors."""
    import torch

    original = torch.load(path, weights_only=False, map_location="cpu")
    changed: list[str] = []
    plain = _plain_copy(original, "ckpt", changed)
    torch.save(plain, out)
    try:
        again = torch.load(out, weights_only=True, map_location="cpu")
    except Exception as error:
        return {"verified": False, "changed": changed, "problem": f"still refused: {error}"[:500]}
    before: dict[str, Any] = {}
    after: dict[str, Any] = {}
    _tensors(plain, "ckpt", before)
    _tensors(again, "ckpt", after)
    same = before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    if not same:
        return {"verified": False, "changed": changed, "problem": "tensors differ after reload"}
    return {"verified": True, "changed": changed, "tensors": len(after)}
