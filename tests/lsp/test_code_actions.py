"""Code actions end to end: quick fixes, noqa, fix-all (safe only), `only` filtering and the
edit shape (versioned document changes or a plain changes map) per client."""

from __future__ import annotations

import pytest
from lsprotocol import types

from .support import (
    MIXED,
    TRAIN,
    Doc,
    RecordingClient,
    change_doc,
    codes,
    diagnostics_of,
    edit_doc,
    edits_in,
    open_doc,
    position_of,
)


async def request_actions(
    client: RecordingClient,
    doc: Doc,
    where: types.Range,
    diagnostics: list[types.Diagnostic],
    only: list[str] | None = None,
) -> list[types.CodeAction]:
    result = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(doc.uri),
            range=where,
            context=types.CodeActionContext(diagnostics=diagnostics, only=only),
        )
    )
    assert all(isinstance(action, types.CodeAction) for action in result or [])
    return list(result or [])


def whole(text: str) -> types.Range:
    lines = text.split("\n")
    return types.Range(types.Position(0, 0), types.Position(len(lines) - 1, len(lines[-1])))


# A form feed (and \v, \x1c-\x1e, \x85, \u2028, \u2029) is no line break for LSP or Python,
# but str.splitlines() breaks there; an incremental edit below it must still land correctly.
TRAIN_WITH_FORM_FEED = TRAIN.replace("import torch\n", "import torch  # \x0c page \u2028 break\n")


@pytest.mark.parametrize("text", [TRAIN, TRAIN_WITH_FORM_FEED], ids=["plain", "form-feed"])
async def test_quick_fix_removes_the_finding(client: RecordingClient, tmp_path, text):
    since = len(client.publishes)
    doc = open_doc(client, tmp_path / "train.py", text)
    [diagnostic] = await diagnostics_of(client, doc, since)

    actions = await request_actions(client, doc, diagnostic.range, [diagnostic])

    [fix] = [a for a in actions if a.title.startswith("Fix TL101: ")]
    assert fix.kind == types.CodeActionKind.QuickFix
    assert fix.is_preferred is True
    assert "(unsafe)" not in fix.title
    assert [(d.code, d.range) for d in fix.diagnostics or []] == [("TL101", diagnostic.range)]
    assert fix.edit is not None
    edit_doc(client, doc, edits_in(fix.edit, doc, client.document_changes))
    assert doc.text == text.replace("cross_entropy(probs", "cross_entropy(logits")
    assert await diagnostics_of(client, doc, since) == []
    # The server's copy of the text matches ours: the fix is gone, nothing else changed.
    change_doc(client, doc, doc.text.replace("(logits, y)", "(probs, y)"))
    assert codes(await diagnostics_of(client, doc, since)) == ["TL101"]


async def test_disable_for_this_line_adds_noqa(client: RecordingClient, tmp_path):
    since = len(client.publishes)
    doc = open_doc(client, tmp_path / "train.py", TRAIN)
    [diagnostic] = await diagnostics_of(client, doc, since)

    actions = await request_actions(client, doc, diagnostic.range, [diagnostic])

    [disable] = [a for a in actions if a.title == "Disable TL101 for this line"]
    assert disable.kind == types.CodeActionKind.QuickFix
    assert disable.edit is not None
    edit_doc(client, doc, edits_in(disable.edit, doc, client.document_changes))
    assert doc.text.splitlines()[9].endswith("F.cross_entropy(probs, y)  # noqa: TL101")
    assert await diagnostics_of(client, doc, since) == []


async def test_unsafe_fix_is_labelled_and_never_preferred(client: RecordingClient, tmp_path):
    since = len(client.publishes)
    doc = open_doc(client, tmp_path / "train.py", MIXED)
    diagnostics = await diagnostics_of(client, doc, since)
    [load] = [d for d in diagnostics if d.code == "TL302"]

    actions = await request_actions(client, doc, load.range, [load])

    [fix] = [a for a in actions if a.title.startswith("Fix TL302: ")]
    assert fix.title.endswith("(unsafe)")
    assert not fix.is_preferred
    assert [a.title for a in actions if a.title.startswith("Disable")] == [
        "Disable TL302 for this line"
    ]


async def test_fix_all_applies_only_safe_fixes(client: RecordingClient, tmp_path):
    since = len(client.publishes)
    doc = open_doc(client, tmp_path / "train.py", MIXED)
    assert codes(await diagnostics_of(client, doc, since)) == ["TL101", "TL106", "TL302"]

    actions = await request_actions(client, doc, whole(MIXED), [], only=["source.fixAll"])

    [fix_all] = actions
    assert fix_all.kind == "source.fixAll.torchls"
    assert fix_all.edit is not None
    edits = edits_in(fix_all.edit, doc, client.document_changes)
    assert len(edits) == 1
    edit_doc(client, doc, edits)
    expected = MIXED.replace("cross_entropy(probs, y)", "cross_entropy(logits, y)").replace(
        "y.float()", "y.long()"
    )
    assert doc.text == expected  # torch.load(checkpoint) is left alone: its fix is unsafe
    assert codes(await diagnostics_of(client, doc, since)) == ["TL302"]


async def test_fix_all_leaves_a_file_with_a_syntax_error_untouched(
    client: RecordingClient, tmp_path
):
    """Like `torchls check --fix`, fix-all never rewrites a file that does not parse (its fix
    spans could be stale): the safe fixes are still reported, but no edit is offered."""
    broken = MIXED + "\n\ndef broken(:\n    pass\n"
    since = len(client.publishes)
    doc = open_doc(client, tmp_path / "train.py", broken)
    assert "TL101" in codes(await diagnostics_of(client, doc, since))

    actions = await request_actions(client, doc, whole(broken), [], only=["source.fixAll"])

    assert actions == []
    assert doc.text == broken


async def test_only_filters_the_kinds(client: RecordingClient, tmp_path):
    since = len(client.publishes)
    doc = open_doc(client, tmp_path / "train.py", MIXED)
    diagnostics = await diagnostics_of(client, doc, since)

    quick = await request_actions(client, doc, whole(MIXED), diagnostics, only=["quickfix"])
    source = await request_actions(client, doc, whole(MIXED), diagnostics, only=["source"])
    repro = await request_actions(client, doc, whole(MIXED), diagnostics, only=["torchls.repro"])
    everything = await request_actions(client, doc, whole(MIXED), diagnostics)

    assert quick and all(a.kind == types.CodeActionKind.QuickFix for a in quick)
    assert [a.kind for a in source] == ["source.fixAll.torchls"]
    # The range holds a training loop: the repro, and the comparison with HEAD beside it.
    assert [a.title for a in repro] == ["Run bounded repro", "Compare with HEAD"]
    assert len(everything) == len(quick) + len(source) + len(repro)
    # One fix per fixable finding (TL303-like findings without fixes get none) and one
    # "Disable" per finding.
    assert sorted(a.title.split(":")[0] for a in quick if a.title.startswith("Fix")) == [
        "Fix TL101",
        "Fix TL106",
        "Fix TL302",
    ]


async def test_no_actions_away_from_findings(client: RecordingClient, tmp_path):
    since = len(client.publishes)
    doc = open_doc(client, tmp_path / "train.py", TRAIN)
    await diagnostics_of(client, doc, since)
    start = position_of(TRAIN, "optimizer.step()", client.encoding)

    actions = await request_actions(client, doc, types.Range(start, start), [], only=["quickfix"])

    assert actions == []
