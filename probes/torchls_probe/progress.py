"""Progress events from the probe to the server: one JSON object per line on a private fd.

In: a stage name and optional step counters. Out: a line such as
`{"event": "progress", "stage": "step", "message": "step 1 of 2", "step": 1, "total": 2}`.
Each line is a single `os.write` well under PIPE_BUF, so lines from several writers (the warm
worker and its children) never interleave. A closed or missing channel is ignored: progress is a
courtesy, never a reason for a run to fail.
"""

from __future__ import annotations

import json
import os
from typing import Any


class Progress:
    def __init__(self, fd: int | None, tag: Any = None) -> None:
        self._fd = fd
        self._tag = tag
        self.rank: int | None = None  # a rank of a distributed repro says which it is

    def emit(self, stage: str, message: str, **extra: Any) -> None:
        if self._fd is None:
            return
        event: dict[str, Any] = {"event": "progress", "stage": stage, "message": message}
        if self._tag is not None:
            event["id"] = self._tag
        if self.rank is not None:
            event["rank"] = self.rank
        event.update(extra)
        line = (json.dumps(event, separators=(",", ":")) + "\n").encode("utf-8")
        try:
            os.write(self._fd, line[:4000])
        except OSError:
            self._fd = None
