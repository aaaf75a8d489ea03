"""Notebooks the tests write: a small training notebook in nbformat 4, laid out as Jupyter does.

In: cell lists [(cell_type, source)]. Out: the notebook's bytes (`notebook_bytes`), written the
way Jupyter writes (`indent=1`, sorted keys, non-ASCII kept) unless told otherwise, so the
tests see the layout real files have. The training notebook's bug is TL101: the network's
forward (cell 3) ends in a softmax that cell 5 feeds to cross-entropy (`LOCAL_SOFTMAX_CELLS`:
the softmax is written in cell 5's loss call instead, which TL101 can fix).
"""

from __future__ import annotations

import json
from typing import Any

TRAINING_CELLS: list[tuple[str, str]] = [
    ("markdown", "# A small classifier\n\nTrained for a few steps.\n"),
    (
        "code",
        "%matplotlib inline\n"
        "import torch\n"
        "import torch.nn as nn\n"
        "import torch.nn.functional as F\n",
    ),
    (
        "code",
        "class Classifier(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.head = nn.Linear(4, 3)\n"
        "\n"
        "    def forward(self, x):\n"
        "        return F.softmax(self.head(x), dim=1)\n",
    ),
    (
        "code",
        "!nvidia-smi\n"
        "net = Classifier()\n"
        "loss_fn = nn.CrossEntropyLoss()\n"
        "opt = torch.optim.SGD(net.parameters(), lr=0.1)",
    ),
    (
        "code",
        "for epoch in range(2):\n"
        "    for x, y in [(torch.randn(8, 4), torch.randint(0, 3, (8,)))]:\n"
        "        opt.zero_grad()\n"
        "        loss = loss_fn(net(x), y)\n"
        "        loss.backward()\n"
        "        opt.step()\n"
        "    print(epoch, loss.item())",
    ),
]
# Where TL101 is reported: cell 5, line 4, on `net(x)`.
TL101_CELL, TL101_ROW, TL101_COLUMN = 5, 4, 24
# The same notebook with the softmax written at the loss call, where TL101's safe fix drops it.
LOCAL_SOFTMAX_CELLS = [
    (kind, source.replace("F.softmax(self.head(x), dim=1)", "self.head(x)"))
    for kind, source in TRAINING_CELLS
]
LOCAL_SOFTMAX_CELLS[4] = (
    "code",
    LOCAL_SOFTMAX_CELLS[4][1].replace("loss_fn(net(x), y)", "loss_fn(F.softmax(net(x), dim=1), y)"),
)


def notebook(cells: list[tuple[str, str]], outputs: bool = False, **metadata: Any) -> dict:
    """An nbformat 4.5 notebook of `cells`; with `outputs`, each code cell has a stream output
    and an execution count, as a notebook that was run has."""
    built = []
    for number, (kind, source) in enumerate(cells, start=1):
        cell: dict[str, Any] = {
            "cell_type": kind,
            "id": f"cell-{number}",
            "metadata": {},
            "source": source.splitlines(keepends=True),
        }
        if kind == "code":
            cell["execution_count"] = number if outputs else None
            cell["outputs"] = (
                [{"name": "stdout", "output_type": "stream", "text": [f"ran cell {number}\n"]}]
                if outputs
                else []
            )
        built.append(cell)
    return {
        "cells": built,
        "metadata": metadata
        or {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def notebook_bytes(cells: list[tuple[str, str]], outputs: bool = False, **metadata: Any) -> bytes:
    return (
        json.dumps(
            notebook(cells, outputs, **metadata), indent=1, sort_keys=True, ensure_ascii=False
        )
        + "\n"
    ).encode("utf-8")
