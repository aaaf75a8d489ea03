"""TL303 load-weights-only-false: `torch.load(weights_only=False)` of a file that
may come from elsewhere.

Round trips (a file or buffer this code just saved), temporary folders and test files are not
reported. In: the file's `Facts`. Out: `Hit`s on the `weights_only` keyword, no fix.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from torchls.analysis.facts import Facts
from torchls.analysis.registry import Hit, exemption, rule
from torchls.analysis.rules._checkpoints import LOAD, SAVE, _keyword


def _is_test_file(filename: str) -> bool:
    """A pytest module (`test_*.py`, `*_test.py`): it loads what it produced itself."""
    path = Path(filename)
    return path.name.startswith("test_") or path.stem.endswith("_test")


TEMP_FIXTURES = frozenset({"tmp_path", "tmpdir", "tmp_path_factory", "tmpdir_factory"})


@exemption("TL303", "neg_round_trips_and_temporary_files.py")
def _written_here(facts: Facts, load: ast.Call) -> bool:
    """The loaded file is this code's own output: the same path or buffer was passed to
    `torch.save` earlier in the function, it is an in-memory buffer, or it lies in a
    temporary folder."""
    if not load.args:
        return False
    source = load.args[0]
    text = ast.dump(source)
    scope = facts.scope(load)
    for save in facts.calls_to(*SAVE):
        if (
            len(save.args) > 1
            and facts.scope(save) is scope
            and save.lineno <= load.lineno
            and ast.dump(save.args[1]) == text
        ):
            return True  # a round trip
    names = {n.id for n in ast.walk(source) if isinstance(n, ast.Name)}
    if names & TEMP_FIXTURES:
        return True
    for name in names:
        for node in _binding_values(facts, name, scope):
            qualname = facts.call_qualname(node) if isinstance(node, ast.Call) else None
            if qualname and qualname.startswith(("tempfile.", "io.BytesIO")):
                return True
    return False


def _binding_values(facts: Facts, name: str, scope: ast.AST) -> list[ast.AST]:
    """The values `name` is bound to in `scope` (and `with ... as name` context managers)."""
    found: list[ast.AST] = []
    for assignment in facts.assignments_of(name, scope):  # type: ignore[arg-type]
        if assignment.value is not None:
            found.extend(n for n in ast.walk(assignment.value) if isinstance(n, ast.Call))
    return found


@rule(
    "TL303",
    "load-weights-only-false",
    "W",
    "torch.load(weights_only=False) can run arbitrary code",
)
def load_weights_only_false(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    `torch.load(..., weights_only=False)` of a file that may come from elsewhere. Not
    reported: a file or buffer this function wrote with `torch.save` just before (a round
    trip), an in-memory buffer, a path inside a temporary folder (`tempfile`, pytest's
    `tmp_path`/`tmpdir`), and test files loading what they produced.

    ## Why it is wrong
    With `weights_only=False` the file is unpickled with the full pickle machinery: a
    checkpoint downloaded from the internet (or tampered with) can execute any code on load.

    ## Example
    ```python
    ckpt = torch.load(path, weights_only=False)    # TL303
    ```

    ## Fix
    Save plain data (state dicts, numbers, strings, `vars(args)`) and load with the default
    `weights_only=True`; allow-list the few classes you trust with
    `torch.serialization.add_safe_globals([...])`. No automatic fix: the checkpoint's contents
    decide what is needed.
    """
    test_file = _is_test_file(facts.filename)
    for call in facts.calls_to(*LOAD):
        keyword = _keyword(call, "weights_only")
        if keyword is None or not isinstance(keyword.value, ast.Constant):
            continue
        if keyword.value.value is False and not test_file and not _written_here(facts, call):
            yield Hit(
                keyword,
                "`torch.load(weights_only=False)` unpickles arbitrary objects: loading an "
                "untrusted file can run code",
            )
