"""The editor's sandbox setting, `torchls.probe.sandbox` (issue #31 part 1), with a real server.

Each run goes through `torchls.runRepro` over stdio, with a bubblewrap on the server's PATH that
always fails (a wrapper that exits 1), so what the run does shows which mode reached it: under
`auto` or `bwrap` it is refused, under `none` it runs, unsandboxed, and the editor says first
that the protections are off. A project's `pyproject.toml` naming `sandbox` cannot weaken it
(its file is refused, the run stays sandboxed), and a misspelt value is rejected with the
allowed values named, leaving the sandbox on. The settings and project-file readers are also
checked on their own.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from lsprotocol import types

from torchls.config import ConfigError, load_config_file
from torchls.lsp.repro_messages import usage_failure
from torchls.lsp.settings import Settings, apply_settings

from .support import TRAIN as FLAGGED
from .support import (
    WEAKER_ISOLATION,
    RecordingClient,
    codes,
    diagnostics_of,
    install_failing_bwrap,
    open_doc,
    opened_quiet_train,
    repro_configuration,
    run_repro,
    session,
)

pytest.importorskip("torch")
if not sys.platform.startswith("linux"):
    pytest.skip("the sandboxed repro runs on Linux", allow_module_level=True)

OPT_OUT = 'the setting `torchls.probe.sandbox: "none"`'


@pytest.fixture
def failing_bwrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A bubblewrap that is installed but fails, first on the PATH the server inherits."""
    return install_failing_bwrap(tmp_path / "failing-bin", monkeypatch)


def _texts(client: RecordingClient) -> list[str]:
    return [m.message for m in client.messages]


async def test_none_reaches_the_run_and_the_editor_says_the_protections_are_off(
    tmp_path: Path, failing_bwrap: Path
):
    root = tmp_path / "workspace"
    async with session(
        "visual_studio_code", configuration=repro_configuration("none"), root=root
    ) as client:
        doc = await opened_quiet_train(client, root / "train.py")
        first = await run_repro(client, doc)
        second = await run_repro(client, doc)

        # Under auto this bubblewrap refuses every run: `none` was the mode the probe got.
        assert first["status"] == second["status"] == "ok", first
        notices = [m for m in client.messages if m.message.startswith(WEAKER_ISOLATION)]
        assert len(notices) == 1, _texts(client)  # once per session, not per run
        notice = notices[0]
        assert notice.type == types.MessageType.Warning
        assert notice.message.startswith(
            f'{WEAKER_ISOLATION}sandbox DEGRADED (torchls.probe.sandbox is "none"): active: '
        )
        # The way back is the setting; bubblewrap is installed, so no advice to install it.
        assert notice.message.endswith(
            'Set `torchls.probe.sandbox` to "auto" to run sandboxed again.'
        )
        assert "Install bubblewrap" not in notice.message
        # Every layer bubblewrap gives is named as missing.
        missing = notice.message.split("NOT active: ", 1)[1]
        for layer in ("bubblewrap", "filesystem", "home"):
            assert layer in missing
        assert not any("refused" in text for text in _texts(client))


async def test_bwrap_with_a_failing_bubblewrap_refuses_and_names_the_setting(
    tmp_path: Path, failing_bwrap: Path
):
    root = tmp_path / "workspace"
    async with session(
        "visual_studio_code", configuration=repro_configuration("bwrap"), root=root
    ) as client:
        doc = await opened_quiet_train(client, root / "train.py")
        result = await run_repro(client, doc)

        assert result["status"] == "failed"
        message = result["message"]
        assert message.startswith(
            "torchls: the repro was refused: sandbox refused (--sandbox bwrap)"
        )
        assert "bwrap: simulated failure" in message
        assert OPT_OUT in message and "`torchls repro --sandbox none FILE`" in message
        assert "no setting" not in message
        errors = [m for m in client.messages if m.type == types.MessageType.Error]
        assert [m.message for m in errors if "sandbox refused" in m.message] == [message]
        assert not any(text.startswith(WEAKER_ISOLATION) for text in _texts(client))


async def test_a_project_file_cannot_turn_the_sandbox_off(tmp_path: Path, failing_bwrap: Path):
    root = tmp_path / "workspace"
    root.mkdir()
    (root / "pyproject.toml").write_text(
        '[tool.torchls.probe]\nsandbox = "none"\nsteps = 1\n', encoding="utf-8"
    )
    async with session(
        "visual_studio_code", configuration=repro_configuration(), root=root
    ) as client:
        doc = await opened_quiet_train(client, root / "train.py")
        result = await run_repro(client, doc)

        # Still sandboxed (auto), so this bubblewrap refuses the run.
        assert result["status"] == "failed"
        assert result["message"].startswith("torchls: the repro was refused: sandbox refused")
        assert OPT_OUT in result["message"]
        said = [text for text in _texts(client) if "sandbox:" in text and "pyproject" in text]
        assert said, _texts(client)
        assert "a project file cannot choose the sandbox" in said[0]
        assert "torchls.probe.sandbox" in said[0]


async def test_a_misspelt_value_is_rejected_with_the_allowed_values_and_the_sandbox_stays_on(
    tmp_path: Path, failing_bwrap: Path
):
    root = tmp_path / "workspace"
    async with session(
        "visual_studio_code", configuration=repro_configuration("off"), root=root
    ) as client:
        doc = await opened_quiet_train(client, root / "train.py")
        result = await run_repro(client, doc)

        invalid = [text for text in _texts(client) if "torchls.probe.sandbox must be" in text]
        assert invalid, _texts(client)
        assert '"auto", "bwrap" or "none"' in invalid[0] and "'off'" in invalid[0]
        assert result["status"] == "failed"
        assert result["message"].startswith("torchls: the repro was refused: sandbox refused")


async def test_turning_none_back_to_auto_sandboxes_the_very_next_run(
    tmp_path: Path, failing_bwrap: Path
):
    """A run under `none` leaves nothing weaker behind (a warm worker, say): once the setting
    is back to auto the next run meets this bubblewrap again and is refused."""
    root = tmp_path / "workspace"
    async with session(
        "visual_studio_code", configuration=repro_configuration("none"), root=root
    ) as client:
        doc = await opened_quiet_train(client, root / "train.py")
        assert (await run_repro(client, doc))["status"] == "ok"
        # A document whose diagnostics the new settings change: their republish says the new
        # settings are in force before the next run is asked for.
        marker = open_doc(client, root / "flagged.py", FLAGGED)
        flagged = codes(await diagnostics_of(client, marker, 0))
        assert flagged
        mark = len(client.publishes)
        changed = {**repro_configuration("auto"), "ignore": sorted(set(flagged))}
        client.set_configuration(changed, section="torchls")
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=None))
        if client.pull:
            assert codes(await diagnostics_of(client, marker, mark)) == []
        else:
            await client.wait_for_publish(lambda p: p.uri == marker.uri and not p.diagnostics, mark)

        result = await run_repro(client, doc)
        assert result["status"] == "failed"
        assert result["message"].startswith("torchls: the repro was refused: sandbox refused")


def test_settings_read_the_three_modes_and_reject_anything_else():
    for raw, mode in (("auto", "auto"), ("bwrap", "bwrap"), (" None ", "none")):
        settings, problems = apply_settings(Settings(), {"probe": {"sandbox": raw}})
        assert (settings.probe.sandbox, problems) == (mode, [])
    # The dotted key some clients send flat, over an earlier layer.
    earlier, _ = apply_settings(Settings(), {"probe": {"sandbox": "bwrap"}})
    later, problems = apply_settings(earlier, {"probe.sandbox": "none"})
    assert (later.probe.sandbox, problems) == ("none", [])
    # Empty is "not set": the lower layer stays.
    kept, problems = apply_settings(earlier, {"probe": {"sandbox": ""}})
    assert (kept.probe.sandbox, problems) == ("bwrap", [])
    for bad in ("off", False, 0):
        kept, problems = apply_settings(earlier, {"probe": {"sandbox": bad}})
        assert kept.probe.sandbox == "bwrap"
        assert len(problems) == 1 and '"auto", "bwrap" or "none"' in problems[0]


def test_a_project_file_naming_sandbox_is_refused_whatever_the_value(tmp_path: Path):
    for value in ("none", "bwrap", "auto"):
        path = tmp_path / value / "pyproject.toml"
        path.parent.mkdir()
        path.write_text(f'[tool.torchls.probe]\nsandbox = "{value}"\n', encoding="utf-8")
        with pytest.raises(ConfigError) as caught:
            load_config_file(path)
        text = str(caught.value)
        assert "[tool.torchls.probe] sandbox: a project file cannot choose the sandbox" in text
        assert "--sandbox" in text and "torchls.probe.sandbox" in text


def test_a_missing_bubblewrap_under_bwrap_names_the_setting():
    message = usage_failure(
        "--sandbox bwrap: bubblewrap is not usable here: bubblewrap is not installed",
        "python",
        "setting",
    )
    assert message.startswith(
        'torchls: the repro could not start: `torchls.probe.sandbox: "bwrap"`'
    )
    assert message.endswith("Install bubblewrap.")
