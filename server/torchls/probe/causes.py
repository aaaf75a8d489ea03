"""When the sandbox, not the user's code, made a run fail: say so, and name the option.

Why: a script that dies of `Read-only file system`, a refused connection or a file missing
because the sandbox hides it looks like the user's own bug (TL905) unless someone says
otherwise. In: the final report (its `exception` and TL905 finding, both written by the run and
so only matched against, never trusted further), the prepared run and its project view. Out:
the TL905 message extended with the sandbox's part and the option that allows what was refused,
and `exception.sandbox_cause` (`write_refused|network_refused|hidden_file|missing_relative|
hidden_module`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchls.probe import untrusted
from torchls.probe.prepare import unfit_folder
from torchls.probe.sandbox import HIDDEN_DIRS, home_dirs

if TYPE_CHECKING:
    from torchls.probe.prepare import Prepared
    from torchls.probe.view import ProjectView

_QUOTED_PATH = re.compile(r"""['"]([^'"\n]{1,1000})['"]""")
_READ_ONLY = ("Read-only file system", "[Errno 30]")
_NETWORK = (
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "No address associated with hostname",
    "nodename nor servname",
    "[Errno 101]",
    "[Errno -2]",
    "[Errno -3]",
    "urlopen error",
    "Failed to establish a new connection",
)
_NETWORK_TYPES = {"gaierror", "URLError", "ConnectionError", "MaxRetryError", "LocalEntryNotFound"}
_MISSING = ("No such file or directory", "[Errno 2]")
_NO_MODULE = re.compile(r"No module named '([A-Za-z_][\w.]{0,200})'")


def explain(data: dict[str, Any], prepared: Prepared, project: ProjectView) -> None:
    """Add the sandbox's part to the report document's TL905 finding, when it played one
    (`data` is the document before its `ReproReport` is made)."""
    exception = data.get("exception")
    if not isinstance(exception, dict):
        return
    text = f"{exception.get('type', '')}: {exception.get('message', '')}"
    kind = str(exception.get("type", ""))
    if kind == "ModuleNotFoundError":
        cause = _hidden_module(text, exception.get("search_path"), prepared, project)
    else:
        cause = _cause(text, kind, prepared, project)
    if cause is None:
        _no_cuda(data, exception, text)
        return
    kind, sentence = cause
    exception["sandbox_cause"] = kind
    _add_to_tl905(data, sentence)


def _add_to_tl905(data: dict[str, Any], sentence: str) -> None:
    for finding in data.get("findings") or []:
        if isinstance(finding, dict) and finding.get("code") == "TL905":
            finding["message"] = f"{finding.get('message', '')} ({sentence})"


# What torch says when the script calls CUDA and this torch has none: a CPU-only build raises
# the first two, a CUDA build on a machine without a usable GPU the others.
_NO_CUDA = (
    "has no attribute '_cuda_",
    "Torch not compiled with CUDA enabled",
    "Found no NVIDIA driver",
    "No CUDA GPUs are available",
)


def _no_cuda(data: dict[str, Any], exception: dict[str, Any], text: str) -> None:
    """The script calls CUDA unconditionally and the interpreter's torch cannot give it any:
    not the sandbox's doing, nor a bug of the script's logic. The TL905 message says so and
    what to do (`exception.environment_cause`: `no_cuda`)."""
    if not any(marker in text for marker in _NO_CUDA):
        return
    device = data.get("device") or {}
    requested = device.get("requested") if isinstance(device, dict) else None
    exception["environment_cause"] = "no_cuda"
    sentence = (
        "this interpreter's torch has no usable CUDA, and the script calls it whatever device "
        f"the repro asks for ({_show(requested or 'auto')}); run it with an interpreter and "
        "machine that have CUDA (--python), or let the script choose its device "
        "(torch.cuda.is_available())"
    )
    _add_to_tl905(data, sentence)


def _cause(
    text: str, kind: str, prepared: Prepared, project: ProjectView
) -> tuple[str, str] | None:
    path = _path_in(text)
    if any(marker in text for marker in _READ_ONLY):
        return "write_refused", _write_refused(path, prepared, project)
    if kind in _NETWORK_TYPES or any(marker in text for marker in _NETWORK):
        if prepared.resolved.options.network:
            return None
        return (
            "network_refused",
            "the sandbox has no network; pass --network (setting torchls.probe.network) to "
            "allow it, never for code you do not trust; datasets and weights already in "
            "~/.cache/torch or ~/.cache/huggingface are visible",
        )
    if path is not None and any(marker in text for marker in _MISSING):
        return _missing(path, prepared, project)
    return None


def _path_in(text: str) -> str | None:
    match = _QUOTED_PATH.search(text.rpartition(":")[2]) or _QUOTED_PATH.search(text)
    return match.group(1) if match else None


def _write_refused(path: str | None, prepared: Prepared, project: ProjectView) -> str:
    where = _absolute(path, prepared) if path else None
    if where is not None:
        left_out = project.excluded_entry(where)
        if left_out is not None:
            entry, why = left_out
            return (
                f"the sandbox did it: {_show(entry)} is not copied into the run's view of the "
                f"project ({why}), so it is read-only there; pass --writable {_show(entry)} "
                "to copy it (the copy is thrown away after the run)"
            )
    shown = _show(where) if where is not None else "that folder"
    return (
        f"the sandbox did it: the run may write only in the project (seen through a copy), "
        f"the folder it runs from and its temporary folders, not in {shown}; pass --writable "
        "FOLDER to let it write there too (through a copy: nothing reaches your files)"
    )


def _missing(path: str, prepared: Prepared, project: ProjectView) -> tuple[str, str] | None:
    where = _absolute(path, prepared)
    if where is None:
        return None
    if not os.path.isabs(path) and not where.exists():
        return (
            "missing_relative",
            f"relative paths are read from where the script runs, {_show(prepared.cwd)}; "
            "pass --cwd FOLDER to run it from elsewhere",
        )
    there = where.exists() or where.parent.is_dir()  # on the host: the sandbox hid it
    if _behind_hidden(where) and there and not project.covers(where):
        return (
            "hidden_file",
            f"the sandbox did it: it hides your home folders, /tmp, /var/tmp and /run, and "
            f"{_show(where)} is outside the project; pass --writable {_show(where.parent)} "
            "to let the run see that folder (through a copy: nothing reaches your files)",
        )
    return None


def _hidden_module(
    text: str, search_path: object, prepared: Prepared, project: ProjectView
) -> tuple[str, str] | None:
    """A module the script imports from a folder above the project (`sys.path.append("..")`)
    that the sandbox hides: the folder is on the run's module search path (as the run wrote
    it in the report: only compared, never opened), the module is in it on the host, under a
    home folder or /tmp, and outside what the run sees. A folder the script never put on its
    path would fail a plain run too: the error is then the script's own."""
    match = _NO_MODULE.search(text)
    if match is None or not isinstance(search_path, list):
        return None
    searched = {os.path.normpath(entry) for entry in search_path[:64] if isinstance(entry, str)}
    parts = match.group(1).split(".")
    start = prepared.file.parent
    for folder in (start, *start.parents):
        if str(folder) not in searched:
            continue
        candidate = folder.joinpath(*parts)
        found = next(
            (p for p in (candidate.parent / f"{parts[-1]}.py", candidate) if p.exists()), None
        )
        if found is None:
            continue
        if project.covers(found) or not _behind_hidden(found):
            return None  # the run sees it: the import failed for another reason
        if unfit_folder(folder) is not None:
            return None  # a home folder cannot be the project: no option would help
        return (
            "hidden_module",
            f"the sandbox did it: {match.group(1)!r} is {_show(found)}, outside the project "
            f"the run sees ({_show(prepared.root)}), and the sandbox hides home folders and "
            f"/tmp; pass --root {_show(folder)} to make that folder the project",
        )
    return None


def _behind_hidden(where: Path) -> bool:
    hidden = [*home_dirs(), *map(Path, HIDDEN_DIRS)]
    return any(where == h or h in where.parents for h in hidden)


def _absolute(path: str, prepared: Prepared) -> Path | None:
    try:
        return Path(os.path.normpath(os.path.join(prepared.cwd, path)))
    except (TypeError, ValueError):
        return None


def _show(path: Path | Any) -> str:
    return untrusted.one_line(str(path), 300)
