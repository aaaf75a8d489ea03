"""The CLI and the editor read a project the same way: one test drives both on each layout.

Layouts: no pyproject.toml at all, nested ones (a file without a `[tool.torchls]` table is
walked past, the innermost table wins, per-file ignores apply), and a nearest pyproject.toml
that is not valid TOML (an error for both, which never walk on to the table further up). For
each, `torchls check` (JSON, then `--fix` through stdin) and the language server over stdio
(diagnostics, their fix data, then fix-all) must give the same findings and the same fixed text.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from lsprotocol import types

from .support import RecordingClient, diagnostics_of, edits_in, open_doc
from .test_code_actions import request_actions, whole

# ASCII only, so code-point (CLI) and UTF-16/UTF-8 (editor) columns coincide.
TRAIN = """\
import torch
import torch.nn.functional as F


def train(model, loader, optimizer, checkpoint):
    model.load_state_dict(torch.load(checkpoint))
    for x, y in loader:
        logits = model(x)
        probs = F.softmax(logits, dim=1)
        loss = F.cross_entropy(probs, y.float())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""

LAYOUTS: dict[str, dict[str, str]] = {
    "missing": {"proj/train.py": TRAIN},
    "nested": {
        "proj/pyproject.toml": '[tool.torchls]\nignore = ["TL302"]\n',
        # No [tool.torchls] table: walked past, so proj/sub/train.py gets proj's table.
        "proj/sub/pyproject.toml": '[project]\nname = "sub"\n',
        "proj/sub/train.py": TRAIN,
        "proj/sub/deeper/pyproject.toml": (
            '[tool.torchls]\nselect = ["TL1"]\n\n'
            '[tool.torchls.per-file-ignores]\n"train.py" = ["TL106"]\n'
        ),
        "proj/sub/deeper/train.py": TRAIN,
    },
    "broken": {
        "proj/pyproject.toml": '[tool.torchls]\nselect = ["TL3"]\n',
        # Not valid TOML, and it does not mention torchls: still an error, never skipped.
        "proj/sub/pyproject.toml": '[project\nname = "sub"\n',
        "proj/sub/train.py": TRAIN,
    },
}


def _cli(cwd: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torchls", "check", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )


def _cli_view(cwd: Path, path: Path) -> tuple[list[tuple], str]:
    """(findings as (code, row, column, end row, end column, fix), `--fix` text) from the CLI."""
    found = _cli(cwd, "--output-format", "json", str(path))
    assert found.returncode in (0, 1), found.stderr
    findings = [
        (
            item["code"],
            item["location"]["row"],
            item["location"]["column"],
            item["end_location"]["row"],
            item["end_location"]["column"],
            None if item["fix"] is None else (item["fix"]["applicability"], item["fix"]["message"]),
        )
        for item in json.loads(found.stdout)
    ]
    fixed = _cli(cwd, "--fix", "--stdin-filename", str(path), "-", stdin=path.read_text())
    assert fixed.returncode in (0, 1), fixed.stderr
    return sorted(findings), fixed.stdout


async def _editor_view(client: RecordingClient, path: Path) -> tuple[list[tuple], str]:
    """The same two things from the language server: diagnostics and fix-all."""
    since = len(client.publishes)
    text = path.read_text()
    doc = open_doc(client, path, text)
    diagnostics = await diagnostics_of(client, doc, since)
    findings = []
    for diagnostic in diagnostics:
        fix = (diagnostic.data or {}).get("fix")
        start, end = diagnostic.range.start, diagnostic.range.end
        findings.append(
            (
                diagnostic.code,
                start.line + 1,
                start.character + 1,
                end.line + 1,
                end.character + 1,
                None if fix is None else (fix["applicability"], fix["message"]),
            )
        )
    actions = await request_actions(client, doc, whole(text), [], only=["source.fixAll"])
    fixed = text
    for action in actions:
        assert action.edit is not None
        for edit in edits_in(action.edit, doc, client.document_changes):
            fixed = _apply(fixed, edit)
    return sorted(findings), fixed


def _apply(text: str, edit: types.TextEdit) -> str:
    lines = text.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))

    def at(position: types.Position) -> int:
        return offsets[position.line] + position.character

    return text[: at(edit.range.start)] + edit.new_text + text[at(edit.range.end) :]


def _write(root: Path, files: dict[str, str]) -> None:
    for name, content in files.items():
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)


@pytest.mark.parametrize("layout", ["missing", "nested"])
async def test_cli_and_editor_agree_on_findings_and_fixes(
    client: RecordingClient, tmp_path: Path, layout: str
):
    _write(tmp_path, LAYOUTS[layout])
    trains = sorted(tmp_path.rglob("train.py"))
    seen = {}
    for train in trains:
        cli = _cli_view(tmp_path, train)
        editor = await _editor_view(client, train)
        assert editor == cli, train
        seen[train.relative_to(tmp_path).as_posix()] = {finding[0] for finding in cli[0]}
        assert cli[1] != TRAIN  # every layout leaves a safe fix (TL101) to apply
    if layout == "nested":
        # The configurations really differ per folder, so agreeing is not a coincidence.
        assert seen["proj/sub/train.py"] == {"TL101", "TL106"}
        assert seen["proj/sub/deeper/train.py"] == {"TL101"}
    else:
        assert seen["proj/train.py"] == {"TL101", "TL106", "TL302"}


async def test_a_broken_nearest_pyproject_is_a_problem_for_both(
    client: RecordingClient, tmp_path: Path
):
    _write(tmp_path, LAYOUTS["broken"])
    train = tmp_path / "proj" / "sub" / "train.py"
    broken = str((tmp_path / "proj" / "sub" / "pyproject.toml").resolve())

    cli = _cli(tmp_path, str(train))
    assert cli.returncode == 2
    assert broken in cli.stderr

    editor = await _editor_view(client, train)
    warnings = [m.message for m in client.messages if broken in m.message]
    assert warnings, [m.message for m in client.messages]
    # The editor goes on with the defaults (never with proj's select = ["TL3"] further up):
    # exactly what the CLI finds for the same file in a folder with no configuration.
    _write(tmp_path / "plain", {"train.py": TRAIN})
    assert editor == _cli_view(tmp_path / "plain", tmp_path / "plain" / "train.py")
