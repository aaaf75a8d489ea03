"""torchls behind a real, headless JupyterLab: jupyter_lsp (the server half of jupyterlab-lsp)
starts `torchls server` from `jupyterlab/jupyter_server_config.json`, the configuration that
docs/jupyterlab.md shows, and relays LSP over its websocket.

The test plays JupyterLab's frontend (`@jupyterlab/lsp`, which jupyterlab-lsp drives) on that
websocket, with what the installed JupyterLab 4 sends: the document URIs and `rootUri` built from
the page config the server hands the browser (`rootUri`, `virtualDocumentsUri`), the notebook's
code cells fetched through the contents API and joined the frontend's way (each cell plus "\n",
cells separated by two blank lines, `%magic` lines rewritten to `get_ipython()` calls),
`initialize` with its capabilities, `initialized`, an empty `workspace/didChangeConfiguration`,
`didOpen` followed at once by a full-text `didChange` of the same version, and answers to the
server's requests. It checks what a user sees: TL101 on the softmax in the right cell, gone
after the edit, a softmax in a project module reported at the notebook's loss call, settings
from jupyterlab-lsp's `serverSettings`, a page reload (a second websocket and `initialize` to the
same server), and torchls stopping with JupyterLab.

Each Jupyter server runs twice: with the documented `requires_documents_on_disk: false` (URIs
are the notebooks' own paths) and without it (jupyter_lsp's default: URIs and shadow copies
under `.virtual_documents/`). Jupyter's own files go under the test's temporary folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("jupyterlab", reason="pip install jupyterlab jupyter-lsp (test extras)")
pytest.importorskip("jupyter_lsp", reason="pip install jupyterlab jupyter-lsp (test extras)")

from tornado.httpclient import HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

HERE = Path(__file__).parent / "jupyterlab"
DOCS = Path(__file__).parents[2] / "docs" / "jupyterlab.md"
TOKEN = "torchls-test-token"
START_TIMEOUT_S = 90  # JupyterLab's first start builds nothing, but a loaded CI box is slow
WAIT_S = 60.0  # a safety net against hangs, not a timing assertion

CELLS = [
    ("markdown", "# Train\nA notebook whose loss gets a softmax."),
    (
        "code",
        "%matplotlib inline\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F",
    ),
    (
        "code",
        "model = nn.Linear(8, 3)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "criterion = nn.CrossEntropyLoss()\n"
        "loader = [(torch.randn(4, 8), torch.randint(0, 3, (4,)))]",
    ),
    (
        "code",
        "model.train()\n"
        "for x, y in loader:\n"
        "    logits = model(x)\n"
        "    probs = F.softmax(logits, dim=1)\n"
        "    loss = criterion(probs, y)\n"
        "    optimizer.zero_grad()\n"
        "    loss.backward()\n"
        "    optimizer.step()",
    ),
]
BUGGY = "    loss = criterion(probs, y)"
MODELS = """\
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        return F.softmax(self.fc(x), dim=1)
"""
CROSS_CELLS = [
    ("code", "import torch\nimport torch.nn as nn\nfrom models import Net"),
    (
        "code",
        "model = Net()\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "criterion = nn.CrossEntropyLoss()\n"
        "loader = [(torch.randn(4, 8), torch.randint(0, 3, (4,)))]\n"
        "model.train()\n"
        "for x, y in loader:\n"
        "    loss = criterion(model(x), y)\n"
        "    optimizer.zero_grad()\n"
        "    loss.backward()\n"
        "    optimizer.step()",
    ),
]
# jupyterlab-lsp's diagnostics feature merged into @jupyterlab/lsp's base capabilities
# (JupyterLab 4.6, jupyterlab-lsp 5.3); hover and the other features add more of the same kind.
CAPABILITIES = {
    "textDocument": {
        "synchronization": {
            "dynamicRegistration": True,
            "willSave": False,
            "didSave": True,
            "willSaveWaitUntil": False,
        },
        "publishDiagnostics": {"tagSupport": {"valueSet": [1, 2]}},
        "hover": {"dynamicRegistration": True, "contentFormat": ["markdown", "plaintext"]},
    },
    "workspace": {"didChangeConfiguration": {"dynamicRegistration": True}},
}


def notebook_json(cells: list[tuple[str, str]]) -> str:
    return json.dumps(
        {
            "nbformat": 4,
            "nbformat_minor": 5,
            "metadata": {
                "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                "language_info": {"name": "python"},
            },
            "cells": [
                {"cell_type": kind, "id": f"c{i}", "metadata": {}, "source": source}
                | ({"outputs": [], "execution_count": None} if kind == "code" else {})
                for i, (kind, source) in enumerate(cells)
            ],
        },
        indent=1,
    )


def override_magics(cell: str) -> str:
    """jupyterlab-lsp's IPython line-magic override, for the `%name args` lines used here."""
    lines = []
    for line in cell.split("\n"):
        match = re.match(r"^(\s*)%(\S+)(.*)$", line)
        lines.append(
            f'{match[1]}get_ipython().run_line_magic("{match[2]}", "{match[3]}")' if match else line
        )
    return "\n".join(lines)


def virtual_document(sources: list[str]) -> tuple[str, list[int]]:
    """The frontend's text for a notebook's code cells, and each cell's first virtual line."""
    blocks, starts, line = [], [], 0
    for source in sources:
        block = override_magics(source)
        starts.append(line)
        blocks.append(block + "\n")
        line += block.count("\n") + 1 + 2  # the cell's lines, then two blank ones
    return "\n\n".join(blocks), starts


class Jupyter:
    """A headless JupyterLab serving `root`, and what its page config tells the frontend."""

    def __init__(self, process: subprocess.Popen[bytes], url: str, root: Path, log: Path) -> None:
        self.process, self.url, self.root, self.log = process, url.rstrip("/"), root, log
        self.page_config = self._page_config()

    def get(self, path: str) -> bytes:
        request = urllib.request.Request(
            self.url + path, headers={"Authorization": f"token {TOKEN}"}
        )
        with urllib.request.urlopen(request, timeout=WAIT_S) as answer:
            return answer.read()

    def _page_config(self) -> dict[str, Any]:
        page = self.get("/lab").decode()
        match = re.search(
            r'<script id="jupyter-config-data" type="application/json">(.*?)</script>', page, re.S
        )
        assert match, "no jupyter-config-data in /lab"
        return json.loads(match[1])

    def code_cells(self, name: str) -> list[str]:
        """The notebook's code cells as the frontend gets them: through the contents API."""
        model = json.loads(self.get(f"/api/contents/{name}?content=1"))
        return [
            "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            for cell in model["content"]["cells"]
            if cell["cell_type"] == "code"
        ]

    def document_base(self, on_disk: bool) -> str:
        """`DocumentConnectionManager.solveUris`: notebooks live under `virtualDocumentsUri`
        unless the server's spec says it needs no documents on disk."""
        return self.page_config["virtualDocumentsUri" if on_disk else "rootUri"]


def start_jupyter(tmp: Path, config: dict[str, Any]) -> Jupyter:
    root, runtime, home = tmp / "root", tmp / "runtime", tmp / "home"
    for folder in (root, runtime, home, tmp / "config", tmp / "data"):
        folder.mkdir()
    (tmp / "config" / "jupyter_server_config.json").write_text(json.dumps(config))
    (root / "pyproject.toml").write_text('[project]\nname = "nb"\nversion = "0"\n')
    (root / "train.ipynb").write_text(notebook_json(CELLS))
    (root / "reload.ipynb").write_text(notebook_json(CELLS))
    (root / "settings.ipynb").write_text(notebook_json(CELLS))
    (root / "cross.ipynb").write_text(notebook_json(CROSS_CELLS))
    (root / "models.py").write_text(MODELS)
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "torchls").exists(), f"no torchls script next to {sys.executable}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "JPY_"))}
    env.update(
        HOME=str(home),
        JUPYTER_CONFIG_DIR=str(tmp / "config"),
        JUPYTER_DATA_DIR=str(tmp / "data"),
        JUPYTER_RUNTIME_DIR=str(runtime),
        JUPYTERLAB_SETTINGS_DIR=str(tmp / "lab-settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(tmp / "lab-workspaces"),
        IPYTHONDIR=str(tmp / "ipython"),
        # The documented argv is `torchls server`: found on PATH, as for a user.
        PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    log = tmp / "jupyter.log"
    command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--port=0"]
    command += ["--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={TOKEN}"]
    command += [f"--ServerApp.root_dir={root}", "--allow-root"]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # one process group: Jupyter, its kernels, torchls
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        infos = list(runtime.glob("jpserver-*.json"))
        if infos:
            with contextlib.suppress(json.JSONDecodeError):  # written while we read it
                info = json.loads(infos[0].read_text())
                return Jupyter(process, info["url"], root, log)
        assert process.poll() is None, f"JupyterLab exited: {log.read_text()}"
        time.sleep(0.2)
    stop(process)
    pytest.fail(f"JupyterLab did not start in {START_TIMEOUT_S} s: {log.read_text()}")


def stop(process: subprocess.Popen[bytes]) -> bool:
    """Stop Jupyter as Ctrl-C does; True when its whole process group (torchls included) is
    gone without a SIGKILL."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(30)
    return False


def documented_config() -> dict[str, Any]:
    return json.loads((HERE / "jupyter_server_config.json").read_text())


@pytest.fixture(
    scope="module", params=[False, True], ids=["documented-config", "documents-on-disk"]
)
def jupyter(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """One JupyterLab per mode; `on_disk` is jupyter_lsp's default, the documented config
    turns it off."""
    on_disk = request.param
    config = documented_config()
    if on_disk:
        del config["LanguageServerManager"]["language_servers"]["torchls"][
            "requires_documents_on_disk"
        ]
    server = start_jupyter(tmp_path_factory.mktemp("jupyterlab"), config)
    server.on_disk = on_disk  # type: ignore[attr-defined]
    yield server
    stopped_cleanly = stop(server.process)
    assert stopped_cleanly, f"something outlived JupyterLab: {server.log.read_text()[-3000:]}"


class Frontend:
    """The LSP side of JupyterLab's frontend on one websocket to /lsp/ws/torchls."""

    def __init__(self, socket: WebSocketClientConnection) -> None:
        self.socket = socket
        self.messages: list[dict[str, Any]] = []
        self.server_requests: list[str] = []
        self._next_id = 0
        self._reader = asyncio.ensure_future(self._read())
        self._changed = asyncio.Event()

    async def _read(self) -> None:
        while True:
            raw = await self.socket.read_message()
            if raw is None:
                return
            message = json.loads(raw)
            if "method" in message and "id" in message:
                # client/registerCapability and workspace/configuration are answered by the
                # frontend (void, and null per item); nothing else is asked of it here.
                self.server_requests.append(message["method"])
                result = None
                if message["method"] == "workspace/configuration":
                    result = [None for _ in message["params"]["items"]]
                await self.send({"id": message["id"], "result": result})
            self.messages.append(message)
            self._changed.set()

    async def send(self, message: dict[str, Any]) -> None:
        await self.socket.write_message(json.dumps({"jsonrpc": "2.0", **message}))

    async def wait_for(self, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        async def scan() -> dict[str, Any]:
            seen = 0
            while True:
                for message in self.messages[seen:]:
                    if predicate(message):
                        return message
                seen = len(self.messages)
                self._changed.clear()
                await self._changed.wait()

        try:
            return await asyncio.wait_for(scan(), WAIT_S)
        except TimeoutError:
            pytest.fail(f"nothing matched in {WAIT_S} s; got {json.dumps(self.messages)[-3000:]}")

    async def request(self, method: str, params: Any) -> Any:
        self._next_id += 1
        ident = self._next_id
        await self.send({"id": ident, "method": method, "params": params})
        answer = await self.wait_for(lambda m: m.get("id") == ident and "method" not in m)
        assert "error" not in answer, answer
        return answer["result"]

    async def initialize(self, root_uri: str) -> dict[str, Any]:
        """What LSPConnection sends when the websocket opens."""
        result = await self.request(
            "initialize",
            {
                "capabilities": CAPABILITIES,
                "initializationOptions": None,
                "processId": None,
                "rootUri": root_uri,
                "workspaceFolders": None,
            },
        )
        await self.send({"method": "initialized", "params": {}})
        await self.send({"method": "workspace/didChangeConfiguration", "params": {"settings": {}}})
        return result

    async def open(self, uri: str, text: str) -> None:
        """sendOpen: didOpen, then at once a full-text didChange with the same version."""
        document = {"uri": uri, "languageId": "python", "text": text, "version": 0}
        await self.send({"method": "textDocument/didOpen", "params": {"textDocument": document}})
        await self.change(uri, text, 0)

    async def change(self, uri: str, text: str, version: int) -> None:
        await self.send(
            {
                "method": "textDocument/didChange",
                "params": {
                    "textDocument": {"uri": uri, "version": version},
                    "contentChanges": [{"text": text}],
                },
            }
        )

    async def diagnostics(
        self, uri: str, accept: Callable[[list[dict[str, Any]]], bool]
    ) -> list[dict[str, Any]]:
        message = await self.wait_for(
            lambda m: (
                m.get("method") == "textDocument/publishDiagnostics"
                and m["params"]["uri"] == uri
                and accept(m["params"]["diagnostics"])
            )
        )
        return message["params"]["diagnostics"]

    async def close(self) -> None:
        self.socket.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._reader, WAIT_S)


@contextlib.asynccontextmanager
async def frontend(jupyter: Jupyter) -> AsyncIterator[Frontend]:
    ws_url = jupyter.url.replace("http", "ws", 1) + "/lsp/ws/torchls"
    request = HTTPRequest(ws_url, headers={"Authorization": f"token {TOKEN}"})
    socket = await asyncio.wait_for(websocket_connect(request), WAIT_S)
    client = Frontend(socket)
    try:
        yield client
    finally:
        await client.close()


def codes(diagnostics: list[dict[str, Any]]) -> list[str]:
    return [d.get("code") for d in diagnostics]


def has(code: str) -> Callable[[list[dict[str, Any]]], bool]:
    return lambda diagnostics: code in codes(diagnostics)


def uri_of(jupyter: Jupyter, name: str) -> str:
    """`URLExt.join(base, virtualDocument.uri)`: the base, then the notebook's path."""
    return jupyter.document_base(jupyter.on_disk).rstrip("/") + "/" + name  # type: ignore[attr-defined]


def test_documented_config_is_the_one_in_the_docs():
    blocks = re.findall(r"```json\n(.*?)```", DOCS.read_text(encoding="utf-8"), re.S)
    assert json.loads(blocks[0]) == documented_config()


def test_status_lists_torchls_with_the_configured_spec(jupyter):
    status = json.loads(jupyter.get("/lsp/status"))
    assert status["version"] == 2
    spec = status["sessions"]["torchls"]["spec"]
    assert spec["languages"] == ["python"]
    assert spec["display_name"] == "torchls"
    assert spec.get("requires_documents_on_disk", True) is jupyter.on_disk
    assert jupyter.page_config["rootUri"] == jupyter.root.resolve().as_uri()
    assert (
        jupyter.page_config["virtualDocumentsUri"]
        == (jupyter.root.resolve() / ".virtual_documents").as_uri()
    )


async def test_softmax_in_a_cell_is_reported_there_and_goes_after_the_fix(jupyter):
    cells = jupyter.code_cells("train.ipynb")
    assert cells == [source for kind, source in CELLS if kind == "code"]
    text, starts = virtual_document(cells)
    uri = uri_of(jupyter, "train.ipynb")
    async with frontend(jupyter) as client:
        result = await client.initialize(jupyter.document_base(jupyter.on_disk))
        assert result["capabilities"]["textDocumentSync"]["openClose"] is True
        await client.open(uri, text)
        found = await client.diagnostics(uri, has("TL101"))

        status = json.loads(jupyter.get("/lsp/status"))["sessions"]["torchls"]
        assert status["status"] == "started"
        assert status["handler_count"] >= 1

        (tl101,) = [d for d in found if d["code"] == "TL101"]
        assert tl101["source"] == "torchls"
        assert tl101["severity"] == 1
        # Where the frontend draws it: the loss line of the third code cell, on `probs`.
        line = tl101["range"]["start"]["line"]
        cell = max(i for i, start in enumerate(starts) if start <= line)
        row = line - starts[cell]
        assert (cell, cells[cell].split("\n")[row]) == (2, BUGGY)
        start, end = tl101["range"]["start"]["character"], tl101["range"]["end"]["character"]
        assert BUGGY[start:end] == "probs"
        assert codes(found).count("TL101") == 1  # the rewritten %matplotlib line adds nothing

        # jupyterlab-lsp's hover (Ctrl + mouse over `criterion`): the loss contract, as Markdown.
        hover = await client.request(
            "textDocument/hover",
            {
                "textDocument": {"uri": uri},
                "position": {"line": line, "character": BUGGY.index("criterion") + 2},
            },
        )
        assert hover["contents"]["kind"] == "markdown"
        assert "CrossEntropyLoss" in hover["contents"]["value"]
        assert "softmax" in hover["contents"]["value"]

        fixed = [c.replace("criterion(probs, y)", "criterion(logits, y)") for c in cells]
        await client.change(uri, virtual_document(fixed)[0], 1)
        await client.diagnostics(uri, lambda diagnostics: "TL101" not in codes(diagnostics))

        shadow = jupyter.root / ".virtual_documents" / "train.ipynb"
        # jupyter_lsp keeps a Python copy of the notebook there only when the spec asks for it.
        assert shadow.exists() is jupyter.on_disk


async def test_softmax_in_a_project_module_is_reported_at_the_notebooks_loss(jupyter):
    """Only with the documented config: under `.virtual_documents/` the notebook's folder has
    no models.py, so the import is not followed (docs/jupyterlab.md says so)."""
    text, _ = virtual_document(jupyter.code_cells("cross.ipynb"))
    uri = uri_of(jupyter, "cross.ipynb")
    async with frontend(jupyter) as client:
        await client.initialize(jupyter.document_base(jupyter.on_disk))
        await client.open(uri, text)
        found = await client.diagnostics(uri, lambda diagnostics: True)
    if jupyter.on_disk:
        assert "TL101" not in codes(found)
        return
    (tl101,) = [d for d in found if d["code"] == "TL101"]
    assert text.split("\n")[tl101["range"]["start"]["line"]] == "    loss = criterion(model(x), y)"
    # jupyterlab-lsp announces no relatedInformation support, so the message names the module.
    assert "relatedInformation" not in tl101
    assert "models.py" in tl101["message"], tl101["message"]


async def test_server_settings_from_jupyterlab_lsp_reach_torchls(jupyter):
    text, _ = virtual_document(jupyter.code_cells("settings.ipynb"))
    uri = uri_of(jupyter, "settings.ipynb")
    async with frontend(jupyter) as client:
        await client.initialize(jupyter.document_base(jupyter.on_disk))
        await client.open(uri, text)
        await client.diagnostics(uri, has("TL101"))
        # `serverSettings: {"torchls.ignore": ["TL101"]}` in jupyterlab-lsp's Language Servers
        # settings, expanded from dotted paths and pushed by updateServerConfigurations.
        settings = {"torchls": {"ignore": ["TL101"]}}
        await client.send(
            {"method": "workspace/didChangeConfiguration", "params": {"settings": settings}}
        )
        await client.diagnostics(uri, lambda diagnostics: "TL101" not in codes(diagnostics))
        await client.send(
            {"method": "workspace/didChangeConfiguration", "params": {"settings": {}}}
        )
        await client.diagnostics(uri, has("TL101"))


async def test_a_page_reload_gets_diagnostics_from_the_same_server(jupyter):
    """A reload opens a new websocket and sends initialize again; jupyter_lsp keeps the one
    torchls process, so the second initialize must be answered and the notebook served."""
    text, _ = virtual_document(jupyter.code_cells("reload.ipynb"))
    uri = uri_of(jupyter, "reload.ipynb")
    for _ in range(2):
        async with frontend(jupyter) as client:
            await client.initialize(jupyter.document_base(jupyter.on_disk))
            await client.open(uri, text)
            await client.diagnostics(uri, has("TL101"))
