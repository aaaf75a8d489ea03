"""The names clients see: workspace commands, code action kinds and titles of torchls.

Why a module of its own: a feature that offers another feature's command (code actions offer
"Show documentation" and "Run bounded repro") needs only its name, so it imports this module
instead of the other feature. In: nothing. Out: string constants (part of the editor contract:
the VS Code extension and the README use them).
"""

from __future__ import annotations

SHOW_RULE_DOC = "torchls.showRuleDoc"
RUN_REPRO = "torchls.runRepro"
CLEAR_REPRO = "torchls.clearRepro"
REPRO_KIND = "torchls.repro"  # the code action kind of "Run bounded repro"
INSPECT_CHECKPOINT = "torchls.inspectCheckpoint"  # [path] -> {"status", "markdown", "loads"}
COMPARE_REPRO = "torchls.compareRepro"  # [uri, baseline] -> {"status", "exit_status", "markdown"}
SHOW_REPRO_REPORT = "torchls.showReproReport"  # [uri] -> {"path", "html"}
INSPECT_KIND = "torchls.inspect"  # the code action kind of "Inspect checkpoint PATH"
COMPARE_TITLE = "Compare with HEAD"  # offered beside "Run bounded repro"
