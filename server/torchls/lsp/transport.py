"""The JSON-RPC transport under the server: stdio framing and message dispatch that survive abuse.

pygls 2.1's stdio loop trusts its client: an absurd `Content-Length` makes it allocate that many
bytes at once (MemoryError ends the server), one frame it does not recognise desynchronises every
later one, a request whose params do not deserialise is only logged (the client waits forever),
and it keeps a finished future per notification (memory grows with every keystroke). This module
replaces that loop and patches the protocol:

- `FrameReader` reads frames from a binary stream with bounded memory (header lines and bodies
  are capped) and, after anything unrecognised, resynchronises on the next `Content-Length:`.
- `TorchProtocol` answers malformed requests (-32601 unknown method, -32602 invalid params,
  -32600 after `shutdown`) and forgets the futures of finished notifications.
- `serve()` runs a server on two streams and returns the process exit status the LSP
  specification asks for (0 after `shutdown` then `exit`, 1 for `exit` alone).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import threading
from collections.abc import Callable
from functools import partial
from typing import Any, BinaryIO

from lsprotocol import types
from pygls.exceptions import (
    JsonRpcException,
    JsonRpcInternalError,
    JsonRpcInvalidParams,
    JsonRpcInvalidRequest,
    JsonRpcMethodNotFound,
)
from pygls.io_ import StdoutWriter
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 256 << 20
"""Frames announcing a larger body are skipped: no editor sends a 256 MiB message, and reading
one would only hold memory for a document torchls refuses to analyse anyway."""

HEADER_LINE_LIMIT = 64 << 10
"""Header lines are read at most this many bytes at a time, so a stream without line breaks
cannot grow one line without bound."""

BODY_CHUNK = 1 << 20
"""Input is read at most this much at a time, so memory follows the bytes that arrive, not the
announced size."""

_CONTENT_LENGTH = re.compile(rb"Content-Length:[ \t]*(\d{1,20})[ \t]*\r?\n\Z", re.IGNORECASE)
# Searched, not matched at the start: after a frame the reader could not use, the rest of its
# body (which never ends with a line break) shares a line with the next real header.
_CARRY = 128  # bytes of a cut header line kept, enough for a whole `Content-Length` header


class FrameReader:
    """Reads JSON-RPC frame bodies; `read_some(n)` returns up to n bytes, b"" at end of input.

    It buffers by itself on top of `read_some` (for stdin, `os.read` on the descriptor), so a
    read blocked on stdin holds no lock of Python's io objects: the reading thread can be left
    blocked when the server exits."""

    def __init__(self, read_some: Callable[[int], bytes]) -> None:
        self._read_some = read_some
        self._buffer = bytearray()
        self._at_end = False
        self.skipped_frames = 0

    def read_body(self) -> bytes | None:
        """The next frame's body, or None at end of input."""
        length: int | None = None
        carry = b""
        while True:
            chunk = self._readline(HEADER_LINE_LIMIT)
            if not chunk:
                return None
            line = carry + chunk
            if not line.endswith(b"\n"):
                carry = line[-_CARRY:]  # a cut line: only its end can hold the header we want
                continue
            carry = b""
            match = _CONTENT_LENGTH.search(line)
            if match:
                length = int(match.group(1))
                continue
            if line.strip() or length is None:
                continue  # another header (Content-Type), or noise before any header
            if length > MAX_BODY_BYTES:
                logger.error(
                    "skipping a frame of %s bytes (the limit is %s)", length, MAX_BODY_BYTES
                )
                self.skipped_frames += 1
                length = None
                continue  # its body, if it ever comes, is noise before the next header
            return self._read_exactly(length)

    def _fill(self) -> bool:
        if self._at_end:
            return False
        chunk = self._read_some(BODY_CHUNK)
        if not chunk:
            self._at_end = True
            return False
        self._buffer += chunk
        return True

    def _take(self, size: int) -> bytes:
        taken = bytes(self._buffer[:size])
        del self._buffer[:size]
        return taken

    def _readline(self, limit: int) -> bytes:
        searched = 0
        while True:
            newline = self._buffer.find(b"\n", searched, limit)
            if newline >= 0:
                return self._take(newline + 1)
            if len(self._buffer) >= limit:
                return self._take(limit)
            searched = len(self._buffer)
            if not self._fill():
                return self._take(len(self._buffer))

    def _read_exactly(self, length: int) -> bytes | None:
        while len(self._buffer) < length:
            if not self._fill():
                return None
        return self._take(length)


class TorchProtocol(LanguageServerProtocol):
    """The LSP protocol with answers for malformed requests and no per-notification leak."""

    def _execute_handler(self, msg_id, handler, callback, args=None, kwargs=None):
        super()._execute_handler(msg_id, handler, callback, args, kwargs)
        future = self._request_futures.get(msg_id)
        if future is None:
            return
        # pygls removes a request's future when it answers, but never the ones it files under
        # a fresh uuid for notifications and the steps of its built-in handlers.
        loop = asyncio.get_running_loop()

        def forget(done: Any) -> None:
            if self._request_futures.get(msg_id) is done:
                del self._request_futures[msg_id]

        def forget_later(done: Any) -> None:
            # Later, on the loop's thread: a future can finish inside a loop over the table
            # (`shutdown` cancels every pending one), or on a handler thread.
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to keep
                loop.call_soon_threadsafe(forget, done)

        future.add_done_callback(forget_later)

    def receive(self, data: Any) -> None:
        """Deserialise and dispatch one decoded JSON value, answering what pygls would not."""
        if not isinstance(data, dict):
            logger.warning("ignoring a JSON-RPC message that is not an object")
            return
        request_id = data.get("id")
        is_request = (
            isinstance(data.get("method"), str)
            and isinstance(request_id, (int, str))
            and not isinstance(request_id, bool)
        )
        if data.get("jsonrpc") != "2.0":
            if is_request:
                self.answer_error(request_id, JsonRpcInvalidRequest("jsonrpc must be '2.0'"))
            else:
                logger.warning("ignoring a message without jsonrpc 2.0")
            return
        if is_request and self._shutdown and data["method"] != types.EXIT:
            self.answer_error(request_id, JsonRpcInvalidRequest("the server is shutting down"))
            return
        try:
            message = self.structure_message(data)
        except JsonRpcException:
            if "method" not in data:
                self.fail_pending(data.get("id"))
                return
            if not is_request:
                logger.warning("ignoring a malformed %s notification", data["method"])
                return
            # pygls raises InternalError for some shapes of bad params; both mean the client
            # sent params this method cannot take, unless nobody handles the method at all.
            if self.knows(data["method"]):
                self.answer_error(request_id, JsonRpcInvalidParams())
            else:
                self.answer_error(request_id, JsonRpcMethodNotFound.of(data["method"]))
            return
        self.handle_message(message)

    def fail_pending(self, request_id: Any) -> None:
        """A response we cannot read (a client answering `null` where a result is required):
        fail the request that waits for it, or its handler would wait forever."""
        logger.warning("malformed response from the client to request %r", request_id)
        if not isinstance(request_id, (int, str)):
            return
        self._result_types.pop(request_id, None)
        future = self._request_futures.pop(request_id, None)
        if future is not None and not future.done():
            future.set_exception(JsonRpcInternalError("malformed response from the client"))

    def knows(self, method: str) -> bool:
        return (
            self.get_message_type(method) is not None
            or method in self.fm.builtin_features
            or method in self.fm.features
        )

    def answer_error(self, request_id: int | str, error: JsonRpcException) -> None:
        self._send_response(request_id, error=error.to_response_error())


FRAMES_AHEAD = 64
"""Frames the reading thread may hold before the loop takes them (back-pressure on the client)."""


def _read_frames(
    reader: FrameReader, loop: asyncio.AbstractEventLoop, frames: asyncio.Queue[bytes | None]
) -> None:
    """The reading thread: hand each frame body to the loop; None at end of input."""
    while True:
        try:
            body = reader.read_body()
        except (OSError, ValueError):  # stdin closed under us
            body = None
        try:
            asyncio.run_coroutine_threadsafe(frames.put(body), loop).result()
        except RuntimeError:  # the loop is gone: the server is exiting
            return
        if body is None:
            return


async def _serve(server: LanguageServer, reader: FrameReader, stop: threading.Event) -> int | None:
    protocol = server.protocol
    assert isinstance(protocol, TorchProtocol)
    frames: asyncio.Queue[bytes | None] = asyncio.Queue(FRAMES_AHEAD)
    # A daemon thread, not an executor: a read blocked on stdin must not keep the process alive
    # after `exit` (executors join their threads at interpreter exit, and a client may wait for
    # our exit before it closes our stdin).
    threading.Thread(
        target=_read_frames,
        args=(reader, asyncio.get_running_loop(), frames),
        name="torchls-stdin",
        daemon=True,
    ).start()
    while not stop.is_set():
        body = await frames.get()
        if body is None:
            return None  # the client closed our stdin without `exit`
        try:
            data = json.loads(body)
        except (ValueError, RecursionError) as error:  # not JSON, or nested beyond reason
            logger.warning("ignoring a frame that is not usable JSON: %s", error)
            continue
        try:
            protocol.receive(data)
        except SystemExit as done:  # pygls ends `exit` with sys.exit(status)
            return done.code if isinstance(done.code, int) else 1
        except Exception as error:  # a handler bug must not end the session
            logger.exception("unable to handle a message")
            server._report_server_error(error, JsonRpcException)
    return None


def serve(server: LanguageServer, stdin: BinaryIO, stdout: BinaryIO) -> int:
    """Run `server` on the two streams until `exit` or end of input; the exit status.

    End of input without `exit` counts like `exit` itself: 0 after `shutdown`, else 1 (the
    client went away without the handshake)."""
    stop = threading.Event()
    server._stop_event = stop
    server.protocol.set_writer(StdoutWriter(stdout))
    try:
        status = asyncio.run(_serve(server, FrameReader(partial(os.read, stdin.fileno())), stop))
    except BrokenPipeError:
        logger.error("the connection to the client is lost; exiting")
        status = None
    except KeyboardInterrupt:
        status = None
    finally:
        server.shutdown()
    if status is None:
        status = 0 if server.protocol._shutdown else 1
    return status


__all__ = ["MAX_BODY_BYTES", "FrameReader", "TorchProtocol", "serve"]
