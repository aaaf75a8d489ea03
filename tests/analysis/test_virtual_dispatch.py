"""Virtual dispatch in the object model: a base-class method's `self.m(...)` may run a
subclass's override, and a subclass's override is called from the base's methods it
inherits; what flows into the override is what the subclass's own methods produce."""

from __future__ import annotations

import ast
from pathlib import Path

from torchls.analysis import Workspace
from torchls.analysis.objects import ObjectModel

SOURCE = """\
import torch
from torch import nn


class Base(nn.Module):
    def forward(self, x):
        return x, x

    def score(self, out, y):
        return (out - y).abs().mean()

    def step(self, x, y):
        out, _ = self.forward(x)
        return self.score(out, y)


class Child(Base):
    def forward(self, x):
        return torch.sigmoid(x), x

    def score(self, out, y):
        return nn.BCELoss()(out, y)


class Squashed(Base):
    def forward(self, x):
        return torch.tanh(x), x


class Replaces(Base):
    def step(self, x, y):
        return self.score(x, y)

    def score(self, out, y):
        return out.sum()
"""


def _facts(tmp_path: Path):
    path = tmp_path / "model.py"
    path.write_text(SOURCE, encoding="utf-8")
    facts = Workspace(tmp_path).facts_for(path)
    assert facts is not None
    return facts


def _method(facts, klass: str, name: str):
    return facts.classes[klass].methods[name]


def test_override_is_called_from_the_inherited_base_method(tmp_path: Path) -> None:
    facts = _facts(tmp_path)
    model = facts.get(ObjectModel)
    sites = model.inherited_call_sites(_method(facts, "Child", "score"))
    assert [ast.unparse(site) for site in sites] == ["self.score(out, y)"]
    assert facts.scope(sites[0]) is _method(facts, "Base", "step")
    # `Replaces` overrides `step`: the base's `step` never runs on it.
    assert model.inherited_call_sites(_method(facts, "Replaces", "score")) == []
    # The base's own method is reached by its ordinary call sites only.
    assert model.inherited_call_sites(_method(facts, "Base", "score")) == []


def test_override_parameter_follows_the_subclass_forward(tmp_path: Path) -> None:
    facts = _facts(tmp_path)
    score = _method(facts, "Child", "score")
    out = next(
        n for n in ast.walk(score) if isinstance(n, ast.Name) and n.id == "out" and n.lineno > 20
    )
    origins = facts.origins(out)
    assert [ast.unparse(o.node) for o in origins] == ["torch.sigmoid(x)"]


def test_base_tuple_unpack_has_one_path_per_class(tmp_path: Path) -> None:
    facts = _facts(tmp_path)
    step = _method(facts, "Base", "step")
    call = next(n for n in ast.walk(step) if isinstance(n, ast.Call))
    returns = facts.get(ObjectModel).dispatched_returns(call)
    assert returns is not None
    owners = sorted((klass.name, ast.unparse(expr)) for _, expr, klass in returns)
    # `Child` also overrides `score`, which `step` calls: seen from `step` alone its path
    # is left out (it is followed from `Child.score`, see the test above).
    assert owners == [("Base", "(x, x)"), ("Squashed", "(torch.tanh(x), x)")]


BASE = """\
from torch import nn


class Trainable(nn.Module):
    def fit(self, batch, labels):
        return self(batch)
"""
SUBCLASS = """\
import torch
from base import Trainable


class Net(Trainable):
    def forward(self, batch):
        return torch.sigmoid(batch)
"""
UNRELATED = """\
import torch


class Trainable:
    def forward(self, batch):
        return batch
"""


def test_subclass_in_another_file_is_dispatched_to(tmp_path: Path) -> None:
    (tmp_path / "base.py").write_text(BASE, encoding="utf-8")
    (tmp_path / "net.py").write_text(SUBCLASS, encoding="utf-8")
    (tmp_path / "other.py").write_text(UNRELATED, encoding="utf-8")
    workspace = Workspace(tmp_path)
    facts = workspace.facts_for(tmp_path / "base.py")
    assert facts is not None
    fit = facts.classes["Trainable"].methods["fit"]
    call = next(n for n in ast.walk(fit) if isinstance(n, ast.Call))
    overrides = facts.get(ObjectModel).overrides_in_subclasses(call, "forward")
    assert [(Path(ref.facts.filename).name, ref.info.node.name) for ref, _ in overrides] == [
        ("net.py", "Net")
    ]
    # The files searched are what the base's analysis now depends on.
    assert (tmp_path / "base.py").resolve() in workspace.dependents_of(tmp_path / "net.py")
