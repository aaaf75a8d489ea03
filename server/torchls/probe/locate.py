"""Finding the two things a run needs on disk: the probe package and the user's interpreter.

In: the options and the target file. Out: the `torchls_probe` package folder, which each run gets
a private read-only copy of on its PYTHONPATH (scratch.py), so that `python -m torchls_probe`
works in an interpreter that does not have torchls installed (copied, because the folder torchls
is installed in also holds torchls's own dependencies, which must not shadow the user's), and the
interpreter to run (`choose_python`: the `--python` option, else the project's own virtual
environment, else the one running torchls when it has torch, else `python3`).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

from torchls.probe.options import ReproUsageError


def probe_package() -> Path:
    """The `torchls_probe` package folder (installed, or in a source checkout)."""
    spec = importlib.util.find_spec("torchls_probe")
    if spec is not None and spec.origin:
        return Path(spec.origin).resolve().parent
    # A source checkout that is not installed: server/torchls/probe -> probes/torchls_probe.
    checkout = Path(__file__).resolve().parents[3] / "probes" / "torchls_probe"
    if (checkout / "__main__.py").is_file():
        return checkout
    raise ReproUsageError("the torchls_probe package is missing from this torchls installation")


VENV_REASON = "the project's virtual environment"
OWN_REASON = "the interpreter running torchls"
PATH_REASON = "`python3` on PATH, the default"


def choose_python(explicit: str | None, root: Path) -> tuple[Path, str]:
    """(the interpreter that has the user's torch, why it was chosen), the one choice both
    `torchls repro` and the editor make: `explicit` (flag, setting or [tool.torchls.probe]),
    else the project's virtual environment, else the interpreter running torchls when it has
    torch, else `python3` on PATH (a torchls installed on its own, by pipx say, has no torch)."""
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_absolute() and os.sep not in explicit:
            found = shutil.which(explicit)
            path = Path(found) if found else path
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ReproUsageError(f"--python {explicit}: no executable interpreter there")
        return path.absolute(), "the interpreter asked for"
    for folder in (root, *root.parents):
        for venv in (".venv", "venv"):
            candidate = folder / venv / "bin" / "python"
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate, VENV_REASON
        if (folder / ".git").exists() or (folder / "pyproject.toml").exists():
            break
    if importlib.util.find_spec("torch") is not None:
        return Path(sys.executable), OWN_REASON
    python3 = shutil.which("python3")
    return (Path(python3), PATH_REASON) if python3 else (Path(sys.executable), OWN_REASON)


def find_python(explicit: str | None, root: Path) -> Path:
    """The interpreter that has the user's torch (see `choose_python`)."""
    return choose_python(explicit, root)[0]
