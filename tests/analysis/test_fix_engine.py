"""The one fix engine (`torchls.analysis.fix_engine`) that `--fix` and the editor share."""

from __future__ import annotations

from torchls.analysis import analyze
from torchls.analysis.fix_engine import fix_until_stable, refusal

TRAIN = """\
import torch
import torch.nn.functional as F


def train(model, loader, optimizer, checkpoint):
    model.load_state_dict(torch.load(checkpoint))
    for x, y in loader:
        logits = model(x)
        probs = F.softmax(logits, dim=1)
        loss = F.cross_entropy(probs, y.float())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def test_safe_fixes_are_applied_until_stable_and_unsafe_ones_left():
    outcome = fix_until_stable(TRAIN, "train.py")
    assert outcome.refused is None and not outcome.broken
    assert outcome.text == TRAIN.replace("(probs, y.float())", "(logits, y.long())")
    assert outcome.fixed == 2
    assert [f.code for f in outcome.result.findings] == ["TL302"]  # its fix is unsafe
    assert fix_until_stable(outcome.text, "train.py").fixed == 0  # idempotent


def test_unsafe_fixes_only_when_asked():
    outcome = fix_until_stable(TRAIN, "train.py", unsafe=True)
    assert outcome.fixed == 3
    assert outcome.result.findings == []


def test_a_file_with_a_syntax_error_is_never_rewritten():
    broken = TRAIN + "\n\ndef broken(:\n    pass\n"
    result = analyze(broken, "train.py")
    assert result.findings, "the broken file still has findings to report"
    assert refusal(result) is not None
    outcome = fix_until_stable(broken, "train.py", result=result)
    assert outcome.text == broken and outcome.fixed == 0
    assert outcome.refused is not None and "syntax error" in outcome.refused
    assert outcome.result is result  # the findings are still there to report
