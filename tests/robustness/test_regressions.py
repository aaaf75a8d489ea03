"""Regression tests for bugs the robustness and escape suites found (all fixed).

Each test states the wanted behaviour and would fail again if its bug came back. A failure
stays bounded: a hang is cut off by a safety-net wait, and anything that could exhaust memory
runs in a subprocess under an address-space limit. Groups: the analysis and its fixes,
`torchls check`, and the language server (the sandbox's are in
tests/probe/test_sandbox_regressions.py).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from tests.lsp.support import MIXED
from tests.robustness.rpc import EXIT_WAIT_S, RawServer, frame
from torchls.analysis import analyze
from torchls.analysis.fixes import apply_fixes, fixes_to_apply

ROOT = Path(__file__).resolve().parents[2]
HANG_WAIT_S = 30.0  # for whole runs (a cold repro imports torch) that hang today
ANSWER_WAIT_S = 10.0  # for answers that come at once
MEMORY_CAP = 2 << 30  # address space for a subprocess that would otherwise fill the machine


def run_capped(argv: list[str], timeout: float, cwd: Path | None = None, stdin: bytes = b""):
    """Run `argv` in its own session with RLIMIT_AS = MEMORY_CAP; kill the whole session when
    it outlives `timeout`. Returns (exit status or None when it had to be killed, output)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))

    process = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        start_new_session=True,
        preexec_fn=limit,
    )
    try:
        output, _ = process.communicate(stdin, timeout=timeout)
        return process.returncode, output.decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        return None, output.decode("utf-8", "replace")


# == the analysis and its fixes =================================================================

FULL_BATCH = """\
import torch
import torch.nn.functional as F


def evaluate(model, data):
    model.eval()
    with torch.no_grad():
        return F.cross_entropy(model(data.x), data.y).item()


def train(model, data, optimizer, epochs):
    model.train()
    for epoch in range(epochs):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data.x), data.y)
        loss.backward()
        optimizer.step()
        print(epoch, evaluate(model, data))
"""


def test_tl203_fix_for_full_batch_training_removes_the_finding() -> None:
    """Full-batch training (the usual graph-network loop: one step per epoch, no inner batch
    loop) with an evaluation in the epoch loop. TL203 is right, but its fix inserts
    `model.train()` before the epoch loop, where it already is: the finding stays, and
    `torchls check --fix --unsafe-fixes` adds the same line again on every pass (5 copies)."""
    [finding] = [f for f in analyze(FULL_BATCH).findings if f.code == "TL203"]
    fixed, _ = apply_fixes(FULL_BATCH, [finding.fix])
    assert "TL203" not in [f.code for f in analyze(fixed).findings], fixed
    again, applied = apply_fixes(fixed, fixes_to_apply(analyze(fixed).findings, unsafe=True))
    assert applied == 0, again


SWA = """\
import torch
from torch.optim.swa_utils import SWALR


def train_one_epoch(model, loader, optimizer):
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()


def fit(model, loader, epochs):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    swa_scheduler = SWALR(optimizer, swa_lr=0.05)
    for epoch in range(epochs):
        train_one_epoch(model, loader, optimizer)
        swa_scheduler.step()
"""


def test_swa_scheduler_is_not_taken_for_an_optimizer() -> None:
    """`torch.optim.swa_utils.SWALR` is a learning-rate scheduler. TL204 (gradients never
    cleared) is right about `optimizer` on line 9, but it is also reported on
    `swa_scheduler.step()` with an unsafe fix that inserts `swa_scheduler.zero_grad(...)`,
    which would raise AttributeError at run time."""
    findings = analyze(SWA).findings
    on_scheduler = [f for f in findings if "swa_scheduler" in f.message]
    assert on_scheduler == [], [(f.code, f.span.start.row, f.message) for f in on_scheduler]
    fixed, _ = apply_fixes(SWA, fixes_to_apply(findings, unsafe=True))
    assert "swa_scheduler.zero_grad" not in fixed


WARNS = (
    "import torch.nn.functional as F; ids = [0x1for y in z]\n"
    "def step(logits, y):\n"
    "    probs = F.softmax(logits, dim=1)\n"
    "    return F.cross_entropy(probs, y)\n"
)


def test_compiler_warnings_do_not_change_the_findings() -> None:
    """`ast.parse` emits SyntaxWarnings (`0x1for`, invalid escapes) through the warnings
    module. Under a warnings-as-errors filter (PYTHONWARNINGS=error, `python -W error`, a test
    runner) they become syntax errors: the line is blanked and the TL101 below is lost."""
    expected = [f.code for f in analyze(WARNS).findings]
    assert expected == ["TL101"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [f.code for f in analyze(WARNS).findings] == expected


# == torchls check ==============================================================================

CHECK = [sys.executable, "-m", "torchls", "check"]


def test_check_survives_a_symlink_loop_named_like_a_module(tmp_path: Path) -> None:
    """`a.py -> b.py -> a.py` in a checked folder: RuntimeError "Symlink loop" from
    Path.resolve() in checker.discover, a traceback and exit status 1."""
    (tmp_path / "good.py").write_text("import torch\n")
    (tmp_path / "a.py").symlink_to(tmp_path / "b.py")
    (tmp_path / "b.py").symlink_to(tmp_path / "a.py")
    status, output = run_capped([*CHECK, str(tmp_path)], timeout=60)
    assert status in (0, 1, 2) and "Traceback" not in output, output[-2000:]


def test_check_does_not_block_on_a_fifo_named_like_a_module(tmp_path: Path) -> None:
    """A named pipe `pipe.py` in a checked folder: the walk opens and reads it, and blocks
    forever. (Named explicitly, it is reported as not found, correctly.)"""
    (tmp_path / "good.py").write_text("import torch\n")
    os.mkfifo(tmp_path / "pipe.py")
    status, output = run_capped([*CHECK, str(tmp_path)], timeout=HANG_WAIT_S)
    assert status is not None, "torchls check hung on a FIFO"
    assert status in (0, 1, 2) and "Traceback" not in output, output[-2000:]


def test_check_does_not_read_a_device_named_like_a_module(tmp_path: Path) -> None:
    """`zero.py -> /dev/zero` in a checked folder: the walk reads it to the end, which never
    comes (MemoryError here, under a 2 GiB cap; the whole machine's memory without one)."""
    (tmp_path / "good.py").write_text("import torch\n")
    (tmp_path / "zero.py").symlink_to("/dev/zero")
    status, output = run_capped([*CHECK, str(tmp_path)], timeout=60)
    assert status in (0, 1, 2) and "Traceback" not in output, output[-2000:]


def test_check_prints_no_compiler_warnings(tmp_path: Path) -> None:
    """Python's own SyntaxWarnings about the checked code leak to stderr with no file name:
    `<unknown>:1: SyntaxWarning: invalid hexadecimal literal`."""
    path = tmp_path / "warns.py"
    path.write_text(WARNS)
    done = subprocess.run(
        [*CHECK, "--color", "never", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 1
    assert "<unknown>" not in done.stderr and "SyntaxWarning" not in done.stderr, done.stderr


# == the language server ========================================================================


@pytest.fixture
def server(tmp_path: Path):
    raw = RawServer(tmp_path / "server-stderr.txt")
    raw.initialize()
    yield raw
    raw.close()


HOVER = {
    "textDocument": {"uri": "file:///nowhere/unopened.py"},
    "position": {"line": 0, "character": 0},
}


def answer_to(server: RawServer, ident: int) -> dict:
    return server.wait_for(lambda m: m.get("id") == ident and "method" not in m, 0, ANSWER_WAIT_S)


@pytest.mark.parametrize(
    "params",
    [
        {"x": 1},
        {"textDocument": {"uri": 5}, "position": {"line": "a", "character": 0}},
        {"textDocument": {"uri": "file:///x.py"}, "position": {"line": -1, "character": 0}},
        None,
    ],
    ids=["unknown fields", "wrong types", "negative line", "no params"],
)
def test_request_with_invalid_params_gets_an_error(server: RawServer, params) -> None:
    """JSON-RPC: a request whose params do not match gets InvalidParams (-32602). pygls failed
    to deserialise it, logged, and never answered: the client waited forever."""
    message = {"jsonrpc": "2.0", "id": 4242, "method": "textDocument/hover"}
    if params is not None:
        message["params"] = params
    server.send_bytes(frame(message))
    answer = answer_to(server, 4242)
    assert answer.get("error", {}).get("code") == -32602, answer


def test_unknown_request_without_params_gets_method_not_found(server: RawServer) -> None:
    """`params` is optional in JSON-RPC. An unknown method with params was answered -32601;
    the same request without params was never answered (the error was only logged)."""
    server.send_bytes(frame({"jsonrpc": "2.0", "id": 4343, "method": "torchls/noSuchThing"}))
    answer = answer_to(server, 4343)
    assert answer.get("error", {}).get("code") == -32601, answer


def test_absurd_content_length_does_not_kill_the_server(server: RawServer) -> None:
    """`Content-Length: 99999999999999`: pygls asked stdin for that many bytes at once, Python
    raised MemoryError in the reader and the server exited with status 1."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "textDocument/hover"}).encode()
    server.send_bytes(b"Content-Length: 99999999999999\r\n\r\n" + body + b"\r\n")
    since = len(server.messages)
    ident = server.request("textDocument/hover", HOVER)
    server.wait_for(lambda m: m.get("id") == ident, since, ANSWER_WAIT_S)
    assert server.alive()


@pytest.mark.parametrize(
    "bad_frame",
    [
        frame(b'{"jsonrpc": "2.0", "method": "initialized", "params": {}}', length=20),
        b"Content-Length: twelve\r\n\r\n{}",
        b"\r\n{}",
        b"x" * 200_000,  # noise longer than a header line may be, then a real header
    ],
    ids=["short length", "non-numeric length", "no header", "long noise"],
)
def test_one_unrecognised_frame_does_not_lose_every_later_message(
    server: RawServer, bad_frame: bytes
) -> None:
    """A body never ends with a line break, so after a frame the reader did not recognise,
    the rest of it and the next header share one line; pygls wanted `Content-Length` at the
    start of a line, so it skipped that header, glued its body onto the next one, and lost
    every later message."""
    server.send_bytes(bad_frame)
    since = len(server.messages)
    idents = [server.request("textDocument/hover", HOVER) for _ in range(3)]
    for ident in idents:
        server.wait_for(lambda m, i=ident: m.get("id") == i and "method" not in m, since)


def test_requests_after_shutdown_are_refused_not_ignored(server: RawServer) -> None:
    """LSP: after `shutdown`, requests other than `exit` get InvalidRequest (-32600); pygls
    dropped them, so a client waiting for an answer waited forever."""
    server.call("shutdown")
    ident = server.request("textDocument/hover", HOVER)
    assert answer_to(server, ident).get("error", {}).get("code") == -32600


@pytest.mark.parametrize(("handshake", "status"), [(True, 0), (False, 1)])
def test_exit_status_follows_the_shutdown_handshake(
    tmp_path: Path, handshake: bool, status: int
) -> None:
    """LSP: `exit` ends the server with 0 after `shutdown` and 1 without it. pygls raised
    SystemExit(1) inside its handler and then swallowed it: the status was always 0."""
    server = RawServer(tmp_path / "server-stderr.txt")
    try:
        server.initialize()
        if handshake:
            answer = server.call("shutdown")
            assert "error" not in answer, answer
        server.notify("exit")
        assert server.wait_exit() == status
    finally:
        server.close()


def test_shutdown_while_a_handler_waits_for_the_client_succeeds(tmp_path: Path) -> None:
    """`shutdown` cancels every pending handler while walking pygls' table of them; a
    cancelled future whose done-callback removed itself from that table made `shutdown` fail
    with "dictionary changed size during iteration" (found after the leak fix above). Here
    `initialized` waits for a `workspace/configuration` answer that never comes."""
    server = RawServer(tmp_path / "server-stderr.txt")
    try:
        server.unanswered.add("workspace/configuration")
        server.initialize({"workspace": {"configuration": True}})
        server.wait_for(lambda m: m.get("method") == "workspace/configuration")
        answer = server.call("shutdown")
        assert "error" not in answer, answer
    finally:
        server.close()


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
        return int(next(line for line in handle if line.startswith("VmRSS:")).split()[1])


SOAK_TEXT = (
    "import torch.nn.functional as F\n"
    "def step(logits, y):\n"
    "    probs = F.softmax(logits, dim=1)\n"
    "    return F.cross_entropy(probs, y)\n"
    "# soak\n"
)


def test_server_memory_stays_flat_over_ten_thousand_edits(tmp_path: Path) -> None:
    """pygls 2.1.1 kept a finished Future in `JsonRPCProtocol._request_futures`, under a fresh
    uuid, for every notification it ran through its built-in generator handlers (didOpen,
    didChange, ...): about 2 KB per keystroke, 109 MiB after 30,000 edits. Wanted (and now
    measured): at most 15 % growth from 1,000 to 11,000 edits."""
    server = RawServer(tmp_path / "server-stderr.txt")
    try:
        server.initialize()
        uri = (tmp_path / "typed.py").as_uri()
        line = SOAK_TEXT.count("\n") - 1  # the "# soak" line
        server.open(uri, SOAK_TEXT, version=0)
        figures = {}
        for version in range(1, 11_001):
            start = {"line": line, "character": 6}
            if version % 2:
                change = {"range": {"start": start, "end": start}, "text": "x"}
            else:
                end = {"line": line, "character": 7}
                change = {"range": {"start": start, "end": end}, "text": ""}
            server.notify(
                "textDocument/didChange",
                {"textDocument": {"uri": uri, "version": version}, "contentChanges": [change]},
            )
            if version in (1_000, 11_000):
                server.wait_for_publish(uri, version, len(server.messages))
                figures[version] = _rss_kb(server.process.pid)
                server.messages.clear()
        assert figures[11_000] <= figures[1_000] * 1.15, figures
    finally:
        server.close()


def test_server_exits_when_the_client_process_dies(tmp_path: Path) -> None:
    """LSP `initialize.processId`: "If the parent process is not alive then the server should
    exit". A client that dies while something else still holds the server's stdin (a wrapper
    script, a terminal multiplexer) leaves it running forever; pygls records the id but never
    watches it."""
    client = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    server = RawServer(tmp_path / "server-stderr.txt")
    try:
        server.call("initialize", {"processId": client.pid, "capabilities": {}})
        server.notify("initialized", {})
        client.kill()
        client.wait()
        assert server.wait_exit(EXIT_WAIT_S) is not None, "the server outlived its client"
    finally:
        client.kill()
        client.wait()
        server.close()


def test_document_uri_with_a_nul_is_still_analysed(server: RawServer) -> None:
    """`file:///tmp/%00x.py`: the path has a NUL byte, so `Path.resolve()` (config lookup,
    repro store) raises ValueError. The analysis is reported as an internal error and the
    document silently gets no diagnostics; hover answers with an internal error (-32603)."""
    uri = "file:///tmp/%00train.py"
    server.open(uri, MIXED)
    published = server.wait_for_publish(uri, 1)
    assert {d["code"] for d in published["diagnostics"]} >= {"TL101"}
    hover = server.call("textDocument/hover", {"textDocument": {"uri": uri}, **HOVER})
    assert "error" not in hover, hover


# backward() many times in one loop: TL207 compares every pair of calls, so its time grows with
# the square of their number (4,000 calls: 1 s; 8,000: 3.3 s; 20,000: 17 s; this: over a minute).
PATHOLOGICAL = "import torch\nfor batch in loader:\n" + "".join(
    f"    out{i} = model(batch)\n    out{i}.sum().backward()\n" for i in range(40_000)
)


def test_a_pathological_document_does_not_stall_the_others(tmp_path: Path) -> None:
    """The analysis budget (TORCHLS_ANALYSIS_BUDGET_S, 3 s) is only checked between rules, so
    one slow rule holds the single analysis thread: the diagnostics of every other document
    wait behind it. The wait below is a safety net of 30 s against well over a minute of work,
    not a timing assertion."""
    assert len(PATHOLOGICAL) < 5_000_000  # under the server's size cap: it is analysed
    server = RawServer(tmp_path / "server-stderr.txt")
    try:
        server.initialize()
        slow = (tmp_path / "slow.py").as_uri()
        small = (tmp_path / "small.py").as_uri()
        server.open(slow, PATHOLOGICAL)
        server.open(small, MIXED)
        published = server.wait_for_publish(small, 1)
        assert {d["code"] for d in published["diagnostics"]} >= {"TL101"}
        server.wait_for_publish(slow, 1)  # ... and the slow one is published too
    finally:
        server.close()


# == the runtime probe's sandbox ================================================================
