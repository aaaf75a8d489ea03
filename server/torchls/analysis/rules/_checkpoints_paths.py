"""TL302's question of whether a `torch.save` and a `torch.load` in two functions of one file
name the same file.

Why: the same path text in two functions (`save(self, path)` / `restore(self, path)`) only
names one file when the paths it reads come from one place: names neither function binds, or
parameters the file's own calls fill with the same value (`train(config)` calling
`test(config)`, or `fit` calling `self.save(best)` and `self.load(best)`). A pair of methods
whose paths come from unknown callers may read a file written anywhere, on any device.
In: `Facts`, the save's path expression and the load call. Out: a yes/no.
"""

from __future__ import annotations

import ast

from torchls.analysis.facts import Facts


def _roots(facts: Facts, path: ast.expr) -> list[ast.Name]:
    return [n for n in ast.walk(path) if isinstance(n, ast.Name) and n.id != "self"]


def _bound_at_calls(facts: Facts, function: ast.AST, name: str) -> list[tuple[ast.Call, str]]:
    """(call, argument text) for each call of this file to `function` that binds `name`."""
    found = []
    for call in facts.project_calls:
        asked = facts.call_summary(call)
        if asked is None or asked[2] is not facts:
            continue
        target = facts.callee(call)
        if target is None or target[1] is not function:
            continue
        argument = asked[1].get(name)
        if argument is not None:
            found.append((call, facts.source.segment(argument) or ""))
    return found


def _same_parameter_value(facts: Facts, saver: ast.AST, loader: ast.AST, name: str) -> bool:
    """Parameter `name` of `loader` gets the value the saver's own `name` holds: the saver
    calls the loader passing `name` on, or one function calls both with the same argument."""
    into_loader = _bound_at_calls(facts, loader, name)
    if any(facts.scope(call) is saver and text == name for call, text in into_loader):
        return True
    into_saver = _bound_at_calls(facts, saver, name)
    return any(
        facts.scope(a) is facts.scope(b) and ta == tb and ta
        for a, ta in into_saver
        for b, tb in into_loader
    )


def same_path_value(facts: Facts, path: ast.expr, load: ast.Call) -> bool:
    """The save's `path` (with the same text as the load's) names the same file at the load."""
    saver, loader = facts.scope(path), facts.scope(load)
    if saver is loader:
        return True
    names = [*_roots(facts, path), *(n for a in load.args[:1] for n in _roots(facts, a))]
    params = [
        {a.arg for a in [*f.args.posonlyargs, *f.args.args, *f.args.kwonlyargs]}
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
        else set()
        for f in (saver, loader)
    ]
    for name in names:
        if not facts.binds_locally(name):
            continue
        # A local of either function, or a parameter the file's calls do not tie together.
        if not all(name.id in p for p in params):
            return False
        if not _same_parameter_value(facts, saver, loader, name.id):
            return False
    return True
