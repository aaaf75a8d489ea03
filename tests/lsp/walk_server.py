"""The torchls server under a profiler, for `test_document_walk`: every call into one of the
server's own modules (not the pure analysis) is logged as `caller file, callee file, function`.

In: the log path in TORCHLS_WALK_LOG. Out: the server on stdio, as `torchls server`, and the
log. A coroutine resumed after an await is marked "(resumed)": that is no new call.
"""

from __future__ import annotations

import os
import sys
import threading
from types import FrameType
from typing import Any

LOG = open(os.environ["TORCHLS_WALK_LOG"], "w", buffering=1, encoding="utf-8")  # noqa: SIM115
MARK = os.sep + "torchls" + os.sep
COROUTINE = 0x80  # inspect.CO_COROUTINE
_entered: set[int] = set()
_alive: list[FrameType] = []  # so that no frame id is reused while the server runs


def _ours(path: str) -> str | None:
    if MARK not in path or f"{os.sep}analysis{os.sep}" in path:
        return None
    return path.split(MARK, 1)[1].replace(os.sep, "/")


def _profile(frame: FrameType, event: str, arg: Any) -> None:
    if event != "call" or (callee := _ours(frame.f_code.co_filename)) is None:
        return
    back = frame.f_back
    caller = _ours(back.f_code.co_filename) if back is not None else None
    name = frame.f_code.co_name
    if frame.f_code.co_flags & COROUTINE:
        if id(frame) in _entered:
            name += " (resumed)"
        else:
            _entered.add(id(frame))
            _alive.append(frame)
    LOG.write(f"{caller or '-'}\t{callee}\t{name}\n")


sys.setprofile(_profile)
threading.setprofile(_profile)

from torchls.lsp import start_stdio  # noqa: E402

sys.exit(start_stdio())
