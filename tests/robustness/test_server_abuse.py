"""The real language server, over real stdio, under abuse: it keeps serving and exits cleanly.

Malformed JSON-RPC (bad JSON, odd framing, missing or wrong fields), unknown methods, invalid
params, stale and duplicate document versions, a 1,000-keystroke typing session with hover and
code-action requests in between, `$/cancelRequest`, and a client that dies without `exit`.
The messages are framed by hand (tests/robustness/rpc.py) because a real client library refuses
to send most of them. "Still serving" is checked by a request answered after the abuse.

Behaviour that is wrong today is tested in test_found_bugs.py instead.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from lsprotocol import types

from tests.lsp.support import MIXED, apply_edit, client_column
from tests.robustness.rpc import EXIT_WAIT_S, RawServer, frame
from torchls.analysis import analyze

REQUEST_CANCELLED = -32800
CONTENT_MODIFIED = -32801
METHOD_NOT_FOUND = -32601
HOVER_NOWHERE = {
    "textDocument": {"uri": "file:///nowhere/unopened.py"},
    "position": {"line": 0, "character": 0},
}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RawServer]:
    raw = RawServer(tmp_path / "server-stderr.txt")
    raw.initialize({"general": {"positionEncodings": ["utf-16"]}})
    yield raw
    raw.close()


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RawServer]:
    """One server for the well-framed junk: each message must leave it serving the next."""
    raw = RawServer(tmp_path_factory.mktemp("abuse") / "server-stderr.txt")
    raw.initialize()
    yield raw
    raw.close()


def assert_serving(server: RawServer) -> None:
    since = len(server.messages)
    answer = server.response(server.request("textDocument/hover", HOVER_NOWHERE), since)
    assert "result" in answer, answer
    assert server.alive()


def lsp_position(text: str, offset: int) -> dict[str, int]:
    """The UTF-16 LSP position of code-point `offset` in `text`."""
    line = text.count("\n", 0, offset)
    start = text.rfind("\n", 0, offset) + 1
    row = text[start:].split("\n", 1)[0]
    return {"line": line, "character": client_column(row, offset - start, "utf-16")}


def torchls_diagnostics(params: dict) -> list[tuple[str, dict]]:
    return sorted(
        (d["code"], d["range"]) for d in params["diagnostics"] if d.get("source") == "torchls"
    )


def expected_diagnostics(text: str, path: Path) -> list[tuple[str, dict]]:
    found = []
    for finding in analyze(text, str(path)).findings:
        lines = text.split("\n")
        start, end = finding.span.start, finding.span.end
        lsp_range = {
            "start": {
                "line": start.row - 1,
                "character": client_column(lines[start.row - 1], start.column, "utf-16"),
            },
            "end": {
                "line": end.row - 1,
                "character": client_column(lines[end.row - 1], end.column, "utf-16"),
            },
        }
        found.append((finding.code, lsp_range))
    return sorted(found)


# -- malformed messages -------------------------------------------------------------------------

JUNK = {
    "bad json": b"{not json",
    "truncated json": b'{"jsonrpc": "2.0", "id": 5, "method": "textDocument/hov',
    "empty body": b"",
    "binary body": b"\xff\xfe\x00\x01 not utf-8 \x80",
    "json array": b"[1, 2, 3]",
    "json string": b'"text"',
    "json null": b"null",
    "json number": b"42",
    "empty object": b"{}",
    "only jsonrpc": b'{"jsonrpc": "2.0"}',
    "id without method": b'{"jsonrpc": "2.0", "id": 77}',
    "response to nothing": b'{"jsonrpc": "2.0", "id": 78, "result": 5}',
    "error to nothing": b'{"jsonrpc": "2.0", "id": 79, "error": {"code": 1, "message": "x"}}',
    "deeply nested json": b"[" * 100_000 + b"]" * 100_000,
    "huge integer": b'{"jsonrpc": "2.0", "id": ' + b"9" * 10_000 + b"}",
    "didOpen without params": b'{"jsonrpc": "2.0", "method": "textDocument/didOpen"}',
    "didOpen with empty params": b'{"jsonrpc": "2.0", "method": "textDocument/didOpen", '
    b'"params": {}}',
    "didOpen with wrong types": b'{"jsonrpc": "2.0", "method": "textDocument/didOpen", '
    b'"params": {"textDocument": {"uri": 5, "languageId": [], "version": "one", "text": 7}}}',
    "didChange of an unopened document": b'{"jsonrpc": "2.0", "method": '
    b'"textDocument/didChange", "params": {"textDocument": {"uri": "file:///nowhere/x.py", '
    b'"version": 3}, "contentChanges": [{"text": "x = 1"}]}}',
    "didClose of an unopened document": b'{"jsonrpc": "2.0", "method": '
    b'"textDocument/didClose", "params": {"textDocument": {"uri": "file:///nowhere/x.py"}}}',
    "didSave of an unopened document": b'{"jsonrpc": "2.0", "method": '
    b'"textDocument/didSave", "params": {"textDocument": {"uri": "file:///nowhere/x.py"}}}',
    "cancel of an unknown request": b'{"jsonrpc": "2.0", "method": "$/cancelRequest", '
    b'"params": {"id": 123456}}',
    "cancel without params": b'{"jsonrpc": "2.0", "method": "$/cancelRequest"}',
    "unknown $/ notification": b'{"jsonrpc": "2.0", "method": "$/somethingNew", "params": {}}',
    "invalid params (hover)": b'{"jsonrpc": "2.0", "id": 90, "method": "textDocument/hover", '
    b'"params": {"x": 1}}',
    "negative position (hover)": b'{"jsonrpc": "2.0", "id": 91, "method": '
    b'"textDocument/hover", "params": {"textDocument": {"uri": "file:///x.py"}, '
    b'"position": {"line": -1, "character": 99999}}}',
    "wrong jsonrpc version": b'{"jsonrpc": "1.0", "id": 92, "method": "textDocument/hover", '
    b'"params": {"textDocument": {"uri": "file:///x.py"}, '
    b'"position": {"line": 0, "character": 0}}}',
}


@pytest.mark.parametrize("body", list(JUNK.values()), ids=list(JUNK))
def test_junk_in_a_well_formed_frame_is_survived(shared_server: RawServer, body: bytes) -> None:
    shared_server.send_bytes(frame(body))
    assert_serving(shared_server)


def test_garbage_between_frames_is_skipped(server: RawServer) -> None:
    server.send_bytes(b"this is not a header\r\n\r\n")
    server.send_bytes(b"Content-Type: application/vscode-jsonrpc; charset=utf-8\r\n\r\n")
    assert_serving(server)


def test_extra_headers_are_accepted(server: RawServer) -> None:
    body = json.dumps(
        {"jsonrpc": "2.0", "id": 500, "method": "textDocument/hover", "params": HOVER_NOWHERE}
    ).encode()
    header = (
        f"Content-Length: {len(body)}\r\n"
        "Content-Type: application/vscode-jsonrpc; charset=utf-8\r\n\r\n"
    )
    server.send_bytes(header.encode() + body)
    assert "result" in server.response(500)


def test_a_short_content_length_costs_only_that_message(server: RawServer) -> None:
    """The frame's tail is read as a header line and skipped once a line break ends it."""
    body = json.dumps({"jsonrpc": "2.0", "id": 501, "method": "textDocument/hover"}).encode()
    server.send_bytes(frame(body, length=len(body) - 10) + b"\r\n")
    assert_serving(server)
    assert all(m.get("id") != 501 for m in server.messages)


def test_unknown_request_gets_method_not_found(server: RawServer) -> None:
    for method in ("torchls/noSuchThing", "$/noSuchThing", "textDocument/noSuchFeature"):
        answer = server.call(method, {})
        assert answer.get("error", {}).get("code") == METHOD_NOT_FOUND, answer
    assert_serving(server)


def test_unknown_notification_is_ignored(server: RawServer) -> None:
    since = len(server.messages)
    server.notify("torchls/noSuchThing", {"x": 1})
    server.notify("$/noSuchThing", {})
    assert_serving(server)
    assert not [m for m in server.messages[since:] if "error" in m]


def test_odd_uris_are_served(server: RawServer) -> None:
    buggy = MIXED
    for uri in (
        "untitled:Untitled-1",
        "not a uri",
        "file://host/share/train.py",
        "file:///" + "a" * 4000 + ".py",
        "vscode-notebook-cell:/x.ipynb#W0sZmlsZQ%3D%3D",
    ):
        since = len(server.messages)
        server.open(uri, buggy)
        published = server.wait_for_publish(uri, 1, since)
        assert {code for code, _ in torchls_diagnostics(published)} >= {"TL101"}
        hover = server.call(
            "textDocument/hover", {"textDocument": {"uri": uri}, "position": lsp_position(buggy, 0)}
        )
        assert "result" in hover, hover


def test_out_of_range_incremental_changes_are_survived(server: RawServer, tmp_path: Path) -> None:
    uri = (tmp_path / "train.py").as_uri()
    server.open(uri, MIXED)
    for version, (start, end) in enumerate(
        [((1000, 0), (1001, 5)), ((2, 50), (1, 0)), ((0, 999), (0, 1000)), ((0, 0), (99, 99))],
        start=2,
    ):
        server.notify(
            "textDocument/didChange",
            {
                "textDocument": {"uri": uri, "version": version},
                "contentChanges": [
                    {
                        "range": {
                            "start": {"line": start[0], "character": start[1]},
                            "end": {"line": end[0], "character": end[1]},
                        },
                        "text": "x = 1\n",
                    }
                ],
            },
        )
    assert_serving(server)
    # A whole-document change puts the server's copy back in line with ours.
    server.notify(
        "textDocument/didChange",
        {"textDocument": {"uri": uri, "version": 10}, "contentChanges": [{"text": MIXED}]},
    )
    published = server.wait_for_publish(uri, 10)
    assert torchls_diagnostics(published) == expected_diagnostics(MIXED, tmp_path / "train.py")


# -- versions and edits -------------------------------------------------------------------------


def full_change(server: RawServer, uri: str, version: int, text: str) -> None:
    server.notify(
        "textDocument/didChange",
        {"textDocument": {"uri": uri, "version": version}, "contentChanges": [{"text": text}]},
    )


def test_stale_and_duplicate_versions_end_on_the_final_text(
    server: RawServer, tmp_path: Path
) -> None:
    path = tmp_path / "train.py"
    uri = path.as_uri()
    clean = MIXED.replace("F.cross_entropy(probs, y)", "F.cross_entropy(logits, y)")
    server.open(uri, MIXED, version=10)
    full_change(server, uri, 11, clean)
    full_change(server, uri, 5, MIXED)  # stale: older than what the server has
    full_change(server, uri, 11, "import torch\n")  # duplicate version, other text
    full_change(server, uri, 11, MIXED)
    server.open(uri, clean, version=3)  # a repeated didOpen replaces the document
    full_change(server, uri, 12, MIXED)
    published = server.wait_for_publish(uri, 12)
    assert torchls_diagnostics(published) == expected_diagnostics(MIXED, path)
    assert_serving(server)


TYPOS = ("x", "é", "🔥", "(", "\n", ":", "  ", "'")


def typing_session(target: str, edits: int, seed: int) -> Iterator[tuple[str, dict]]:
    """Type `target` one character at a time, with typos (anywhere before the cursor) fixed by
    the next change and the odd paste of a whole line, until at least `edits` changes are made
    and the text equals `target`. Yields (text after the change, the incremental LSP change in
    UTF-16 positions)."""
    rng = random.Random(seed)
    text = ""
    made = 0
    pending: tuple[int, int] | None = None  # a typo to delete next: (start, length)
    while made < edits or text != target:
        made += 1
        if pending is not None:
            start, length = pending
            end, insert = start + length, ""
            pending = None
        elif text == target or (len(target) - len(text) < edits - made and rng.random() < 0.2):
            start = end = rng.randint(0, len(text))
            insert = rng.choice(TYPOS)
            pending = (start, len(insert))
        elif rng.random() < 0.05:
            start = end = len(text)
            stop = target.find("\n", len(text) + 1)
            insert = target[len(text) : stop + 1 if stop != -1 else len(target)]
        else:
            start = end = len(text)
            insert = target[len(text)]
        change = {
            "range": {"start": lsp_position(text, start), "end": lsp_position(text, end)},
            "text": insert,
        }
        text = text[:start] + insert + text[end:]
        yield text, change


def test_a_thousand_keystrokes_with_requests_in_between(server: RawServer, tmp_path: Path) -> None:
    path = tmp_path / "typed.py"
    uri = path.as_uri()
    server.open(uri, "", version=0)
    version = 0
    text = ""
    request_ids = []
    for version, (text, change) in enumerate(typing_session(MIXED, 1000, seed=8), start=1):
        server.notify(
            "textDocument/didChange",
            {"textDocument": {"uri": uri, "version": version}, "contentChanges": [change]},
        )
        if version % 20 == 0:
            # Concurrent requests against whatever the text is right now.
            position = lsp_position(text, random.Random(version).randint(0, len(text)))
            request_ids.append(
                server.request(
                    "textDocument/hover", {"textDocument": {"uri": uri}, "position": position}
                )
            )
            request_ids.append(
                server.request(
                    "textDocument/codeAction",
                    {
                        "textDocument": {"uri": uri},
                        "range": {"start": {"line": 0, "character": 0}, "end": position},
                        "context": {"diagnostics": []},
                    },
                )
            )
    assert version >= 1000 and text == MIXED

    final = server.wait_for_publish(uri, version)
    assert torchls_diagnostics(final) == expected_diagnostics(MIXED, path)
    assert {code for code, _ in torchls_diagnostics(final)} >= {"TL101", "TL106", "TL302"}
    for ident in request_ids:
        answer = server.response(ident)
        if "error" in answer:
            assert answer["error"]["code"] in (REQUEST_CANCELLED, CONTENT_MODIFIED), answer
    # Nothing older is published after the final version, and versions never go back.
    assert_serving(server)
    versions = [p.get("version") for p in server.publishes(uri)]
    assert versions[-1] == version
    assert versions == sorted(versions)


# -- cancellation -------------------------------------------------------------------------------

BUGGY_STEP = (
    "import torch.nn.functional as F\n"
    "def step_{i}(logits, y):\n"
    "    probs = F.softmax(logits, dim=1)\n"
    "    return F.cross_entropy(probs, y)\n"
)
SLOW = "".join(BUGGY_STEP.format(i=i) for i in range(8000))  # about 1 MB: a second of analysis


def test_cancel_request_is_honoured(tmp_path: Path) -> None:
    """A pull-diagnostics request queued behind a slow one is cancelled: the answer is
    RequestCancelled, the slow one still completes, and the cancelled one can be asked again."""
    server = RawServer(tmp_path / "server-stderr.txt")
    try:
        server.initialize({"textDocument": {"diagnostic": {"dynamicRegistration": False}}})
        slow_uri, small_uri = (tmp_path / "slow.py").as_uri(), (tmp_path / "small.py").as_uri()
        server.open(slow_uri, SLOW)
        server.open(small_uri, MIXED)
        slow = server.request("textDocument/diagnostic", {"textDocument": {"uri": slow_uri}})
        small = server.request("textDocument/diagnostic", {"textDocument": {"uri": small_uri}})
        server.notify("$/cancelRequest", {"id": small})
        answer = server.response(small)
        assert answer.get("error", {}).get("code") == REQUEST_CANCELLED, answer
        report = server.response(slow)["result"]
        assert len([d for d in report["items"] if d["code"] == "TL101"]) == 8000
        again = server.call("textDocument/diagnostic", {"textDocument": {"uri": small_uri}})
        assert {d["code"] for d in again["result"]["items"]} >= {"TL101"}
    finally:
        server.close()


# -- the client dying ---------------------------------------------------------------------------


def test_server_exits_when_its_input_closes(server: RawServer, tmp_path: Path) -> None:
    server.open((tmp_path / "train.py").as_uri(), MIXED)
    assert server.process.stdin is not None
    server.process.stdin.close()  # the client died: no shutdown, no exit
    assert server.wait_exit(EXIT_WAIT_S) is not None, "the server outlived its client"


def test_server_exits_when_the_client_vanishes_mid_analysis(tmp_path: Path) -> None:
    server = RawServer(tmp_path / "server-stderr.txt")
    try:
        server.initialize()
        server.open((tmp_path / "slow.py").as_uri(), SLOW)  # analysis under way
        assert server.process.stdin is not None and server.process.stdout is not None
        server.process.stdin.close()
        server.process.stdout.close()  # nobody reads the publish that is coming
        assert server.wait_exit(EXIT_WAIT_S) is not None, "the server outlived its client"
    finally:
        server.close()


def test_shutdown_then_exit_ends_the_server(server: RawServer) -> None:
    assert server.call("shutdown").get("result", "missing") is None
    server.notify("exit")
    assert server.wait_exit(EXIT_WAIT_S) == 0


def test_the_typing_session_agrees_with_the_lsp_edit_mirror() -> None:
    """The test's own edit mirror (tests/lsp/support.apply_edit) agrees with the typing session,
    so the keystroke test compares the server against an independent model of the text."""
    text = ""
    for after, change in typing_session(MIXED[:200], 150, seed=3):
        edit = types.TextEdit(
            range=types.Range(
                start=types.Position(**change["range"]["start"]),
                end=types.Position(**change["range"]["end"]),
            ),
            new_text=change["text"],
        )
        text = apply_edit(text, edit, "utf-16")
        assert text == after
