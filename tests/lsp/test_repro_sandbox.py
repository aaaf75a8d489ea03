"""The editor's side of a sandbox that fails closed (issue #31 item 1), with a real server.

Without bubblewrap on the server's PATH the repro runs degraded, and the editor says so once
per session, its first words naming the active and the missing protections; with a bubblewrap
that is installed but fails (a wrapper on PATH that exits 1) every run is refused, with the
reason and the way to opt out, and nothing is published.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from lsprotocol import types

from torchls.lsp.repro_messages import sandbox_cause, sandbox_problem, usage_failure

from .support import (
    WEAKER_ISOLATION,
    install_failing_bwrap,
    opened_quiet_train,
    repro_configuration,
    run_repro,
    session,
)

pytest.importorskip("torch")
if not sys.platform.startswith("linux"):
    pytest.skip("the sandboxed repro runs on Linux", allow_module_level=True)

CONFIGURATION = repro_configuration()
WEAKER = f"{WEAKER_ISOLATION}sandbox DEGRADED"


async def test_without_bubblewrap_the_editor_says_degraded_once_per_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    empty = tmp_path / "no-bwrap-bin"
    empty.mkdir()
    # The server inherits this PATH: no bubblewrap is found there.
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{empty}")
    root = tmp_path / "workspace"
    async with session("visual_studio_code", configuration=CONFIGURATION, root=root) as client:
        doc = await opened_quiet_train(client, root / "train.py")
        first = await run_repro(client, doc)
        second = await run_repro(client, doc)

        assert first["status"] == second["status"] == "ok"
        notices = [m for m in client.messages if m.message.startswith(WEAKER)]
        assert len(notices) == 1, [m.message for m in client.messages]
        notice = notices[0]
        assert notice.type == types.MessageType.Warning
        assert "(bubblewrap is not installed" in notice.message
        assert "active: " in notice.message and "NOT active: bubblewrap, filesystem, home" in (
            notice.message
        )
        assert "Install bubblewrap" in notice.message


async def test_a_failing_bubblewrap_refuses_every_run_in_the_editor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    install_failing_bwrap(tmp_path / "failing-bin", monkeypatch)
    root = tmp_path / "workspace"
    async with session("visual_studio_code", configuration=CONFIGURATION, root=root) as client:
        doc = await opened_quiet_train(client, root / "train.py")
        results = [await run_repro(client, doc), await run_repro(client, doc)]

        for result in results:
            assert result["status"] == "failed"
            message = result["message"]
            assert message.startswith("torchls: the repro was refused: sandbox refused")
            assert "bwrap: simulated failure" in message
            assert "torchls repro --sandbox none FILE" in message
        errors = [m for m in client.messages if m.type == types.MessageType.Error]
        assert len([m for m in errors if "sandbox refused" in m.message]) == 2
        assert not any(m.message.startswith(WEAKER) for m in client.messages)


def test_the_notice_leads_with_the_reports_protections_line():
    data = {
        "sandbox": {
            "degraded": ["bubblewrap", "filesystem"],
            "summary": "sandbox DEGRADED (bubblewrap is not installed): active: memory; "
            "NOT active: bubblewrap, filesystem",
        }
    }
    message = sandbox_problem(data)
    assert message is not None
    assert message.startswith(
        "torchls: the repro ran with weaker isolation: sandbox DEGRADED (bubblewrap is not "
        "installed): active: memory; NOT active: bubblewrap, filesystem."
    )
    full = {"sandbox": {"degraded": [], "summary": None}}
    assert sandbox_problem(full) is None


def test_a_refusal_names_the_cli_opt_out_in_the_editor():
    refusal = (
        "sandbox refused (--sandbox auto): bubblewrap is installed (/usr/bin/bwrap) but failed "
        "3 trials (bubblewrap cannot create namespaces here: x); the run was not started rather "
        "than run with weaker isolation (the host's /tmp and home writable). Fix bubblewrap (it "
        "needs unprivileged user namespaces), or opt out of the sandbox explicitly with "
        "--sandbox none"
    )
    message = usage_failure(refusal, "python", "setting")
    assert message.startswith("torchls: the repro was refused: sandbox refused")
    assert "Install bubblewrap" not in message  # it is installed: fixing it is the advice
    assert "`torchls repro --sandbox none FILE`" in message


def test_a_cold_run_and_the_warm_worker_share_one_cause():
    """The warm worker holds a PID namespace a cold run without bubblewrap lacks: their
    notices differ, their cause (bubblewrap's state) does not, so it is told once."""
    bwrap = {"name": "bubblewrap", "held": False, "detail": "bubblewrap is not installed"}
    cold = {"sandbox": {"layers": [bwrap], "degraded": ["bubblewrap", "pid_namespace"]}}
    warm = {"sandbox": {"layers": [bwrap], "degraded": ["bubblewrap"]}}
    assert sandbox_cause(cold) == sandbox_cause(warm) == "bubblewrap: bubblewrap is not installed"
    held = {"name": "bubblewrap", "held": True, "detail": "/usr/bin/bwrap"}
    home = {"sandbox": {"layers": [held], "degraded": ["home"]}}
    assert sandbox_cause(home) == "layers: home"
