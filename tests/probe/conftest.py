"""Fixtures for the probe tests: real torch on CPU, real sandbox, real escape attempts.

`repro(source, **options)` writes a case into a temporary project folder and runs it cold
through the public API (`torchls.probe.run_repro`) with this interpreter (the one that has
torch). `warm_repro` does the same through one warm worker shared by the whole session (one
project folder, so one worker): the finding tests use it to stay fast, while the limit, sandbox
and CLI tests pay for cold starts. The probe package is found from the checkout, exactly as an
installed torchls finds it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from torchls.probe import ReproOptions, ReproReport, run_repro
from torchls.probe.prepare import prepare
from torchls.probe.warm import ReproSession

pytest.importorskip("torch")

# The in-environment probe is a separate top-level package (probes/torchls_probe); its pure
# pieces are unit-tested in-process, so make it importable the way the probe's child sees it.
PROBES = Path(__file__).resolve().parents[2] / "probes"
if str(PROBES) not in sys.path:
    sys.path.insert(0, str(PROBES))


Repro = Callable[..., tuple[ReproReport, Path]]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    folder.mkdir()
    return folder


@pytest.fixture
def device(request: pytest.FixtureRequest) -> str | None:
    """The `--device` the suite was asked to run on (None: the repro's default)."""
    return request.config.getoption("--device")


@pytest.fixture
def repro(project: Path, device: str | None) -> Repro:
    def run(source: str, name: str = "train.py", **options: object) -> tuple[ReproReport, Path]:
        path = project / name
        path.write_text(source, encoding="utf-8")
        options.setdefault("python", sys.executable)
        options.setdefault("timeout_s", 30.0)
        if device is not None:
            options.setdefault("device", device)
        report = run_repro(path, ReproOptions(**options))  # type: ignore[arg-type]
        return report, path

    return run


@pytest.fixture(scope="session")
def warm_session():
    session = ReproSession()
    yield session
    session.close()


@pytest.fixture(scope="session")
def warm_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("warm")


@pytest.fixture
def warm_repro(
    warm_session: ReproSession,
    warm_project: Path,
    request: pytest.FixtureRequest,
    device: str | None,
):
    """Like `repro`, through the shared warm worker; each test gets its own file name."""

    def run(source: str, name: str | None = None, **options: object):
        path = warm_project / (name or f"{request.node.name.replace('[', '_').strip(']')}.py")
        path.write_text(source, encoding="utf-8")
        options.setdefault("python", sys.executable)
        options.setdefault("timeout_s", 30.0)
        if device is not None:
            options.setdefault("device", device)
        opts = ReproOptions(**options)  # type: ignore[arg-type]
        warm_session.prewarm_prepared(prepare(path, opts), wait=True)
        report = warm_session.run(path, opts)
        assert report.data["timing"]["runner"] == "warm", "the warm worker did not serve the run"
        return report, path

    return run
