"""Fuzzing `analyze`: whatever an editor or a repository hands it, it returns a sane result.

The contract (torchls.analysis): `analyze` never raises; findings lie inside the text; an input
that cannot be analysed at all gives a one-line `error` and no findings. Checked on every
truncation of every bundled example and rule fixture, on hypothesis-mutated versions of them
(deleted, duplicated and garbage lines, unbalanced brackets, deep nesting, invalid bytes), on
generated programs (hypothesmith, in test_fuzz_generated.py) and on the extremes: empty, about
1 MB, deeply nested. The incremental re-parse the server uses must give what a full parse
gives on the same mutated text.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.robustness.corpus import (
    check_result,
    corpus_files,
    corpus_texts,
    fuzz_settings,
    label,
    mutated_bytes,
    mutated_source,
    truncations,
)
from torchls.analysis import analyze


@pytest.mark.parametrize("path", corpus_files(), ids=label)
def test_every_line_truncation_gives_a_sane_result(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    for prefix in truncations(text):
        check_result(prefix, analyze(prefix, str(path)))


@pytest.mark.parametrize("path", corpus_files(), ids=label)
def test_cut_inside_every_line_gives_a_sane_result(path: Path) -> None:
    """Half-typed last lines: the text cut in the middle of each line."""
    text = path.read_text(encoding="utf-8")
    offset = 0
    for line in text.splitlines(keepends=True):
        middle = offset + max(1, len(line.rstrip("\n")) // 2)
        check_result(text[:middle], analyze(text[:middle], str(path)))
        offset += len(line)


@fuzz_settings(300)
@given(mutated_source())
def test_mutated_sources_give_sane_results(source: str) -> None:
    check_result(source, analyze(source, "mutated.py"))


@fuzz_settings(150)
@given(mutated_bytes())
def test_mutated_bytes_give_sane_results(data: bytes) -> None:
    check_result(data, analyze(data, "mutated.py"))


@fuzz_settings(150)
@given(st.binary(max_size=4096))
def test_arbitrary_bytes_give_sane_results(data: bytes) -> None:
    check_result(data, analyze(data, "random.py"))


@fuzz_settings(150)
@given(st.text(max_size=2000))
def test_arbitrary_text_gives_sane_results(text: str) -> None:
    check_result(text, analyze(text, "random.py"))


@fuzz_settings(100)
@given(mutated_source(), st.data())
def test_incremental_reparse_matches_a_full_parse(source: str, data: st.DataObject) -> None:
    """What the server does on every keystroke: `previous` = the last parse of the document."""
    before = analyze(source, "edited.py")
    after = data.draw(mutated_source(texts=(source,)), label="edited")
    incremental = analyze(after, "edited.py", previous=before.parsed)
    full = analyze(after, "edited.py")
    check_result(after, incremental)
    assert incremental.findings == full.findings
    assert incremental.syntax_errors == full.syntax_errors
    assert incremental.error == full.error


@fuzz_settings(60)
@given(st.sampled_from(corpus_texts()), st.integers(1, 12), st.data())
def test_edit_sequences_keep_reparse_equal_to_full_parse(
    text: str, steps: int, data: st.DataObject
) -> None:
    """A chain of edits, each parsed incrementally from the previous one's result."""
    previous = analyze(text, "edited.py")
    current = text
    for step in range(steps):
        current = data.draw(mutated_source(texts=(current,)), label=f"step {step}")
        incremental = analyze(current, "edited.py", previous=previous.parsed)
        assert incremental.findings == analyze(current, "edited.py").findings
        previous = incremental


# -- extremes ----------------------------------------------------------------------------------

BUGGY_STEP = (
    "import torch.nn.functional as F\n"
    "def step_{i}(logits, y):\n"
    "    probs = F.softmax(logits, dim=1)\n"
    "    return F.cross_entropy(probs, y)\n"
)


@pytest.mark.parametrize(
    "source",
    [
        "",
        "\n",
        "\r\n" * 1000,
        " " * 10_000,
        "\t\n" * 1000,
        "#" * 100_000,
        "\x0c" * 1000,
        "\ufeff",
        "\x00",
        "\\",
        "'''",
        '"""\n' * 3,
        "(" * 100_000,
        ")" * 100_000,
        "x = " + "(" * 5000 + ")" * 5000 + "\n",
        "y = " + "[" * 300 + "]" * 300 + "\n",
        "y = " + "f(" * 300 + ")" * 300 + "\n",
        "y = x" + ".a" * 100_000 + "\n",
        "y = " + " + ".join(["x"] * 50_000) + "\n",
        "".join(" " * depth + "if x:\n" for depth in range(100)) + " " * 100 + "pass\n",
        "".join(" " * depth + "if x:\n" for depth in range(1000)) + " " * 1000 + "pass\n",
        "".join(" " * depth + "def f():\n" for depth in range(99)) + " " * 99 + "return 1\n",
        "".join(" " * depth + "for x in y:\n" for depth in range(50))
        + " " * 50
        + "loss.backward()\n",
        "\n".join(")]}" for _ in range(100_000)),
        "x = '" + "é🔥" * 50_000 + "'\n",
    ],
    ids=lambda source: f"{len(source)}:{source[:12]!r}",
)
def test_extreme_inputs_give_sane_results(source: str) -> None:
    check_result(source, analyze(source, "extreme.py"))
    data = source.encode("utf-8")
    check_result(data, analyze(data, "extreme.py"))


def test_megabyte_file_with_findings_everywhere() -> None:
    source = "".join(BUGGY_STEP.format(i=i) for i in range(8000))
    assert len(source) > 1_000_000
    result = analyze(source, "big.py")
    check_result(source, result)
    assert len(result.findings) == 8000


def test_megabyte_of_a_mutated_example() -> None:
    text = max(corpus_texts(), key=len)
    source = "\n".join([text, "x = (", text, "def broken(:", text] * 40)
    while len(source) < 1_000_000:
        source += "\n" + text
    check_result(source, analyze(source, "big.py"))


def test_megabyte_single_line() -> None:
    source = "x = [" + "1, " * 350_000 + "]\n"
    check_result(source, analyze(source, "line.py"))
