"""Everything decided before a child starts: paths, interpreter, spec, the probe request.

In: the target path and `ReproOptions`. Out: a `Prepared` run (the JSON request the probe will
read, the interpreter, the folders the sandbox must keep readable) or `ReproUsageError`, also on
a platform the probe does not support (Windows) and for a spec whose `step` or `setup` names a
file outside the project root (its folder would be bound into the sandbox). Shared by the cold
runner and the warm worker so that both run exactly the same request.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from torchls.notebook import NotebookError, ReproScript, repro_script
from torchls.probe.locate import find_python, probe_package
from torchls.probe.options import ReproOptions, ReproUsageError, Resolved, resolve_options
from torchls.probe.sandbox import SYSTEM_DIRS, ensure_supported, home_dirs
from torchls.probe.spec import ReproSpec, SpecError, load_spec
from torchls.probe.view import view_folders
from torchls.records import record


@record(frozen=True)
class Prepared:
    file: Path
    root: Path
    python: Path
    probe_package: Path  # staged, read-only, into each run's (or worker's) RunFolder
    resolved: Resolved
    spec: ReproSpec | None
    read_paths: tuple[Path, ...]
    command: str
    cwd: Path = Path("/")
    writable: tuple[Path, ...] = ()
    notes: tuple[str, ...] = ()
    # A notebook's: the code cells the run executes as one script (rows of its module text).
    notebook: ReproScript | None = None

    @property
    def copied(self) -> list[Path]:
        """The folders seen through a copy: the root, the cwd and the writable folders, those
        that may be (a project that is a home folder stays read-only, exposed as before)."""
        fit = [f for f in (self.root, self.cwd, *self.writable) if unfit_folder(f) is None]
        return view_folders(fit[0], fit[0], tuple(fit)) if fit else []

    def request(self, report: Path | None, output: Path | None) -> dict[str, Any]:
        """The probe's JSON request for one run writing its report and output to these files
        (None: the warm worker picks them in the run's own folder)."""
        r = self.resolved
        spec = self.spec
        return {
            "version": 1,
            "file": str(self.file),
            "mode": "function" if spec is not None else "script",
            "root": str(self.root),
            "cwd": str(self.cwd),
            "argv": list(r.options.argv),
            "step": spec.step if spec else None,
            "setup": spec.setup if spec else None,
            "setup_args": dict(spec.setup_args) if spec else {},
            "steps": r.steps,
            "batches": r.batches,
            "device": r.device,
            "allow_fallback": r.allow_fallback,
            "seed": r.seed,
            "deterministic": r.deterministic,
            "timeout_s": r.timeout_s,
            "memory_mb": r.memory_mb,
            "output_cap_bytes": r.options.output_cap_bytes,
            "report_cap_bytes": r.options.report_cap_bytes,
            "out": str(report) if report is not None else None,
            "output_file": str(output) if output is not None else None,
            "command": self.command,
            "source": self.notebook.text if self.notebook is not None else None,
        }


def prepare(path: str | Path, options: ReproOptions | None) -> Prepared:
    ensure_supported()
    options = options or ReproOptions()
    file = Path(path).expanduser().absolute()
    if not file.is_file():
        raise ReproUsageError(f"file not found: {path}")
    spec = None
    if options.spec:
        try:
            spec = load_spec(options.spec)
        except SpecError as error:
            raise ReproUsageError(str(error)) from None
    resolved = resolve_options(options, spec)
    notebook = _notebook(file) if file.suffix == ".ipynb" else None
    root = Path(options.root).expanduser().absolute() if options.root else file.parent
    if not root.is_dir():
        raise ReproUsageError(f"project root is not a folder: {root}")
    python = find_python(options.python, root)
    notes: list[str] = []
    if notebook is not None:
        notes.append(_ran_cells(notebook))
    cwd = Path(options.cwd).expanduser().absolute() if options.cwd else root
    problem = unfit_folder(cwd)
    if problem is not None and options.cwd:
        raise ReproUsageError(f"--cwd {options.cwd}: {problem}")
    if problem is not None and cwd != root:
        notes.append(f"ran from the project root {root}, not {cwd}: {problem}")
        cwd = root
    writable = []
    for folder in options.writable:
        path = Path(folder).expanduser().absolute()
        problem = unfit_folder(path)
        if problem is not None:
            raise ReproUsageError(f"--writable {folder}: {problem}")
        writable.append(path)
    reads = [file.parent, root]
    if spec is not None:
        reads.append(spec.path.absolute().parent)
        for key, reference in (("step", spec.step), ("setup", spec.setup)):
            other, _, _name = (reference or "").rpartition(":")
            if other:
                target = Path(other) if Path(other).is_absolute() else file.parent / other
                _confine(spec.path, key, reference or "", target, root)
                reads.append(target.absolute().parent)
    command = options.command or _command(file, options)
    return Prepared(
        file,
        root,
        python,
        probe_package(),
        resolved,
        spec,
        tuple(reads),
        command,
        cwd,
        tuple(writable),
        tuple(notes),
        notebook,
    )


def _notebook(file: Path) -> ReproScript:
    """The script a repro of the notebook `file` runs (a usage error when there is none)."""
    try:
        return repro_script(file.read_bytes(), str(file))
    except OSError as error:
        raise ReproUsageError(f"cannot read {file}: {error.strerror or error}") from None
    except NotebookError as error:
        raise ReproUsageError(f"{file}: {error}") from None


def _ran_cells(notebook: ReproScript) -> str:
    ran = [number for number in notebook.notebook.map.numbers if number <= notebook.through]
    cells = f"cell {ran[0]}" if len(ran) == 1 else f"cells {ran[0]}-{ran[-1]}"
    if not notebook.found_loop:
        return f"no cell of the notebook trains (reaches backward()): ran every code cell, {cells}"
    return (
        f"ran code {cells} of the notebook as one script "
        f"(cell {notebook.through} is the first that trains)"
    )


def unfit_folder(path: Path) -> str | None:
    """Why `path` cannot be a folder the run works in (seen through a copy), or None: it must
    be an existing folder that is neither `/`, a system folder, nor a home folder or above one
    (copying a home would expose its keys to the run)."""
    if not path.is_dir():
        return "not a folder"
    real = Path(os.path.realpath(path))
    if real == Path("/") or str(real) in SYSTEM_DIRS:
        return "a system folder cannot be seen through a copy"
    for home in home_dirs():
        if real == home or home.is_relative_to(real):
            return (
                f"it is (or holds) the home folder {home}, which the sandbox hides; "
                "run from the project folder or pass --cwd"
            )
    return None


def _confine(spec: Path, key: str, reference: str, target: Path, root: Path) -> None:
    """Refuse a spec reference outside the project root: its folder is bound back into the
    sandbox, so a downloaded project's spec could otherwise expose any folder of the home.
    Checked as written (`..` folded) and with symbolic links resolved."""
    written = Path(os.path.normpath(target.absolute()))
    real = Path(os.path.realpath(target))
    if written.is_relative_to(Path(os.path.normpath(root))) and real.is_relative_to(
        Path(os.path.realpath(root))
    ):
        return
    raise ReproUsageError(
        f"{spec}: {key} {reference!r} is outside the project root {root}: a spec may only "
        "name files inside the project (pass --root to widen it)"
    )


def _command(file: Path, options: ReproOptions) -> str:
    parts = ["torchls", "repro", str(file)]
    for flag, value in (
        ("--device", options.device),
        ("--steps", options.steps),
        ("--timeout", options.timeout_s),
        ("--memory", options.memory_mb),
        ("--python", options.python),
        ("--spec", options.spec),
        ("--nproc", options.nproc),
        ("--nnodes", options.nnodes),
        ("--rdzv-endpoint", options.rdzv_endpoint),
    ):
        if value is not None:
            parts += [flag, str(value)]
    if options.allow_fallback:
        parts.append("--allow-fallback")
    return shlex.join(parts)
