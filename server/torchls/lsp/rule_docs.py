"""The `torchls.showRuleDoc` command: a rule's full documentation, shown in the editor.

In: `workspace/executeCommand` with one argument, the rule code (`"TL101"`, or `{"code":
"TL101"}`). Out: the rule's Markdown documentation as the command's result, and, for clients
that announce `window.showDocument`:

- when a docs URL is configured, that page opened in the browser at the rule's section. The URL
  comes from `initializationOptions.docsUrl` (flat, or under `settings` / `torchls`) or the
  `TORCHLS_DOCS_URL` environment variable; `{code}` and `{anchor}` in it are replaced, else
  `#<anchor>` of the rule's heading in docs/rules.md is appended;
- otherwise the Markdown written to a private temporary folder (removed when the server exits,
  or by the next server if this one is killed: `torchls.probe.leftovers`) and opened as a
  document in the editor.

Clients without `window/showDocument` (eglot, Neovim 0.7) would drop the returned Markdown, so
they get the documentation as a `window/showMessage`, rendered as plain text (`plaintext`),
with the docs URL when one is configured.

The "Show documentation for TLxxx" code action (`code_actions`) runs this command.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.capabilities import get_capability
from pygls.exceptions import JsonRpcInvalidParams
from pygls.uris import from_fs_path

from torchls.analysis import Rule, get_rule
from torchls.docs import rule_anchor, rule_markdown
from torchls.lsp import plaintext
from torchls.lsp.commands import SHOW_RULE_DOC  # the name code actions offer
from torchls.lsp.server import TorchLanguageServer
from torchls.lsp.settings import SECTION
from torchls.probe.leftovers import RULES, owned_prefix

logger = logging.getLogger(__name__)

DOCS_URL_ENV = "TORCHLS_DOCS_URL"


def docs_url_from(options: Any) -> str | None:
    """`docsUrl` from initializationOptions in any of the shapes settings.py accepts."""
    for candidate in _option_layers(options):
        value = candidate.get("docsUrl")
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def _option_layers(options: Any) -> list[Mapping[str, Any]]:
    layers: list[Mapping[str, Any]] = []
    pending = [options]
    while pending:
        current = pending.pop(0)
        if not isinstance(current, Mapping):
            continue
        layers.append(current)
        pending.extend(current.get(key) for key in ("settings", SECTION))
    return layers


def rule_url(base: str, rule: Rule) -> str:
    """The page for `rule` under the configured docs URL."""
    anchor = rule_anchor(rule)
    if "{code}" in base or "{anchor}" in base:
        return base.replace("{code}", rule.code).replace("{anchor}", anchor)
    return f"{base.split('#', 1)[0]}#{anchor}"


def _rule_from(arguments: tuple[Any, ...]) -> Rule:
    if len(arguments) != 1:
        raise JsonRpcInvalidParams(f"{SHOW_RULE_DOC} takes one argument, the rule code")
    value = arguments[0]
    if isinstance(value, Mapping):
        value = value.get("code")
    rule = get_rule(value) if isinstance(value, str) else None
    if rule is None:
        raise JsonRpcInvalidParams(f"{SHOW_RULE_DOC}: unknown rule code {value!r}")
    return rule


class RuleDocs:
    """Per-server state: the configured docs URL and the folder holding written pages."""

    def __init__(self) -> None:
        self.docs_url: str | None = None
        self._folder: Path | None = None

    def configure(self, params: types.InitializeParams) -> None:
        self.docs_url = docs_url_from(params.initialization_options) or (
            os.environ.get(DOCS_URL_ENV, "").strip() or None
        )

    def page(self, rule: Rule, markdown: str) -> Path:
        """The rule's Markdown as a file the editor can open."""
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix=owned_prefix(RULES)))
            atexit.register(shutil.rmtree, self._folder, ignore_errors=True)
        path = self._folder / f"{rule.code}.md"
        path.write_text(markdown, encoding="utf-8")
        return path

    async def show(self, server: TorchLanguageServer, *arguments: Any) -> str:
        rule = _rule_from(arguments)
        markdown = rule_markdown(rule)
        if not get_capability(server.client_capabilities, "window.show_document.support", False):
            self.tell(server, rule, markdown)
            return markdown
        if self.docs_url:
            params = types.ShowDocumentParams(uri=rule_url(self.docs_url, rule), external=True)
        else:
            uri = from_fs_path(str(self.page(rule, markdown))) or ""
            params = types.ShowDocumentParams(uri=uri, take_focus=True)
        try:
            result = await server.window_show_document_async(params)
            if result is not None and not result.success:
                logger.info("the client did not show %s", params.uri)
        except Exception as error:  # showing is a courtesy; the answer still carries the doc
            logger.warning("window/showDocument failed: %s", error)
        return markdown

    def tell(self, server: TorchLanguageServer, rule: Rule, markdown: str) -> None:
        """The documentation as a message, for clients that cannot be asked to open it."""
        text = plaintext.render(markdown)
        if self.docs_url:
            text += f"\n\nOnline: {rule_url(self.docs_url, rule)}"
        server.window_show_message(
            types.ShowMessageParams(type=types.MessageType.Info, message=text)
        )


def register(server: TorchLanguageServer) -> None:
    """Attach the `torchls.showRuleDoc` command to `server`."""
    docs = RuleDocs()
    server.initialize_hooks.append(docs.configure)

    @server.command(SHOW_RULE_DOC)
    async def show_rule_doc(ls: TorchLanguageServer, *arguments: Any) -> str:
        return await docs.show(ls, *arguments)
