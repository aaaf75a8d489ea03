"""A deliberately minimal JSON-RPC client over the real server's stdio, for abuse tests.

pytest-lsp only sends well-formed messages; these tests need to send broken ones (bad JSON, a
wrong Content-Length, missing fields), so they frame bytes themselves. `RawServer` starts
`python -m torchls server`, reads its stdout on a thread (one parsed message per frame, or a
`FramingError` entry when the server's own output is not valid framing), answers the requests
the server sends the client (`workspace/configuration`, `client/registerCapability`, ...) so a
session can proceed, and lets a test wait for the first message matching a predicate.

Every wait is bounded by `WAIT_S`, a safety net against hangs, not a timing assertion.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

SERVER_COMMAND = [sys.executable, "-m", "torchls", "server"]
WAIT_S = 30.0
EXIT_WAIT_S = 15.0

Message = dict[str, Any]


class FramingError(AssertionError):
    """The server wrote something on stdout that is not a JSON-RPC frame."""


def frame(body: bytes | str | Message, length: int | None = None) -> bytes:
    """One frame: `Content-Length` header (the real length unless `length` is given) + body."""
    if isinstance(body, dict):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode("utf-8")
    size = len(body) if length is None else length
    return f"Content-Length: {size}\r\n\r\n".encode("ascii") + body


class RawServer:
    """The real server on pipes, spoken to in raw bytes."""

    def __init__(self, stderr_path: Path, env: dict[str, str] | None = None) -> None:
        self.stderr_path = stderr_path
        self._stderr = open(stderr_path, "wb")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            SERVER_COMMAND,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        self.messages: list[Message] = []
        self._inbox: queue.Queue[Message | None] = queue.Queue()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.configuration: Any = {}
        self.unanswered: set[str] = set()  # server requests left without an answer
        self._reader = threading.Thread(target=self._read, name="raw-lsp-reader", daemon=True)
        self._reader.start()

    # -- writing ----------------------------------------------------------------------------

    def send_bytes(self, data: bytes) -> None:
        assert self.process.stdin is not None
        with self._lock:
            self.process.stdin.write(data)
            self.process.stdin.flush()

    def send(self, message: Message) -> None:
        self.send_bytes(frame({"jsonrpc": "2.0", **message}))

    def notify(self, method: str, params: Any = None) -> None:
        message: Message = {"method": method}
        if params is not None:
            message["params"] = params
        self.send(message)

    def request(self, method: str, params: Any = None) -> int:
        """Send a request; returns its id (wait for the answer with `response`)."""
        ident = next(self._ids)
        message: Message = {"id": ident, "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)
        return ident

    def call(self, method: str, params: Any = None) -> Message:
        return self.response(self.request(method, params))

    # -- reading ----------------------------------------------------------------------------

    def _read(self) -> None:
        stream = self.process.stdout
        assert stream is not None
        try:
            while True:
                length = None
                while True:
                    header = stream.readline()
                    if not header:
                        return
                    if header in (b"\r\n", b"\n"):
                        break
                    name, _, value = header.decode("ascii").partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                if length is None:
                    raise FramingError(f"frame without Content-Length: {header!r}")
                body = stream.read(length)
                message = json.loads(body)
                self._answer_server_request(message)
                self._inbox.put(message)
        except Exception as error:  # recorded, so a test sees it instead of a silent hang
            self._inbox.put({"framing_error": repr(error)})
        finally:
            self._inbox.put(None)

    def _answer_server_request(self, message: Message) -> None:
        """Reply to what the server asks the client, as a plain editor would."""
        if "method" not in message or "id" not in message:
            return
        if message["method"] in self.unanswered:
            return
        result: Any = None
        if message["method"] == "workspace/configuration":
            items = message.get("params", {}).get("items", [])
            result = [self.configuration for _ in items]
        self.send({"id": message["id"], "result": result})

    def _pump(self, timeout: float) -> bool:
        """Move one message from the reader into `messages`; False when the stream ended."""
        item = self._inbox.get(timeout=timeout)
        if item is None:
            self._inbox.put(None)  # keep reporting the end to later waits
            return False
        if "framing_error" in item:
            raise FramingError(item["framing_error"])
        self.messages.append(item)
        return True

    def wait_for(
        self, predicate: Callable[[Message], bool], since: int = 0, timeout: float = WAIT_S
    ) -> Message:
        """The first message at or after index `since` satisfying `predicate`."""
        index = since
        deadline_left = timeout
        while True:
            while index < len(self.messages):
                if predicate(self.messages[index]):
                    return self.messages[index]
                index += 1
            try:
                if not self._pump(deadline_left):
                    raise AssertionError("the server closed its output before the message came")
            except queue.Empty:
                raise AssertionError(f"no matching message within {timeout} s") from None

    def response(self, ident: int, since: int = 0) -> Message:
        return self.wait_for(lambda m: m.get("id") == ident and "method" not in m, since)

    def drain(self) -> None:
        """Collect whatever has arrived so far without waiting."""
        with contextlib.suppress(queue.Empty):
            while self._pump(0):
                pass

    def publishes(self, uri: str) -> list[Message]:
        self.drain()
        return [
            m["params"]
            for m in self.messages
            if m.get("method") == "textDocument/publishDiagnostics" and m["params"]["uri"] == uri
        ]

    def wait_for_publish(self, uri: str, version: int | None, since: int = 0) -> Message:
        message = self.wait_for(
            lambda m: (
                m.get("method") == "textDocument/publishDiagnostics"
                and m["params"]["uri"] == uri
                and m["params"].get("version") == version
            ),
            since,
        )
        return message["params"]

    # -- lifecycle ----------------------------------------------------------------------------

    def initialize(self, capabilities: Message | None = None, root: Path | None = None) -> Message:
        params: Message = {"processId": os.getpid(), "capabilities": capabilities or {}}
        if root is not None:
            params["rootUri"] = root.as_uri()
        answer = self.call("initialize", params)
        self.notify("initialized", {})
        return answer

    def open(self, uri: str, text: str, version: int = 1) -> None:
        self.notify(
            "textDocument/didOpen",
            {
                "textDocument": {
                    "uri": uri,
                    "languageId": "python",
                    "version": version,
                    "text": text,
                }
            },
        )

    def alive(self) -> bool:
        return self.process.poll() is None

    def wait_exit(self, timeout: float = EXIT_WAIT_S) -> int | None:
        """The exit status once the process ended by itself, or None if it is still running."""
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stderr(self) -> str:
        if not self._stderr.closed:
            self._stderr.flush()
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    def close(self) -> None:
        """shutdown + exit if still possible; kill what is left either way."""
        if self.alive():
            with contextlib.suppress(Exception):
                self.send({"id": next(self._ids), "method": "shutdown"})
                self.notify("exit")
            with contextlib.suppress(OSError):
                assert self.process.stdin is not None
                self.process.stdin.close()
            if self.wait_exit() is None:
                with contextlib.suppress(OSError):
                    os.killpg(self.process.pid, 9)
                self.process.wait()
        with contextlib.suppress(OSError):
            assert self.process.stdin is not None
            self.process.stdin.close()
        self._reader.join(timeout=EXIT_WAIT_S)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._stderr.close()
