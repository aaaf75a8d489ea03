"""Options every suite can read: `--device` picks where the probe's repro runs put the user's
tensors (the device machine runs `pytest tests/probe --device cuda`); by default each run keeps
the repro's own default (`auto`: CUDA where there is one, else the CPU).

In: the pytest command line. Out: the `--device` option, read by `tests/probe/conftest.py`.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--device",
        default=None,
        help="device of the probe tests' repro runs (auto, cpu, cuda, cuda:N, mps)",
    )
