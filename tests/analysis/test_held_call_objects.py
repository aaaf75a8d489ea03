"""`self.loss_fn(out, y)` runs the `__call__` of the project object the class keeps on
`self` (built in its constructor or in a base class's, another file included); an
attribute bound to objects of two classes, or to something unknown, is not resolved."""

from __future__ import annotations

import ast
from pathlib import Path

from torchls.analysis import Workspace

OBJECTIVES = """\
class Objective:
    def __call__(self, out, y):
        return (out - y).mean()


class Other:
    def __call__(self, out, y):
        return out.sum()
"""
TRAIN = """\
from objectives import Objective, Other


class Base:
    def __init__(self):
        self.inherited = Objective()


class Trainer(Base):
    def __init__(self, choice, given):
        super().__init__()
        self.objective = Objective()
        self.lazy = None
        self.lazy = Objective()
        self.either = Objective() if choice else Other()
        self.given = given

    def step(self, out, y):
        self.objective(out, y)
        self.inherited(out, y)
        self.lazy(out, y)
        self.either(out, y)
        self.given(out, y)
"""


def test_held_objects_run_their_call_method(tmp_path: Path) -> None:
    (tmp_path / "objectives.py").write_text(OBJECTIVES, encoding="utf-8")
    (tmp_path / "train.py").write_text(TRAIN, encoding="utf-8")
    facts = Workspace(tmp_path).facts_for(tmp_path / "train.py")
    assert facts is not None
    step = facts.classes["Trainer"].methods["step"]
    resolved = {}
    for call in facts.calls_in(step):
        target = facts.callee(call)
        name = ast.unparse(call.func)
        resolved[name] = None if target is None else (Path(target[0].filename).name, target[1].name)
    assert resolved == {
        "self.objective": ("objectives.py", "__call__"),
        "self.inherited": ("objectives.py", "__call__"),
        "self.lazy": ("objectives.py", "__call__"),
        "self.either": None,
        "self.given": None,
    }
