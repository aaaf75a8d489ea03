"""Work-done progress for one repro run, following the probe's stages.

In: the probe's `ProgressEvent`s (start, import, run or setup, step k of n, report, done),
delivered on the event loop. Out: `window/workDoneProgress/create` and `$/progress`
begin/report/end with a percentage that never goes back. The bar is cancellable: pygls cancels
the token's future on `window/workDoneProgress/cancel`, which sets the run's cancel event. For
clients that do not announce `window.workDoneProgress`, or refuse the token, it does nothing.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import TYPE_CHECKING

from lsprotocol import types
from pygls.capabilities import get_capability

from torchls.lsp.server import TorchLanguageServer

if TYPE_CHECKING:
    from torchls.probe import ProgressEvent

logger = logging.getLogger(__name__)

# Where each probe stage puts the bar (steps fill the range between run and report).
STAGE_PERCENT = {"start": 5, "import": 15, "run": 30, "setup": 30, "report": 95, "done": 100}


class ReproProgress:
    """One run's work-done progress; inert for clients that do not show progress."""

    def __init__(self, server: TorchLanguageServer, token: str | None) -> None:
        self.server = server
        self.token = token
        self.percentage = 0

    @classmethod
    async def start(
        cls, server: TorchLanguageServer, title: str, cancel: threading.Event
    ) -> ReproProgress:
        if not get_capability(server.client_capabilities, "window.work_done_progress", False):
            return cls(server, None)
        token = f"torchls-repro-{uuid.uuid4().hex}"
        progress = server.work_done_progress
        try:
            await progress.create_async(token)
        except Exception as error:  # a client may refuse; the run goes on without a bar
            logger.info("no work-done progress: %s", error)
            return cls(server, None)
        progress.begin(
            token,
            types.WorkDoneProgressBegin(
                title=title, cancellable=True, message="preparing", percentage=0
            ),
        )
        future = progress.tokens.get(token)
        if future is not None:
            # pygls cancels this future on window/workDoneProgress/cancel.
            future.add_done_callback(lambda done: cancel.set() if done.cancelled() else None)
        return cls(server, token)

    def report(self, event: ProgressEvent) -> None:
        if self.token is None or event.stage == "done":
            return
        percentage = STAGE_PERCENT.get(event.stage, self.percentage)
        if event.stage == "step" and event.step and event.total:
            percentage = 30 + int(60 * min(event.step, event.total) / event.total)
        self.percentage = max(self.percentage, percentage)  # a progress bar never goes back
        self.server.work_done_progress.report(
            self.token,
            types.WorkDoneProgressReport(message=event.message, percentage=self.percentage),
        )

    def end(self, message: str) -> None:
        if self.token is None:
            return
        self.server.work_done_progress.end(self.token, types.WorkDoneProgressEnd(message=message))
        self.server.work_done_progress.tokens.pop(self.token, None)
        self.token = None
