"""Edits re-analyse only what they can affect, and the diagnostics stay those of a whole
analysis: over stdio (an edited document against the same text opened fresh) and on the
analysis thread's own entry point (`analyse_snapshot`: what it kept and what it redid)."""

from __future__ import annotations

from pathlib import Path

from lsprotocol import types

from torchls.analysis import analyze
from torchls.lsp.documents import Prior, Snapshot, analyse_snapshot
from torchls.lsp.settings import Settings

from .support import RecordingClient, change_doc, close_doc, diagnostics_of, open_doc

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
STEP = """

def step_{n}(model, loader, opt):
    criterion = nn.CrossEntropyLoss()
    for x, y in loader:
        opt.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        opt.step()
"""
BUGGY = "loss = criterion(F.softmax(model(x), dim=1), y)"
TEXT = (
    HEADER
    + "".join(STEP.format(n=n) for n in range(8))
    + STEP.format(n=8).replace("loss = criterion(model(x), y)", BUGGY)
)


def with_bug_in(text: str, n: int) -> str:
    """`text` with step_n's loss fed a softmax (the n-th function's loss line)."""
    head, _, tail = text.partition(f"def step_{n}(")
    return head + f"def step_{n}(" + tail.replace("loss = criterion(model(x), y)", BUGGY, 1)


def shown(diagnostics: list[types.Diagnostic]) -> list[tuple[object, ...]]:
    return sorted(
        (str(d.code), d.range.start.line, d.range.start.character, d.message) for d in diagnostics
    )


async def test_each_edited_version_shows_the_diagnostics_of_that_text_opened_fresh(
    client: RecordingClient, tmp_path: Path
) -> None:
    since = len(client.publishes)
    doc = open_doc(client, tmp_path / "train.py", TEXT)
    assert len(await diagnostics_of(client, doc, since)) == 1
    versions = [
        with_bug_in(TEXT, 2),  # a bug typed into one function
        "# a comment\n\n" + with_bug_in(TEXT, 2),  # rows added above everything
        ("# a comment\n\n" + with_bug_in(TEXT, 2)).replace("def step_5(", "def renamed_5("),
        TEXT.replace(STEP.format(n=4), ""),  # a whole function deleted
        TEXT,
    ]
    for number, text in enumerate(versions):
        since = len(client.publishes)
        change_doc(client, doc, text)
        edited = await diagnostics_of(client, doc, since)
        fresh = open_doc(client, tmp_path / f"fresh_{number}.py", text)
        expected = await diagnostics_of(client, fresh, since)
        close_doc(client, fresh)
        assert shown(edited) == shown(expected), f"version {number}"
        assert len(edited) == text.count(BUGGY)


def test_the_analysis_thread_keeps_the_findings_of_the_functions_an_edit_cannot_reach(
    tmp_path: Path,
) -> None:
    path = tmp_path / "train.py"
    path.write_text(TEXT)
    parsed: dict = {}
    priors: dict[str, Prior] = {}
    uri = path.as_uri()

    def run(version: int, text: str, generations: tuple[int, int] = (0, 0)):
        snapshot = Snapshot(uri, version, text)
        return analyse_snapshot(
            snapshot, str(path), None, Settings(), None, False, parsed, (priors, *generations)
        )

    first = run(1, TEXT)
    assert first.reanalysed is None  # nothing earlier: the whole file
    assert priors[uri].findings == first.findings
    second = run(2, with_bug_in(TEXT, 3))
    statements = len(analyze(TEXT).parsed.tree.body)  # type: ignore[union-attr]
    assert second.reanalysed == (1, statements)  # step_3 alone
    assert second.findings == tuple(analyze(with_bug_in(TEXT, 3), str(path)).findings)
    # Other settings (or another state of the other files): the earlier findings are not used.
    third = run(3, TEXT, generations=(1, 0))
    assert third.reanalysed is None
    assert third.findings == tuple(analyze(TEXT, str(path)).findings)
