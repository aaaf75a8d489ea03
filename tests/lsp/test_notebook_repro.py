"""The repro of a notebook in the editor: real torch in the sandbox, findings back in cells.

A notebook open over notebook sync offers "Run bounded repro" in the cell that trains; the run
executes its code cells up to that one (the saved notebook, as the CLI's repro does) and the
NaN it finds is published on the cell and line that made it, in the cell's own coordinates;
the hover in that cell shows the traced tensor.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from lsprotocol import types

from .notebook_support import cell_diagnostics, close_notebook, open_notebook
from .support import position_of, range_of, session

pytest.importorskip("torch")
if not sys.platform.startswith("linux"):
    pytest.skip("the sandboxed repro runs on Linux", allow_module_level=True)

# The NaN is born on cell 4's `torch.log` line; cell 5 comes after the training and never
# runs (it would fail if it did).
CELLS = [
    ("markdown", "# NaN hunt\n"),
    (
        "code",
        "%matplotlib inline\n"
        "import torch\n"
        "import torch.nn as nn\n"
        "import torch.nn.functional as F\n",
    ),
    (
        "code",
        "torch.manual_seed(0)\n"
        "model = nn.Linear(4, 3)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "x = torch.randn(8, 4)\n"
        "y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])\n",
    ),
    (
        "code",
        "for step in range(10):\n"
        "    probs = F.softmax(model(x), dim=1) * (y[:, None] != 0)\n"
        "    logp = torch.log(probs)\n"
        "    loss = -(logp * F.one_hot(y, 3)).sum() / len(y)\n"
        "    opt.zero_grad()\n"
        "    loss.backward()\n"
        "    opt.step()\n",
    ),
    ("code", "raise SystemExit('cells after the training must not run')\n"),
]


async def test_repro_of_a_notebook_reports_the_nan_in_its_cell(tmp_path: Path) -> None:
    configuration = {"probe": {"device": "cpu", "timeout": 60}}
    async with session(
        "visual_studio_code", configuration=configuration, root=tmp_path, notebooks=True
    ) as client:
        notebook = open_notebook(client, tmp_path / "hunt.ipynb", CELLS, saved=True)
        await cell_diagnostics(client, notebook, 4, 0)
        loop_cell = notebook.cell_uri(4)
        actions = await client.text_document_code_action_async(
            types.CodeActionParams(
                text_document=types.TextDocumentIdentifier(loop_cell),
                range=range_of(notebook.text(4), "opt.zero_grad()", client.encoding),
                context=types.CodeActionContext(diagnostics=[]),
            )
        )
        [run] = [a for a in actions or [] if a.title == "Run bounded repro"]
        assert run.command is not None
        assert list(run.command.arguments or []) == [{"uri": notebook.uri}]
        # Not offered in the set-up cell.
        setup = await client.text_document_code_action_async(
            types.CodeActionParams(
                text_document=types.TextDocumentIdentifier(notebook.cell_uri(3)),
                range=range_of(notebook.text(3), "x = torch.randn", client.encoding),
                context=types.CodeActionContext(diagnostics=[]),
            )
        )
        assert not [a for a in setup or [] if a.title == "Run bounded repro"]

        since = len(client.publishes)
        result = await client.workspace_execute_command_async(
            types.ExecuteCommandParams(command=run.command.command, arguments=run.command.arguments)
        )
        assert isinstance(result, dict) and result["status"] == "ok", result

        def has_probe(params: types.PublishDiagnosticsParams) -> bool:
            return params.uri == loop_cell and any(
                d.source == "torchls-probe" for d in params.diagnostics
            )

        published = await client.wait_for_publish(has_probe, since)
        [tl901] = [d for d in published.diagnostics if d.code == "TL901"]
        assert tl901.range == range_of(notebook.text(4), "torch.log(probs)", client.encoding)
        for number in (2, 3, 5):
            assert not [
                d
                for p in client.publishes_for(notebook.cell_uri(number), since)
                for d in p.diagnostics
                if d.source == "torchls-probe"
            ]
        hover = await client.text_document_hover_async(
            types.HoverParams(
                text_document=types.TextDocumentIdentifier(loop_cell),
                position=position_of(notebook.text(4), "logp =", client.encoding),
            )
        )
        assert hover is not None
        assert "[8, 3]" in hover.contents.value and "First non-finite value" in hover.contents.value
        close_notebook(client, notebook)
