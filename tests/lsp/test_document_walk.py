"""An edit's way to its diagnostics is one-way: no call goes back into a module it left.

The server runs under a profiler (`walk_server.py`) that logs every call into its own modules;
the walk is the calls from one file into another, from the `didChange` handler to the check
before publishing. It used to go back and forth between the server object (the cache and the
analysis runner) and the diagnostics feature (document sync); now the documents module hands
its results on and nothing calls it back.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .support import (
    TRAIN,
    change_doc,
    diagnostics_of,
    end_session,
    initialize,
    make_client,
    open_doc,
)

HERE = Path(__file__).parent


def walk(log: Path) -> list[tuple[str, str]]:
    """(file, function) of each call into another file, `didChange` to the last check."""
    rows = [line.split("\t") for line in log.read_text(encoding="utf-8").splitlines()]
    start = next(i for i, row in enumerate(rows) if row[2] == "did_change")
    end = next(i for i, row in enumerate(rows) if i > start and row[2] == "_still_wanted")
    stops: list[tuple[str, str]] = []
    for caller, callee, name in rows[start : end + 1]:
        if callee == "lsp/transport.py" or name.startswith("<") or name.endswith("(resumed)"):
            continue  # reading the wire, comprehensions, and awaits that come back
        if stops and caller == callee:
            continue  # a call inside the file it is in
        stops.append((callee, name))
    return stops


async def test_did_change_walk_never_goes_back_to_a_file_it_left(tmp_path: Path):
    log = tmp_path / "walk.log"
    client = make_client()
    await client.start_io(
        sys.executable, str(HERE / "walk_server.py"), env={"TORCHLS_WALK_LOG": str(log)}
    )
    try:
        await initialize(client, "visual_studio_code")
        since = len(client.publishes)
        doc = open_doc(client, tmp_path / "train.py", TRAIN)
        await diagnostics_of(client, doc, since)
        since = len(client.publishes)
        change_doc(client, doc, TRAIN + "\n")
        assert [d.code for d in await diagnostics_of(client, doc, since)] == ["TL101"]
    finally:
        await end_session(client)
    stops = walk(log)
    # Each file once, in one run: a file that shows up again after another was visited means
    # something called back into it.
    visits = [file for i, (file, _) in enumerate(stops) if i == 0 or stops[i - 1][0] != file]
    assert len(visits) == len(set(visits)), f"the walk goes back: {stops}"
    # documents -> the project's configuration -> diagnostics -> conversion -> repro layer
    assert visits[0] == "lsp/documents.py" and "lsp/server.py" not in visits
    assert visits.index("lsp/documents.py") < visits.index("lsp/diagnostics.py")
    assert visits.index("lsp/diagnostics.py") < visits.index("lsp/repro_diagnostics.py")
