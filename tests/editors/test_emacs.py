"""torchls in a real, headless Emacs with eglot: Debian's emacs-nox 28 and elpa-eglot 1.9 (apt,
`scripts/apt.d/emacs.txt`).

One `emacs --batch -q` run loads `emacs/init.el` (the README's configuration, with settings in the
project's .dir-locals.el) and `emacs/driver.el`, which does what a user does and reports what
eglot saw: diagnostics with codes and the right columns after an emoji, the code action menu on
a finding (the finding's own fix is eglot's default) and off one (no "fix all" behind a stray
Enter), "Show documentation" arriving as a readable message (eglot has no showDocument), the
fix applied, plain-text hovers (eglot without markdown-mode takes only plain text), the repro
run from the menu without blocking (the command answers at once; the findings and a summary
come later), and `eglot-shutdown` answered within eglot's 1.5 s, after which eglot kills the
server. Nothing of the server may outlive it: no process, no temporary folder.

The Emacs run gets its own HOME and TMPDIR under the test's temporary folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.lsp.test_eglot_like import EGLOT_19_CAPABILITIES, NAN, wait_until_gone
from tests.probe.support import leftovers
from torchls.analysis import get_rule

from .test_neovim import BUGGY_LINE, FIXED_LINE, TRAIN

HERE = Path(__file__).parent / "emacs"
RUN_TIMEOUT_S = 300  # a hung editor fails the test instead of hanging the suite
DIR_LOCALS = """\
((python-mode . ((eglot-workspace-configuration
                  . (:torchls (:ignore ["TL303"] :probe (:device "cpu" :timeout 60)))))))
"""


def find_emacs() -> str:
    emacs = shutil.which("emacs")
    if emacs is None:
        pytest.fail(
            "emacs not found: install Debian's emacs-nox and elpa-eglot "
            "(scripts/apt.d/emacs.txt; ./scripts/test installs them)"
        )
    return emacs


@pytest.fixture(scope="module")
def emacs_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("emacs")
    project = root / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text('[project]\nname = "demo"\nversion = "0"\n')
    (project / ".dir-locals.el").write_text(DIR_LOCALS, encoding="utf-8")
    (project / "train.py").write_text(TRAIN, encoding="utf-8")
    (project / "nan.py").write_text(NAN, encoding="utf-8")
    subprocess.run(["git", "init", "-q", str(project)], check=True)  # eglot's project root
    temp = root / "tmp"
    temp.mkdir()
    home = root / "home"
    home.mkdir()
    report = root / "report.json"
    env = {key: value for key, value in os.environ.items() if not key.startswith("EMACS")}
    env.update(
        HOME=str(home),
        TMPDIR=str(temp),
        TORCHLS_REPORT=str(report),
        TORCHLS_CMD=json.dumps([sys.executable, "-m", "torchls", "server"]),
    )
    command = [find_emacs(), "--batch", "-q", "-l", str(HERE / "init.el")]
    command += ["-l", str(HERE / "driver.el")]
    try:
        done = subprocess.run(
            command,
            cwd=project,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as hung:
        pytest.fail(f"Emacs hung; stderr: {hung.stderr!r}")
    assert report.is_file(), f"no report (exit {done.returncode}): {done.stdout}{done.stderr}"
    result = json.loads(report.read_text(encoding="utf-8"))
    assert result["status"] == "ok", (result.get("error"), done.stderr[-4000:])
    # What outlives Emacs: the server's helper that removes its folders once it is gone, and
    # whatever the killed server started. Wait for all of it to end.
    result["survivors"] = wait_until_gone(leftovers(str(temp)))
    result["temp_entries"] = sorted(path.name for path in temp.iterdir())
    return result


def test_eglot_sends_the_capabilities_the_stdio_tests_use(emacs_run):
    assert json.loads(emacs_run["capabilities"]) == EGLOT_19_CAPABILITIES


def test_diagnostics_arrive_with_codes_columns_and_settings(emacs_run):
    [diagnostic] = emacs_run["diagnostics"]  # TL303 is ignored through .dir-locals.el
    assert (diagnostic["code"], diagnostic["source"], diagnostic["severity"]) == (
        "TL101",
        "torchls",
        1,
    )
    assert diagnostic["text"].startswith("torchls [TL101]: ")
    # Emacs counts characters; the server speaks UTF-16, where the emoji before is two units.
    assert diagnostic["line"] == TRAIN.splitlines().index(BUGGY_LINE) + 1
    assert diagnostic["column"] == BUGGY_LINE.index("probs, y")
    assert diagnostic["end_column"] == diagnostic["column"] + len("probs")


def test_the_menu_defaults_to_the_findings_own_fix(emacs_run):
    menu = emacs_run["menu_on_finding"]
    assert menu["default"].startswith("Fix TL101: ")
    assert "Disable TL101 for this line" in menu["titles"]
    assert "Show documentation for TL101" in menu["titles"]
    assert menu["titles"].index(menu["default"]) < menu["titles"].index(
        "Fix all safely fixable torchls problems"
    )


def test_enter_off_a_finding_applies_nothing(emacs_run):
    assert emacs_run["menu_off_finding"] == {"error": "[eglot] No code actions here"}
    assert emacs_run["unchanged_after_enter_off_finding"] is True


def test_documentation_arrives_as_a_readable_message(emacs_run):
    [page] = [m for m in emacs_run["messages"] if "What it catches" in m["message"]]
    text = page["message"]
    assert text.startswith(f"TL101 {get_rule('TL101').name}\n")
    assert "##" not in text and "`" not in text and "```" not in text


def test_the_fix_is_applied_and_the_finding_goes(emacs_run):
    assert emacs_run["fixed_line"] == FIXED_LINE
    assert emacs_run["diagnostics_after_fix"] == []


def test_hovers_are_plain_text(emacs_run):
    hover = emacs_run["hover"]
    assert hover["kind"] == "plaintext"
    assert hover["text"].startswith("CrossEntropyLoss contract")
    assert "raw logits" in hover["text"]
    assert "**" not in hover["text"] and "`" not in hover["text"]
    trace = emacs_run["trace_hover"]["text"]
    assert "|" not in trace and "**" not in trace
    header = next(line for line in trace.splitlines() if line.startswith("expression"))
    row = next(line for line in trace.splitlines() if line.startswith("torch.log(probs)"))
    # Aligned columns: each cell starts under its heading.
    assert row.index("[8, 3]") == header.index("shape")


def test_the_repro_runs_without_blocking(emacs_run):
    assert emacs_run["menu_repro"]["titles"] == ["Run bounded repro"]
    assert emacs_run["menu_repro"]["answer"] == "started"
    # The menu (and eglot's request) returned before the run's findings existed ...
    assert emacs_run["probe_findings_when_the_command_returned"] is None
    started = [m for m in emacs_run["messages"] if "running the repro of nan.py" in m["message"]]
    assert len(started) == 1
    # ... which came later, as diagnostics and as a short message.
    [tl901] = emacs_run["probe_diagnostics"]
    assert tl901["code"] == "TL901"
    assert tl901["line"] == NAN.splitlines().index('    tag = "🔥"; logp = torch.log(probs)') + 1
    summary = [m for m in emacs_run["messages"] if "repro of nan.py: ok" in m["message"]]
    assert len(summary) == 1 and "TL901" in summary[0]["message"]


def test_shutdown_is_answered_and_nothing_is_left_behind(emacs_run):
    assert emacs_run["shutdown"] == "answered"  # not eglot's "Timed out"
    assert emacs_run["server_status_after_shutdown"] in ("signal", "exit")
    assert emacs_run["survivors"] == []
    assert emacs_run["temp_entries"] == []
