"""The failing-boundary record: exactly what ran, so a repro can be reproduced elsewhere.

In: the request and the torch module. Out: the `environment` block of the report: command,
Python and torch versions, CUDA/cuDNN versions and device name when present, default dtype,
parameter dtypes and autocast seen at model calls, determinism settings and seed, thread count
and the git revision of the project (read from `.git` directly: no git binary is needed, and the
sandbox may not have one).
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Any


def seed_everything(seed: int, deterministic: bool) -> dict[str, Any]:
    """Seed every RNG the step may use and return the determinism settings in force."""
    import random

    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    numpy_seeded = False
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(seed)
        numpy_seeded = True
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    return {
        "seed": seed,
        "numpy_seeded": numpy_seeded,
        "pythonhashseed": os.environ.get("PYTHONHASHSEED"),
        "deterministic_algorithms": bool(torch.are_deterministic_algorithms_enabled()),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
    }


def describe(command: str, root: str, determinism: dict[str, Any]) -> dict[str, Any]:
    import torch

    cudnn = None
    if torch.backends.cudnn.is_available():
        cudnn = torch.backends.cudnn.version()
    return {
        "command": command,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": f"{platform.system()}-{platform.machine()}",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": cudnn,
        "hip": getattr(torch.version, "hip", None),
        "default_dtype": str(torch.get_default_dtype()).replace("torch.", ""),
        "num_threads": torch.get_num_threads(),
        "determinism": determinism,
        "git": git_revision(root),
    }


def git_revision(start: str) -> dict[str, Any] | None:
    """{'revision': sha, 'branch': name} of the repository containing `start`, if any."""
    path = os.path.abspath(start or ".")
    while True:
        git = os.path.join(path, ".git")
        if os.path.isdir(git):
            return _read_head(git)
        if os.path.isfile(git):  # a worktree or submodule: "gitdir: <path>"
            try:
                with open(git, encoding="utf-8") as handle:
                    text = handle.read().strip()
            except OSError:
                return None
            if text.startswith("gitdir:"):
                target = os.path.join(path, text.split(":", 1)[1].strip())
                return _read_head(os.path.normpath(target))
            return None
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def _read_head(git: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(git, "HEAD"), encoding="utf-8") as handle:
            head = handle.read().strip()
    except OSError:
        return None
    if not head.startswith("ref:"):
        return {"revision": head, "branch": None}
    ref = head.split(":", 1)[1].strip()
    common = git
    commondir = os.path.join(git, "commondir")
    if os.path.isfile(commondir):
        with open(commondir, encoding="utf-8") as handle:
            common = os.path.normpath(os.path.join(git, handle.read().strip()))
    for base in (git, common):
        try:
            with open(os.path.join(base, ref), encoding="utf-8") as handle:
                return {"revision": handle.read().strip(), "branch": ref.rsplit("/", 1)[-1]}
        except OSError:
            pass
    try:
        with open(os.path.join(common, "packed-refs"), encoding="utf-8") as handle:
            for line in handle:
                parts = line.split()
                if len(parts) == 2 and parts[1] == ref:
                    return {"revision": parts[0], "branch": ref.rsplit("/", 1)[-1]}
    except OSError:
        pass
    return {"revision": None, "branch": ref.rsplit("/", 1)[-1]}
