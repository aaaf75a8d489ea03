"""TL301's follow of a config object built in another file of the project.

A trainer class keeps what its constructor is handed (`self.config = cfg`), and the script that
builds the trainer, in another file, passes an instance of a project class for it
(`Runner(cfg=Config(args))`). In: the file's `Facts` and a value a checkpoint stores. Out: the
class name of the plain project object it holds, or None when anything is unknown.
"""

from __future__ import annotations

import ast

from torchls.analysis.facts import Facts
from torchls.analysis.queries.vocabulary import ClassInfo, argument_at

# Methods that decide what pickling writes: an object defining one may reduce itself to data.
_PICKLE_HOOKS = ("__reduce__", "__reduce_ex__", "__getstate__")


def config_from_other_files(
    facts: Facts, value: ast.expr
) -> tuple[str, str, Facts, ast.expr] | None:
    """(kind, class name, facts of a calling file, the instance it builds) for the project
    object `value` holds when it is a parameter (read directly, or kept as `self.<attr>` by
    the class's only assignment of it) of a function or constructor no call here runs, whose
    every call (construction) in the project's other files passes a new instance of one class.
    The class must be plain: no base but `object` or other such project classes, no pickling
    hooks (an `nn.Module`, a dict subclass or an Enum is no such class)."""
    name = value
    if isinstance(value, ast.Attribute):
        values = facts.self_attribute_values(value)
        if len(values) != 1:
            return None
        name = values[0]
    if not isinstance(name, ast.Name):
        return None
    function = facts.parameter_of(name)  # None as well when rebound before this read
    if function is None:
        return None
    if function.name == "__init__":
        sites = facts.constructions_from_other_files(function)
    else:
        sites = facts.calls_from_other_files(function)
    if not sites:
        return None
    found: set[tuple[str, str]] = set()
    first: tuple[Facts, ast.expr] | None = None
    for other, site in sites:
        bound = function.name == "__init__" or isinstance(site.func, ast.Attribute)
        told, argument = argument_at(site, function, name.id, bound)
        if not told or argument is None:
            return None
        instance = _plain_instance(other, argument)
        if instance is None:
            return None
        found.add(instance[:2])
        first = first or (other, instance[2])
    if len(found) != 1 or first is None:
        return None
    kind, class_name = found.pop()
    return kind, class_name, first[0], first[1]


def _plain_instance(facts: Facts, expr: ast.expr) -> tuple[str, str, ast.Call] | None:
    """(kind, class name, the constructor call) when `expr` (in `facts`'s file) holds a new
    instance of a plain project class (a dataclass included), followed through the local
    binding of a name."""
    value: ast.expr | None = expr
    if isinstance(expr, ast.Name):
        value = facts.binding_value(expr)
    if not isinstance(value, ast.Call) or not isinstance(value.func, ast.Name):
        return None
    found = _project_class(facts, value.func.id)
    if found is None or not _plain_class(*found, depth=0):
        return None
    info = found[1]
    return ("dataclass" if info.is_dataclass else "object"), info.node.name, value


def _project_class(facts: Facts, name: str) -> tuple[Facts, ClassInfo] | None:
    if name in facts.classes:
        return facts, facts.classes[name]
    definition = facts.definition(name)
    if definition is None:
        return None
    node = definition.node
    if not isinstance(node, ast.ClassDef):
        return None
    info = definition.facts.classes.get(node.name)
    return (definition.facts, info) if info is not None else None


def _plain_class(facts: Facts, info: ClassInfo, depth: int) -> bool:
    if depth > 3:
        return False
    if any(hook in info.methods for hook in _PICKLE_HOOKS):
        return False
    if info.node.keywords:
        return False  # a metaclass may make it anything
    for base in info.node.bases:
        if isinstance(base, ast.Name) and base.id == "object":
            continue
        if not isinstance(base, ast.Name):
            return False
        found = _project_class(facts, base.id)
        if found is None or not _plain_class(*found, depth=depth + 1):
            return False
    return True
