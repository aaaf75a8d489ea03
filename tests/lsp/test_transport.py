"""Unit tests of the server's stdio framing (`FrameReader`), on in-memory streams.

The end-to-end behaviour (the real server answering after bad frames) is tested over real stdio
in tests/robustness/test_regressions.py; these pin the edge cases that are hard to provoke
through a pipe: a header cut at the line-length limit, bodies larger than one read chunk, an
announced size over the cap, and end of input in the middle of a frame.
"""

from __future__ import annotations

import io
import json

from torchls.lsp.transport import BODY_CHUNK, HEADER_LINE_LIMIT, MAX_BODY_BYTES, FrameReader


def frame(body: bytes, length: int | None = None) -> bytes:
    size = len(body) if length is None else length
    return f"Content-Length: {size}\r\n\r\n".encode() + body


def bodies(stream: bytes) -> list[bytes]:
    reader = FrameReader(io.BytesIO(stream).read)
    found = []
    while (body := reader.read_body()) is not None:
        found.append(body)
    return found


def test_frames_with_extra_headers_and_lowercase_names_are_read() -> None:
    first = b'{"id": 1}'
    second = b'{"id": 2}'
    stream = frame(first).replace(
        b"\r\n\r\n", b"\r\nContent-Type: application/json\r\n\r\n"
    ) + frame(second).replace(b"Content-Length", b"content-length")
    assert bodies(stream) == [first, second]


def test_a_header_cut_by_the_line_limit_is_still_found() -> None:
    body = b'{"id": 3}'
    for cut in (1, 5, 15, 17):  # where the limit falls inside "Content-Length: 9\r\n"
        noise = b"x" * (HEADER_LINE_LIMIT - cut)
        assert bodies(noise + frame(body)) == [body], cut


def test_a_body_larger_than_one_chunk_is_read_whole() -> None:
    body = json.dumps({"text": "y" * (2 * BODY_CHUNK + 17)}).encode()
    assert bodies(frame(body) + frame(b"{}")) == [body, b"{}"]


def test_an_oversized_frame_is_skipped_and_reading_goes_on() -> None:
    reader = FrameReader(io.BytesIO(frame(b"{}", length=MAX_BODY_BYTES + 1) + frame(b"[1]")).read)
    assert reader.read_body() == b"[1]"
    assert reader.skipped_frames == 1


def test_end_of_input_inside_a_body_ends_reading() -> None:
    assert bodies(frame(b'{"id": 4}', length=50)) == []
    assert bodies(b"Content-Length: 5\r\n") == []
