"""Inputs and checks shared by the fuzz tests: the seed corpus, mutations and sanity checks.

The seed corpus is every bundled example (examples/*.py, examples/two_files/*.py) and every rule
fixture (tests/rules/fixtures/*/*.py): real training code that triggers every rule, so that
mutations of it exercise the rules' code paths rather than only the parser's.

`FUZZ` is the hypothesis settings every fuzz test uses. Its example count is bounded so the
whole directory stays fast; `TORCHLS_FUZZ_EXAMPLES=N` raises it for a longer, randomised run:

    TORCHLS_FUZZ_EXAMPLES=2000 pytest tests/robustness -k fuzz

By default the runs are derandomised (the same examples every time, so CI is reproducible) and
nothing is written to a `.hypothesis` database; with the variable set, each run draws new
examples and hypothesis prints the seed needed to reproduce a failure.
"""

from __future__ import annotations

import ast
import os
import warnings
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from torchls.analysis import AnalysisResult, Finding, Span
from torchls.analysis.source import SourceError, decode_source, split_lines

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
FIXTURES = ROOT / "tests" / "rules" / "fixtures"

LONG_RUN = os.environ.get("TORCHLS_FUZZ_EXAMPLES", "").strip()


def examples_count(default: int) -> int:
    """`default` examples, or TORCHLS_FUZZ_EXAMPLES when it is set."""
    return int(LONG_RUN) if LONG_RUN else default


def fuzz_settings(default: int) -> settings:
    return settings(
        max_examples=examples_count(default),
        deadline=None,  # no wall-clock thresholds: a slow example is not a failure
        derandomize=not LONG_RUN,
        database=None,
        print_blob=bool(LONG_RUN),
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
        ],
    )


def example_files() -> list[Path]:
    return sorted([*EXAMPLES.glob("*.py"), *EXAMPLES.glob("two_files/*.py")])


def fixture_files() -> list[Path]:
    return sorted(FIXTURES.glob("*/*.py"))


def corpus_files() -> list[Path]:
    return [*example_files(), *fixture_files()]


@cache
def corpus_texts() -> tuple[str, ...]:
    return tuple(path.read_text(encoding="utf-8") for path in corpus_files())


def label(path: Path) -> str:
    return str(path.relative_to(ROOT))


# -- mutations ----------------------------------------------------------------------------------

# Fragments that break Python in the ways half-typed code does, plus characters that break
# line and column bookkeeping (form feed, CR, U+2028, astral characters, tabs).
GARBAGE = (
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ":",
    ",",
    ".",
    "\\",
    "'''",
    '"',
    "f'{",
    "@",
    "**",
    "=",
    "->",
    "def ",
    "class X(",
    "lambda",
    "import",
    "from . import",
    "async ",
    "await",
    "yield",
    "match x:",
    "case _:",
    "return",
    "if",
    "else:",
    "for x in",
    "with",
    "try:",
    "except",
    "# noqa",
    "# noqa: TL101",
    "torch.",
    "F.softmax(",
    "loss.backward()",
    "optimizer.step()",
    "model.eval()",
    "\t",
    "    ",
    "\x0c",
    "\r",
    "\u2028",
    "\x85",
    "é",
    "🔥",
    "\x00",
    "\ud800",
)

fragments = st.sampled_from(GARBAGE)
garbage_line = st.lists(fragments, min_size=1, max_size=6).map("".join)


OPERATIONS = (
    "delete",
    "duplicate",
    "swap",
    "garbage_line",
    "garbage_in_line",
    "cut_line",
    "truncate",
    "brackets",
    "indent",
    "nest",
)
# Edits a user makes to working code: the file keeps its imports, so names resolve as before.
CODE_EDITS = ("delete", "duplicate", "swap", "garbage_line", "cut_line", "indent")


def _is_import(line: str) -> bool:
    return line.lstrip().startswith(("import ", "from "))


@st.composite
def mutated_source(
    draw: st.DrawFn, texts: tuple[str, ...] | None = None, keep_imports: bool = False
) -> str:
    """A corpus file with 1-6 random edits: deleted, duplicated, swapped or garbage lines,
    garbage inserted mid-line, truncation (at a line or a character), unbalanced brackets,
    re-indentation and deep nesting. `keep_imports` leaves import lines alone and only makes
    line-level edits."""
    texts = texts or corpus_texts()
    lines = draw(st.sampled_from(texts)).split("\n")
    for _ in range(draw(st.integers(1, 6))):
        if not lines:
            lines = [""]
        index = draw(st.integers(0, len(lines) - 1))
        line = lines[index]
        operation = draw(st.sampled_from(CODE_EDITS if keep_imports else OPERATIONS))
        if keep_imports and (_is_import(line) or (operation == "swap" and index == 0)):
            continue
        if operation == "delete":
            del lines[index]
        elif operation == "duplicate":
            lines.insert(index, lines[draw(st.integers(0, len(lines) - 1))])
        elif operation == "swap":
            other = draw(st.integers(0, len(lines) - 1))
            if keep_imports and _is_import(lines[other]):
                continue
            lines[index], lines[other] = lines[other], lines[index]
        elif operation == "garbage_line":
            lines.insert(index, draw(garbage_line))
        elif operation == "garbage_in_line":
            column = draw(st.integers(0, len(line)))
            lines[index] = line[:column] + draw(garbage_line) + line[column:]
        elif operation == "cut_line":
            lines[index] = line[: draw(st.integers(0, len(line)))]
        elif operation == "truncate":
            text = "\n".join(lines)
            lines = text[: draw(st.integers(0, len(text)))].split("\n")
        elif operation == "brackets":
            column = draw(st.integers(0, len(line)))
            brackets = draw(st.text(alphabet="([{)]}", min_size=1, max_size=40))
            lines[index] = line[:column] + brackets + line[column:]
        elif operation == "indent":
            lines[index] = draw(st.sampled_from(("", " ", "    ", "\t", " " * 80))) + line.lstrip()
        else:
            depth = draw(st.integers(1, 300))
            kind = draw(st.sampled_from(("()", "[]", "{}", "if x:\n", "f(")))
            if kind.endswith("\n"):
                nested = "".join(" " * level + kind for level in range(min(depth, 100)))
                lines.insert(index, nested + " " * min(depth, 100) + "pass")
            else:
                lines.insert(index, "y = " + kind[0] * depth + kind[1:] * depth)
    return "\n".join(lines)


@st.composite
def mutated_bytes(draw: st.DrawFn) -> bytes:
    """A mutated corpus file as bytes, with invalid UTF-8, BOMs, NULs or a coding cookie."""
    data = draw(mutated_source()).encode("utf-8", "surrogatepass")
    for _ in range(draw(st.integers(1, 4))):
        position = draw(st.integers(0, len(data)))
        insert = draw(
            st.sampled_from(
                (
                    b"\xff",
                    b"\xfe\xff",
                    b"\xc3",
                    b"\xed\xa0\x80",
                    b"\xef\xbb\xbf",
                    b"\x00",
                    b"\x80\x80",
                    b"# -*- coding: latin-1 -*-\n",
                    b"# coding: utf-16\n",
                    b"# coding: no-such-codec\n",
                    b"\r\n",
                    b"\r",
                )
            )
            | st.binary(min_size=1, max_size=16)
        )
        data = data[:position] + insert + data[position:]
    return data


# -- checks -------------------------------------------------------------------------------------


def text_of(source: str | bytes) -> str | None:
    """The text the analysis saw, or None when the bytes cannot be decoded."""
    if isinstance(source, str):
        return source
    try:
        return decode_source(source)
    except SourceError:
        return None


def _inside(lines: list[str], span: Span, what: str) -> None:
    start, end = span.start, span.end
    assert start <= end, f"{what}: start {start} after end {end}"
    for position in (start, end):
        assert 1 <= position.row <= len(lines), f"{what}: row {position.row} of {len(lines)}"
        line = lines[position.row - 1]
        assert 0 <= position.column <= len(line), (
            f"{what}: column {position.column} past the end of row {position.row} ({len(line)})"
        )


def check_finding(lines: list[str], finding: Finding) -> None:
    _inside(lines, finding.span, f"{finding.code} span")
    assert finding.code.startswith("TL") and finding.message.strip()
    assert finding.severity in ("error", "warning", "information")
    for related in finding.related:
        if related.filename is None:
            _inside(lines, related.span, f"{finding.code} related")
    if finding.fix is not None:
        assert finding.fix.applicability in ("safe", "unsafe")
        for edit in finding.fix.edits:
            _inside(lines, edit.span, f"{finding.code} fix edit")


def check_result(source: str | bytes, result: AnalysisResult) -> None:
    """The analysis contract on any input: a result, never an exception, and every position
    inside the text (1-based rows, 0-based code-point columns, as `split_lines` counts)."""
    assert isinstance(result, AnalysisResult)
    if result.error is not None:
        assert result.findings == [], "an unanalysable file has no findings"
        assert result.error.strip() and "\n" not in result.error
        return
    text = text_of(source)
    assert text is not None, "undecodable bytes must give an error, not findings"
    lines = split_lines(text)
    for finding in result.findings:
        check_finding(lines, finding)
    assert result.findings == sorted(result.findings, key=lambda f: (f.span.start, f.code))
    for problem in result.syntax_errors:
        assert 1 <= problem.row <= len(lines)


def parses(text: str) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # invalid escape sequences and the like
        try:
            ast.parse(text)
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            return False
    return True


def truncations(text: str) -> Iterator[str]:
    """The text cut after every line: empty, first line, first two lines, ..., whole."""
    lines = text.splitlines(keepends=True)
    for count in range(len(lines) + 1):
        yield "".join(lines[:count])
