"""An analysis frees its per-file facts as soon as it returns.

Why: the facts' memos point back at the facts (callees, the mode analysis), so a finished
file left to the cyclic collector costs a scan of its whole tree later, in the CLI and in
the server alike. `analyze` releases them; these tests watch the facts object it builds
through a weak reference, with the collector switched off so only reference counting can
free it.
"""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest

import torchls.analysis.facts as facts_module
from torchls.analysis import analyze

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _analyze_watching_facts(monkeypatch: pytest.MonkeyPatch, source: str) -> tuple[list, list]:
    built: list[weakref.ref] = []
    real_build = facts_module.build_facts

    def watching(*args, **kwargs):
        facts = real_build(*args, **kwargs)
        built.append(weakref.ref(facts))
        return facts

    monkeypatch.setattr(facts_module, "build_facts", watching)
    result = analyze(source, "train.py")
    return built, result.findings


@pytest.mark.parametrize("example", ["image_classifier.py", "resume_and_finetune.py"])
def test_facts_are_freed_without_the_cyclic_collector(
    monkeypatch: pytest.MonkeyPatch, example: str
) -> None:
    source = (EXAMPLES / example).read_text(encoding="utf-8")
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        built, findings = _analyze_watching_facts(monkeypatch, source)
        assert built, "analyze did not build facts"
        assert findings, "the example should give findings (the rules ran on these facts)"
        assert all(ref() is None for ref in built), "facts survived the analysis"
    finally:
        if was_enabled:
            gc.enable()


def test_findings_are_the_same_after_release(monkeypatch: pytest.MonkeyPatch) -> None:
    """Releasing happens after the rules: a second analysis of the same text agrees."""
    source = (EXAMPLES / "image_classifier.py").read_text(encoding="utf-8")
    _, first = _analyze_watching_facts(monkeypatch, source)
    _, second = _analyze_watching_facts(monkeypatch, source)
    assert [(f.code, f.span.start) for f in first] == [(f.code, f.span.start) for f in second]
