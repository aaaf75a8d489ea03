"""The torchls language server (pygls 2): diagnostics, code actions, hover and the repro over stdio.

`create_server()` builds a `TorchLanguageServer` with every feature module registered (one module
per feature, esbonio style); `start_stdio()` runs it on stdin/stdout, which `torchls server`
calls. Nothing but protocol messages may reach stdout, so logging goes to stderr.
"""

from __future__ import annotations

import logging
import sys

from torchls.lsp.server import TorchLanguageServer
from torchls.lsp.transport import serve

__all__ = ["TorchLanguageServer", "create_server", "start_stdio"]


def create_server() -> TorchLanguageServer:
    """A new server with the configuration, diagnostics, code action, hover, repro and
    workflow (inspect, compare, report) features."""
    from torchls.lsp import (
        code_actions,
        configuration,
        cross_file,
        diagnostics,
        hover,
        repro,
        rule_docs,
        workflows,
    )

    server = TorchLanguageServer()
    server.docs.register()  # text sync first: every feature works on its documents
    configuration.register(server)
    diagnostics.register(server)
    code_actions.register(server)
    hover.register(server)
    rule_docs.register(server)
    cross_file.register(server)
    repro.register(server)
    workflows.register(server)  # after the repro: it runs through the repro's controller
    return server


def start_stdio() -> int:
    """Serve LSP on stdin/stdout until the client says exit; the process exit status."""
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.WARNING,
        format="torchls %(levelname)s %(name)s: %(message)s",
    )
    # pygls logs every message body at INFO; keep it quiet (lsp-notes §1.2).
    logging.getLogger("pygls").setLevel(logging.WARNING)
    protocol_out = sys.stdout.buffer
    # Anything else that prints (a rule, a library) must not corrupt the protocol stream.
    sys.stdout = sys.stderr
    server = create_server()
    return serve(server, sys.stdin.buffer, protocol_out)
