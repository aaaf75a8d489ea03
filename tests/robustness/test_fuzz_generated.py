"""Fuzzing `analyze` with generated programs (hypothesmith): grammar-valid Python of any shape.

Where the mutation fuzzing starts from training code, these programs are arbitrary: odd
statements, decorators, walrus operators, star-expressions, nested comprehensions, `match`
statements. The analysis must return a sane result for each, and on a program that parses,
applying every fix it offers must leave a program that still parses.
"""

from __future__ import annotations

import hypothesmith
from hypothesis import given

from tests.robustness.corpus import check_result, fuzz_settings, parses
from torchls.analysis import analyze
from torchls.analysis.fixes import apply_fixes, fixes_to_apply


@fuzz_settings(40)
@given(hypothesmith.from_grammar())
def test_grammar_generated_programs_give_sane_results(source: str) -> None:
    result = analyze(source, "generated.py")
    check_result(source, result)
    if parses(source):
        fixed, _ = apply_fixes(source, fixes_to_apply(result.findings, unsafe=True))
        assert parses(fixed), fixed


@fuzz_settings(15)
@given(hypothesmith.from_node())
def test_syntax_tree_generated_programs_give_sane_results(source: str) -> None:
    result = analyze(source, "generated.py")
    check_result(source, result)
    if parses(source):
        assert result.syntax_errors == []
        fixed, _ = apply_fixes(source, fixes_to_apply(result.findings, unsafe=True))
        assert parses(fixed), fixed
