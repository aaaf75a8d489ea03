"""The result cache and virtual dispatch across files: a base class's loop runs the
`forward` of subclasses defined in other project files, so the base's file depends on the
files searched for them; editing a subclass re-analyses the base's file."""

from __future__ import annotations

from .conftest import Project
from .test_cli_cache import analyses, check  # noqa: F401  (the fixture is used by name)

BASE = """\
from torch import nn


class Trainable(nn.Module):
    def __init__(self):
        super().__init__()
        self.criterion = nn.CrossEntropyLoss()

    def fit(self, batches, optimizer):
        for batch, labels in batches:
            optimizer.zero_grad()
            loss = self.criterion(self(batch), labels)
            loss.backward()
            optimizer.step()
"""
SUBCLASS = """\
import torch
from torch import nn
from base import Trainable


class Net(Trainable):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 3)

    def forward(self, batch):
        return self.layer(batch)
"""


def test_editing_a_subclass_in_another_file_re_analyses_the_base(
    project: Project,
    analyses: list[str],  # noqa: F811
) -> None:
    project.write("pyproject.toml", "")
    project.write("base.py", BASE)
    project.write("net.py", SUBCLASS)
    assert "TL101" not in check(project)["base.py"]
    analyses.clear()
    project.write(
        "net.py",
        SUBCLASS.replace(
            "return self.layer(batch)", "return torch.softmax(self.layer(batch), dim=1)"
        ),
    )
    after = check(project)
    assert sorted(analyses) == ["base.py", "net.py"]
    assert "TL101" in after["base.py"]
