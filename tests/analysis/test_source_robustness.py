"""The analysis survives any input an editor or a repository hands it; positions stay right."""

from __future__ import annotations

from torchls.analysis import analyze

BUGGY_TAIL = (
    "import torch.nn.functional as F\n"
    "def step(logits, y):\n"
    "    probs = F.softmax(logits, dim=1)\n"
    "    return F.cross_entropy(probs, y)\n"
)


def codes(source) -> list[str]:
    return [finding.code for finding in analyze(source).findings]


def test_syntax_error_on_one_line_keeps_other_findings() -> None:
    broken = "import torch\nmodel = torch.nn.Linear(3,\nx = [1, 2\n" + BUGGY_TAIL
    result = analyze(broken)
    assert result.error is None
    assert [f.code for f in result.findings] == ["TL101"]
    assert result.syntax_errors and result.syntax_errors[0].row >= 2


def test_half_typed_block_opener_keeps_findings_below() -> None:
    source = BUGGY_TAIL + "for batch in loader\n    pass\n"
    assert codes(source) == ["TL101"]


def test_binary_input_gives_one_line_message() -> None:
    result = analyze(b"\x00\x01\x02torch\x00")
    assert result.findings == [] and result.error and "\n" not in result.error


def test_non_utf8_input_gives_one_line_message() -> None:
    result = analyze("x = 'caf\u00e9'\n".encode("latin-1"))
    assert result.findings == []
    assert "UTF-8" in result.error


def test_coding_cookie_is_honoured() -> None:
    source = ("# -*- coding: latin-1 -*-\nname = 'caf\u00e9'\n" + BUGGY_TAIL).encode("latin-1")
    assert codes(source) == ["TL101"]


def test_a_cookie_naming_a_codec_registered_at_start_up_reads_as_utf8() -> None:
    """`# -*- coding: future_fstrings -*-` (a codec a `.pth` file registers, common in older
    projects) must not hide the whole file: its bytes are UTF-8 and it is analysed."""
    source = ("# -*- coding: future_fstrings -*-\nname = f'caf\u00e9'\n" + BUGGY_TAIL).encode()
    result = analyze(source)
    assert result.error is None
    assert codes(source) == ["TL101"]
    undecodable = b"# -*- coding: no_such_codec -*-\nname = '\xff\xfe'\n"
    assert "unknown source encoding" in (analyze(undecodable).error or "")


def test_empty_and_whitespace_input() -> None:
    assert analyze("").findings == [] and analyze("").error is None
    assert analyze("\n\n   \n").findings == []


def test_deep_nesting_never_raises() -> None:
    for source in ("x = " + "(" * 5000 + ")" * 5000 + "\n", "x = " + "[" * 200 + "]" * 200):
        result = analyze(source)
        assert result.findings == []


def test_megabyte_file() -> None:
    block = BUGGY_TAIL.replace("def step", "def step_{i}")
    source = "".join(block.replace("{i}", str(i)) for i in range(8000))
    assert len(source) > 1_000_000
    result = analyze(source)
    assert result.error is None and len(result.findings) == 8000


def test_columns_count_code_points_not_bytes() -> None:
    source = (
        "import torch.nn.functional as F\n"
        "def step(logits, y):\n"
        "    probs = F.softmax(logits, dim=1)\n"
        "    note = '\u00e9\U0001f525'; return F.cross_entropy(probs, y)\n"
    )
    finding = analyze(source).findings[0]
    line = source.splitlines()[3]
    assert line[finding.span.start.column :].startswith("probs")
    assert finding.span.end.column - finding.span.start.column == len("probs")


def test_nul_character_in_editor_text_only_costs_its_line() -> None:
    """Python refuses a whole text with a NUL in it; an editor buffer can hold one (a pasted
    binary snippet). Only that line is lost, and the problem names it."""
    source = "import torch\nx = '\x00'\n" + BUGGY_TAIL
    result = analyze(source)
    assert [f.code for f in result.findings] == ["TL101"]
    assert [(p.row, p.column) for p in result.syntax_errors] == [(2, 5)]


def test_byte_order_mark_in_editor_text_keeps_findings_and_columns() -> None:
    """A buffer starting with U+FEFF: Python rejects the character in a str, so the first
    line (usually an import) used to be blanked and the findings that need it were lost."""
    line = "import torch.nn.functional as F; loss = F.cross_entropy(F.softmax(x, dim=1), y)"
    plain = analyze(line + "\n").findings
    marked = analyze("\ufeff" + line + "\n").findings
    assert [f.code for f in marked] == [f.code for f in plain] == ["TL101"]
    start, end = marked[0].span.start.column, marked[0].span.end.column
    assert ("\ufeff" + line)[start:end] == "F.softmax(x, dim=1)"
    assert analyze("\ufeff" + BUGGY_TAIL).findings[0].span.start.row == 4


def test_crlf_line_endings() -> None:
    finding = analyze(BUGGY_TAIL.replace("\n", "\r\n")).findings[0]
    assert (finding.span.start.row, finding.span.start.column) == (4, 27)


def test_noqa_specific_and_bare() -> None:
    silenced = BUGGY_TAIL.replace("(probs, y)", "(probs, y)  # noqa: TL101")
    assert codes(silenced) == []
    other = BUGGY_TAIL.replace("(probs, y)", "(probs, y)  # noqa: TL302")
    assert codes(other) == ["TL101"]
    bare = BUGGY_TAIL.replace("(probs, y)", "(probs, y)  # noqa")
    assert codes(bare) == []
    listed = BUGGY_TAIL.replace("(probs, y)", "(probs, y)  # NOQA: TL302, TL101")
    assert codes(listed) == []


def test_selection_callback_filters_rules() -> None:
    assert analyze(BUGGY_TAIL, enabled=lambda code: code != "TL101").findings == []


def test_time_budget_stops_between_rules_and_says_so() -> None:
    result = analyze(BUGGY_TAIL, budget_s=0.0)
    assert result.stopped_early is not None and "TL101" in result.stopped_early
    assert analyze(BUGGY_TAIL, budget_s=60.0).stopped_early is None


def test_deeply_nested_loops_stay_linear() -> None:
    lines = ["def evaluate(model, loader):"]
    for depth in range(60):
        lines.append("    " * (depth + 1) + f"for x{depth} in loader:")
        lines.append("    " * (depth + 2) + f"model.eval() if x{depth} else model.train()")
    lines.append("    " * 61 + "model(x0)")
    # Exponential re-interpretation of nested loops would never finish; this returns at once.
    assert analyze("\n".join(lines) + "\n").error is None
