"""Incremental re-parsing gives exactly the tree a full parse gives, for any edit."""

from __future__ import annotations

import ast
import random

from torchls.analysis.source import parse_source, reparse

BASE = """\
import torch
import torch.nn as nn


@torch.no_grad()
def evaluate(model, loader):
    model.eval()
    return [model(x) for x, _ in loader]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)


def train(model, loader, optimizer):
    for x, y in loader:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    train(Net(), [], None)
"""

SNIPPETS = [
    "x = 1",
    "    # a comment",
    "",
    "def helper():\n    return 2",
    "probs = torch.softmax(x, dim=1)",
    "        extra = model(x)",
    "for i in range(3):",
    '"""',
    "class Broken(",
]


def dump(tree: ast.AST) -> str:
    return ast.dump(tree, include_attributes=True)


def mutate(lines: list[str], rng: random.Random) -> list[str]:
    lines = list(lines)
    action = rng.choice(["insert", "delete", "replace", "append"])
    row = rng.randrange(len(lines) + 1)
    if action == "insert":
        lines[row:row] = rng.choice(SNIPPETS).split("\n")
    elif action == "delete" and lines:
        del lines[min(row, len(lines) - 1)]
    elif action == "replace" and lines:
        lines[min(row, len(lines) - 1)] = rng.choice(SNIPPETS).split("\n")[0]
    else:
        lines[min(row, len(lines) - 1)] += rng.choice([" ", "  # edited", "x"])
    return lines


def test_incremental_parse_equals_full_parse_over_random_edits() -> None:
    rng = random.Random(1234)
    for _ in range(60):
        previous = parse_source(BASE)
        lines = BASE.split("\n")
        for _ in range(8):
            lines = mutate(lines, rng)
            text = "\n".join(lines)
            incremental = reparse(previous, text)
            full = parse_source(text)
            assert dump(incremental.tree) == dump(full.tree), text
            assert incremental.syntax_errors == full.syntax_errors
            assert incremental.blanked_rows == full.blanked_rows
            previous = incremental


def test_unchanged_statements_are_reused() -> None:
    previous = parse_source(BASE)
    edited = BASE.replace("self.fc = nn.Linear(4, 2)", "self.fc = nn.Linear(4, 3)")
    result = reparse(previous, edited)
    assert result.tree.body[0] is previous.tree.body[0]  # import torch
    assert result.tree.body[-1] is previous.tree.body[-1]  # the __main__ block
    assert dump(result.tree) == dump(parse_source(edited).tree)
