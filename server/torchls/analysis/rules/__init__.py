"""The rule catalog: one module per rule (`tl201_eval_without_eval_mode.py`), found and imported
here so that importing this package registers every rule.

Why discovery rather than a list: adding a rule is adding one file; nothing else has to name it.
Modules whose name starts with `_` are helpers (edit builders, predicates shared by the rules of
one family), imported by the rule modules that use them, never registered.
In: the package's folder. Out: the side effect of `@rule` in each module.
"""

from __future__ import annotations

import importlib
import os

# `os.listdir`, not `pkgutil`: pkgutil imports `inspect`, which a check must not pay for
# (tests/analysis/test_records.py).
for _file in sorted(os.listdir(__path__[0])):
    if _file.endswith(".py") and not _file.startswith("_"):
        importlib.import_module(f"{__name__}.{_file[:-3]}")
