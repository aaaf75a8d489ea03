"""TL406 `deprecated-amp-api`: the rule module.

Reports the deprecated device-specific AMP entry points (`torch.cuda.amp.*`,
`torch.cpu.amp.*`). In: the file's `Facts`. Out: hits, with a safe fix rewriting the call to
`torch.amp` when the edit is certain.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchls.analysis.facts import Facts
from torchls.analysis.findings import Fix
from torchls.analysis.registry import Hit, rule
from torchls.analysis.rules._edits import insert_at, replace_node
from torchls.analysis.rules._optimization import position

AMP_REPLACEMENTS = {
    "torch.cuda.amp.autocast": ("autocast", "cuda"),
    "torch.cuda.amp.autocast_mode.autocast": ("autocast", "cuda"),
    "torch.cpu.amp.autocast": ("autocast", "cpu"),
    "torch.cpu.amp.autocast_mode.autocast": ("autocast", "cpu"),
    "torch.cuda.amp.GradScaler": ("GradScaler", "cuda"),
    "torch.cuda.amp.grad_scaler.GradScaler": ("GradScaler", "cuda"),
    "torch.cpu.amp.GradScaler": ("GradScaler", "cpu"),
    "torch.cpu.amp.grad_scaler.GradScaler": ("GradScaler", "cpu"),
    "torch.cuda.amp.custom_fwd": ("custom_fwd", "cuda"),
    "torch.cuda.amp.custom_bwd": ("custom_bwd", "cuda"),
}
# The old autocast's positional parameters; torch.amp.autocast orders them differently.
AUTOCAST_POSITIONAL = ("enabled", "dtype", "cache_enabled")


def _amp_uses(facts: Facts) -> Iterator[tuple[ast.AST, ast.expr, str]]:
    """(node to report, callee expression, deprecated qualname) for each call or decorator."""
    for call in facts.calls:
        qualname = facts.call_qualname(call)
        if qualname in AMP_REPLACEMENTS:
            yield call, call.func, qualname
    for function in facts.scope_nodes:
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for decorator in function.decorator_list:
            qualname = facts.qualname(decorator)
            if qualname in AMP_REPLACEMENTS and not isinstance(decorator, ast.Call):
                yield decorator, decorator, qualname


@rule(
    "TL406",
    "deprecated-amp-api",
    "I",
    "Deprecated torch.cuda.amp / torch.cpu.amp API",
    fix="safe",
)
def deprecated_amp_api(facts: Facts) -> Iterator[Hit]:
    """
    ## What it catches
    `torch.cuda.amp.autocast(...)`, `torch.cuda.amp.GradScaler(...)`,
    `torch.cuda.amp.custom_fwd` / `custom_bwd`, and `torch.cpu.amp.autocast` /
    `torch.cpu.amp.GradScaler`, spelled out or imported with `from torch.cuda.amp import ...`.

    ## Why it is wrong
    These device-specific entry points are deprecated since PyTorch 2.4 in favour of the
    device-generic `torch.amp` ones. Every call emits a `FutureWarning` (in every process of a
    distributed job), and they are scheduled for removal.

    ## Example
    ```python
    scaler = torch.cuda.amp.GradScaler()          # TL406
    with torch.cuda.amp.autocast(dtype=torch.bfloat16):   # TL406
        loss = model(x)
    ```

    ## Fix
    `torch.amp.GradScaler("cuda", ...)` and `torch.amp.autocast("cuda", ...)` (`"cpu"` for the
    `torch.cpu.amp` ones), `torch.amp.custom_fwd(device_type="cuda")`. The fix rewrites the
    call and keeps the other arguments (positional `autocast` arguments become keywords, since
    the new signature orders them differently). It is offered only when the edit is certain:
    the file imports `torch` and the call passes no `*args`.
    """
    torch = facts.torch_alias
    for node, func, qualname in _amp_uses(facts):
        name, device = AMP_REPLACEMENTS[qualname]
        old = facts.source.segment(func)
        new = f"torch.amp.{name}"
        yield Hit(
            func,
            f'`{old}` is deprecated; use `{new}("{device}", ...)`'
            if name in ("autocast", "GradScaler")
            else f'`{old}` is deprecated; use `{new}(device_type="{device}")`',
            _amp_fix(facts, node, func, name, device, torch),
        )


def _open_paren(facts: Facts, call: ast.Call) -> tuple[int, int] | None:
    """(row, column) just after the `(` of `call`, when it directly follows the callee."""
    row = call.func.end_lineno or call.func.lineno
    column = facts.source.column(row, call.func.end_col_offset or 0)
    line = facts.source.lines[row - 1]
    rest = line[column:]
    stripped = rest.lstrip()
    if not stripped.startswith("("):
        return None
    return row, column + (len(rest) - len(stripped)) + 1


def _amp_fix(
    facts: Facts,
    node: ast.AST,
    func: ast.expr,
    name: str,
    device: str,
    torch: str | None,
) -> Fix | None:
    if torch is None:
        return None
    scope = facts.scope(node)
    if scope is not facts.tree and facts.assignments_of(torch, scope):
        return None  # `torch` means something else here
    new_func = f"{torch}.amp.{name}"
    message = f"Use `{new_func}` for {device}"
    if not isinstance(node, ast.Call):
        # A bare decorator: `@torch.cuda.amp.custom_fwd`.
        return Fix("safe", message, (replace_node(facts, func, f'{new_func}(device_type="cuda")'),))
    call = node
    if any(isinstance(a, ast.Starred) for a in call.args):
        return None
    opening = _open_paren(facts, call)
    if opening is None:
        return None
    edits = [replace_node(facts, func, new_func)]
    if name in ("custom_fwd", "custom_bwd"):
        if call.args:
            return None
        first = f'device_type="{device}"' + (", " if call.keywords else "")
        edits.append(insert_at(*opening, first))
        return Fix("safe", message, tuple(edits))
    arguments = sorted([*call.args, *call.keywords], key=position)
    if arguments:
        # Before the first argument (keeps a multi-line call's layout). Inserts at the same
        # position merge into one edit: `autocast(True)` → `autocast("cuda", enabled=True)`.
        row = arguments[0].lineno
        first = (row, facts.source.column(row, arguments[0].col_offset))
        inserts = {first: f'"{device}", '}
    else:
        inserts = {opening: f'"{device}"'}
    if name == "autocast":
        if len(call.args) > len(AUTOCAST_POSITIONAL):
            return None
        for argument, parameter in zip(call.args, AUTOCAST_POSITIONAL, strict=False):
            if any(k.arg == parameter for k in call.keywords):
                return None
            row = argument.lineno
            where = (row, facts.source.column(row, argument.col_offset))
            inserts[where] = inserts.get(where, "") + f"{parameter}="
    edits.extend(insert_at(row, column, text) for (row, column), text in inserts.items())
    return Fix("safe", message, tuple(edits))
