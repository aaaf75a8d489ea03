"""Hover end to end: the loss contract under the cursor, nothing elsewhere."""

from __future__ import annotations

from lsprotocol import types

from .support import TRAIN, RecordingClient, change_doc, diagnostics_of, open_doc, position_of

# The call sits between an emoji and more code, so a position converted in the wrong units
# lands outside it.
SCRIPT = TRAIN.replace("F.cross_entropy(probs, y)", "F.cross_entropy(probs, y); step = 1")


async def hover_at(client: RecordingClient, uri: str, where: types.Position) -> types.Hover | None:
    return await client.text_document_hover_async(
        types.HoverParams(text_document=types.TextDocumentIdentifier(uri), position=where)
    )


async def test_hover_on_cross_entropy_shows_the_contract(client: RecordingClient, tmp_path):
    since = len(client.publishes)
    doc = open_doc(client, tmp_path / "train.py", SCRIPT)
    await diagnostics_of(client, doc, since)
    call_start = position_of(SCRIPT, "F.cross_entropy", client.encoding)
    arguments = position_of(SCRIPT, "(probs, y)", client.encoding)
    call_end = types.Position(arguments.line, arguments.character + len("(probs, y)"))

    for where in (call_start, call_end):
        hover = await hover_at(client, doc.uri, where)

        assert hover is not None, where
        assert isinstance(hover.contents, types.MarkupContent)
        assert hover.contents.kind == types.MarkupKind.Markdown
        assert "CrossEntropyLoss" in hover.contents.value
        assert "softmax" in hover.contents.value  # this call's input, from the analysis
    after = types.Position(call_end.line, call_end.character + 2)
    assert await hover_at(client, doc.uri, after) is None


async def test_hover_away_from_a_loss_is_empty(client: RecordingClient, tmp_path):
    since = len(client.publishes)
    doc = open_doc(client, tmp_path / "train.py", TRAIN)
    await diagnostics_of(client, doc, since)

    hover = await hover_at(client, doc.uri, position_of(TRAIN, "zero_grad", client.encoding))

    assert hover is None


async def test_hover_follows_each_new_version_of_the_text(client: RecordingClient, tmp_path):
    """Hovers of one version share one table of contracts; an edit makes a new one, so the
    hover never shows the contract of text that is gone."""
    since = len(client.publishes)
    doc = open_doc(client, tmp_path / "train.py", SCRIPT)
    await diagnostics_of(client, doc, since)
    where = position_of(SCRIPT, "F.cross_entropy", client.encoding)
    for _ in range(3):
        hover = await hover_at(client, doc.uri, where)
        assert hover is not None
        assert "CrossEntropyLoss" in hover.contents.value  # type: ignore[union-attr]
        assert "softmax" in hover.contents.value  # type: ignore[union-attr]

    # Same length and place: the loss becomes a regression loss on the logits.
    edited = SCRIPT.replace("F.cross_entropy(probs, y)", "F.mse_loss(logits, y)    ")
    change_doc(client, doc, edited)
    hover = await hover_at(client, doc.uri, position_of(edited, "F.mse_loss", client.encoding))
    assert hover is not None
    assert "MSELoss" in hover.contents.value  # type: ignore[union-attr]
    assert "CrossEntropyLoss" not in hover.contents.value  # type: ignore[union-attr]

    change_doc(client, doc, edited.replace("F.mse_loss(logits, y)", "print(logits, y)     "))
    assert await hover_at(client, doc.uri, where) is None
