"""Diagnostics end to end: ranges in the client's encoding, live updates, stale results,
didClose, broken input, and push vs pull per client."""

from __future__ import annotations

from pathlib import Path

from lsprotocol import types

from .support import (
    TRAIN,
    TRAIN_FIXED,
    RecordingClient,
    change_doc,
    client_column,
    close_doc,
    codes,
    diagnostics_of,
    open_doc,
    range_of,
)


async def barrier(client: RecordingClient, folder: Path) -> None:
    """Open and analyse another document and wait for its publish. The server analyses on one
    FIFO worker, so any publish queued before it has been sent by the time this returns."""
    since = len(client.publishes)
    other = open_doc(client, folder / "barrier.py", TRAIN)
    await diagnostics_of(client, other, since)
    close_doc(client, other)


async def test_tl101_reported_on_open_with_client_columns(client: RecordingClient, tmp_path):
    since = len(client.publishes)
    doc = open_doc(client, tmp_path / "train.py", TRAIN)

    diagnostics = await diagnostics_of(client, doc, since)

    assert codes(diagnostics) == ["TL101"]
    [diagnostic] = diagnostics
    assert diagnostic.source == "torchls"
    assert diagnostic.severity == types.DiagnosticSeverity.Error
    assert diagnostic.code_description is None
    # The finding is the `probs` argument on the line that starts with an emoji string.
    assert diagnostic.range == range_of(TRAIN, "probs", client.encoding, occurrence=1)
    line = TRAIN.splitlines()[9]
    codepoints = line.index("probs, y")
    assert diagnostic.range.start.line == 9
    assert diagnostic.range.start.character == client_column(line, codepoints, client.encoding)
    assert diagnostic.range.start.character != codepoints  # the emoji counts more than once
    [related] = diagnostic.related_information or []
    assert related.location.uri == doc.uri
    assert related.location.range == range_of(TRAIN, "F.softmax(logits, dim=1)", client.encoding)
    assert isinstance(diagnostic.data, dict)
    assert diagnostic.data["fix"]["applicability"] == "safe"
    assert diagnostic.data["noqaLine"] == 9


async def test_fixing_the_code_clears_the_diagnostic(client: RecordingClient, tmp_path):
    since = len(client.publishes)
    doc = open_doc(client, tmp_path / "train.py", TRAIN)
    assert codes(await diagnostics_of(client, doc, since)) == ["TL101"]

    change_doc(client, doc, TRAIN_FIXED)
    assert await diagnostics_of(client, doc, since) == []

    change_doc(client, doc, TRAIN)
    assert codes(await diagnostics_of(client, doc, since)) == ["TL101"]


async def test_syntax_error_keeps_the_other_findings(client: RecordingClient, tmp_path):
    broken = TRAIN.replace("    model.train()\n", "    model.train()\n    bad = = 1\n")
    since = len(client.publishes)
    doc = open_doc(client, tmp_path / "train.py", broken)

    diagnostics = await diagnostics_of(client, doc, since)

    assert codes(diagnostics) == ["TL101"]
    assert diagnostics[0].range == range_of(broken, "probs", client.encoding, occurrence=1)


async def test_rapid_changes_publish_only_current_versions(client: RecordingClient, tmp_path):
    since = len(client.publishes)
    doc = open_doc(client, tmp_path / "train.py", TRAIN)
    await diagnostics_of(client, doc, since)
    texts = {}
    mark = len(client.publishes)
    for step in range(6):
        text = (TRAIN if step % 2 else TRAIN_FIXED) + f"# edit {step}\n"
        change_doc(client, doc, text)
        texts[doc.version] = text

    final = await diagnostics_of(client, doc, mark)

    assert codes(final) == ["TL101"]
    assert final[0].range == range_of(doc.text, "probs", client.encoding, occurrence=1)
    if client.pull:
        assert client.publishes_for(doc.uri) == []  # pull clients are never pushed to
        return
    await barrier(client, tmp_path)
    published = client.publishes_for(doc.uri, mark)
    versions = [p.version for p in published]
    assert versions == sorted(versions)
    assert versions[-1] == doc.version
    for params in published:
        # Every publish describes exactly the text of the version it names.
        expected = ["TL101"] if "F.cross_entropy(probs" in texts[params.version] else []
        assert codes(list(params.diagnostics)) == expected


async def test_close_clears_pushed_diagnostics(client: RecordingClient, tmp_path):
    since = len(client.publishes)
    doc = open_doc(client, tmp_path / "train.py", TRAIN)
    assert codes(await diagnostics_of(client, doc, since)) == ["TL101"]
    mark = len(client.publishes)

    close_doc(client, doc)

    if client.pull:
        await barrier(client, tmp_path)
        assert client.publishes_for(doc.uri) == []
        return
    cleared = await client.wait_for_publish(lambda p: p.uri == doc.uri, mark)
    assert list(cleared.diagnostics) == []


async def test_broken_input_does_not_take_the_server_down(client: RecordingClient, tmp_path):
    since = len(client.publishes)
    binary = open_doc(client, tmp_path / "blob.py", "\x00\x01\x02binary\ufffd\x00" * 50)
    nested = open_doc(client, tmp_path / "nested.py", "x = " + "(" * 5000 + ")" * 5000 + "\n")
    assert await diagnostics_of(client, binary, since) == []
    assert await diagnostics_of(client, nested, since) == []

    # What could not be analysed says so (an empty list would read as "no bugs").
    huge = open_doc(client, tmp_path / "huge.py", ("x = 1  # " + "#" * 990 + "\n") * 5100)
    [note] = await diagnostics_of(client, huge, since)
    assert note.severity == types.DiagnosticSeverity.Information
    assert "not analysed: larger than 5000000 characters" in note.message

    healthy = open_doc(client, tmp_path / "train.py", TRAIN)
    assert codes(await diagnostics_of(client, healthy, since)) == ["TL101"]
