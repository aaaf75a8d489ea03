"""Plain record classes (`@record`): the value types of torchls, declared by their fields.

Why not `dataclasses`: a `torchls check` process is short, and on a small repository its start
weighs as much as its analysis. Importing `dataclasses` pulls in `inspect` (and with it `dis`,
`tokenize`, `linecache`), and `@dataclass` compiles every generated method of every class at
import: together about a fifth of what a check of a median repository cost (measured by
`bench/check_vs_ast.py --whole`). `@record` covers what this code base uses of `@dataclass`
(fields with defaults or default factories, `repr`/`compare` per field, `frozen`, `order`,
`__post_init__`) and
compiles a generated method when it is first called, so a class a process never builds or
compares costs no compile. Type checkers read it as a dataclass (`dataclass_transform`).

In: a class whose annotated attributes are its fields, in order. Out: the same class with
`__init__`, `__repr__`, `__eq__` (and for `frozen=True` `__hash__` and no assignment; for
`order=True` the comparisons), `__match_args__` and `__record_fields__`; `replace(obj, **changes)`
and `fields(cls)` as `dataclasses` has them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    # A type checker aimed at Python 3.10 has no `typing.dataclass_transform`; without it every
    # record's `__init__` reads as taking no arguments. The stubs are the checker's own.
    from typing_extensions import dataclass_transform
else:
    try:
        from typing import dataclass_transform
    except ImportError:  # Python 3.10 at run time: the decorator only marks the function

        def dataclass_transform(**_: Any) -> Callable[[Any], Any]:
            return lambda function: function


T = TypeVar("T")


class _Missing:
    """The absence of a default (None is a default like any other)."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


class FrozenInstanceError(AttributeError):
    """Assignment to a field of a `frozen=True` record."""


class Field:
    """What `field(...)` declares for one attribute; read once, when the class is built."""

    __slots__ = ("compare", "default", "default_factory", "name", "repr")

    def __init__(self, default: Any, default_factory: Any, repr: bool, compare: bool) -> None:
        self.name = ""
        self.default = default
        self.default_factory = default_factory
        self.repr = repr
        self.compare = compare

    def __repr__(self) -> str:
        return f"Field(name={self.name!r}, default={self.default!r})"


def field(
    *,
    default: Any = MISSING,
    default_factory: Callable[[], Any] | Any = MISSING,
    repr: bool = True,
    compare: bool = True,
) -> Any:
    """A field with a default, a default factory (a new value per instance), or left out of
    `repr` / equality."""
    if default is not MISSING and default_factory is not MISSING:
        raise ValueError("a field cannot have both a default and a default_factory")
    return Field(default, default_factory, repr, compare)


@dataclass_transform(field_specifiers=(field,))
def record(cls: type[T] | None = None, /, *, frozen: bool = False, order: bool = False) -> Any:
    """Make `cls` a record (see the module docstring); `@record` or `@record(frozen=True)`."""

    def build(target: type[T]) -> type[T]:
        return _build(target, frozen, order)

    return build if cls is None else build(cls)


def fields(obj_or_cls: Any) -> tuple[Field, ...]:
    """The fields of a record class or instance, in declaration order."""
    declared = getattr(obj_or_cls, "__record_fields__", None)
    if declared is None:
        raise TypeError(f"{obj_or_cls!r} is not a record")
    return declared


def replace(obj: T, /, **changes: Any) -> T:
    """A copy of the record `obj` with `changes` applied (through `__init__`, so defaults and
    factories behave as at construction)."""
    declared = fields(obj)
    known = {f.name for f in declared}
    unknown = sorted(set(changes) - known)
    if unknown:
        raise TypeError(f"{type(obj).__name__} has no field {', '.join(unknown)}")
    values = {f.name: changes.get(f.name, getattr(obj, f.name)) for f in declared}
    return type(obj)(**values)


_MUTABLE_DEFAULTS = (list, dict, set)


def _build(cls: type[T], frozen: bool, order: bool) -> type[T]:
    # Not `inspect.get_annotations`: importing inspect is the cost this module avoids.
    annotations = cls.__dict__.get("__annotations__", {})  # noqa: RUF063
    declared: list[Field] = []
    for name, annotation in annotations.items():
        if isinstance(annotation, str) and annotation.startswith(("ClassVar", "typing.ClassVar")):
            continue
        value = cls.__dict__.get(name, MISSING)
        spec = value if isinstance(value, Field) else Field(value, MISSING, True, True)
        spec.name = name
        if isinstance(spec.default, _MUTABLE_DEFAULTS):
            raise ValueError(
                f"{cls.__name__}.{name}: a mutable default would be shared by every instance; "
                "use field(default_factory=...)"
            )
        if spec.default is MISSING:
            if isinstance(value, Field):
                delattr(cls, name)  # no class attribute for a factory-made or required field
        else:
            setattr(cls, name, spec.default)
        declared.append(spec)
    required_after_default = [
        f.name
        for i, f in enumerate(declared)
        if f.default is MISSING
        and f.default_factory is MISSING
        and any(g.default is not MISSING or g.default_factory is not MISSING for g in declared[:i])
    ]
    if required_after_default:
        raise TypeError(
            f"{cls.__name__}: field {required_after_default[0]!r} without a default follows "
            "one with a default"
        )
    # A class that writes `__eq__` gets `__hash__ = None` from Python itself: not its own.
    own_hash = "__hash__" in cls.__dict__ and not (
        cls.__dict__["__hash__"] is None and "__eq__" in cls.__dict__
    )
    methods: dict[str, Callable[..., Any]] = {
        "__init__": _deferred("__init__"),
        "__repr__": _repr,
        "__eq__": _deferred("__eq__"),
    }
    if frozen:
        methods.update(__hash__=_deferred("__hash__"), __setattr__=_setattr, __delattr__=_delattr)
    if order:
        methods.update({name: _deferred(name) for name in _ORDER})
    for name, method in methods.items():
        if name in cls.__dict__ and not (name == "__hash__" and not own_hash):
            continue  # a method the class writes itself wins, as with dataclasses
        setattr(cls, name, method)
    if not frozen and not own_hash:
        cls.__hash__ = None  # type: ignore[assignment]  # mutable and compared by value
    cls.__match_args__ = tuple(f.name for f in declared)  # type: ignore[attr-defined]
    cls.__record_fields__ = tuple(declared)  # type: ignore[attr-defined]
    cls.__record_frozen__ = frozen  # type: ignore[attr-defined]
    return cls


_ORDER = {"__lt__": "<", "__le__": "<=", "__gt__": ">", "__ge__": ">="}


def _deferred(name: str) -> Callable[..., Any]:
    """A stand-in for the generated method `name`: its first call compiles the real one into
    the class and runs it. A class never built, or never compared, costs no compile at all
    (most of a check's start-up time went into compiling methods nothing calls)."""

    def stand_in(self: Any, *args: Any, **kwargs: Any) -> Any:
        owner = next(c for c in type(self).__mro__ if c.__dict__.get(name) is stand_in)
        method = _generate(owner, name)
        setattr(owner, name, method)
        return method(self, *args, **kwargs)

    stand_in.__name__ = name
    return stand_in


def _generate(cls: type, name: str) -> Callable[..., Any]:
    """The method `name` of the record class `cls`, compiled from its fields. Its global
    names start with `_rec_`, so no field name (a parameter of `__init__`) hides them."""
    declared: tuple[Field, ...] = cls.__record_fields__  # type: ignore[attr-defined]
    scope: dict[str, Any] = {"_rec_missing": MISSING, "_rec_set": object.__setattr__}
    compared = [f.name for f in declared if f.compare]
    own = "(" + "".join(f"self.{n}," for n in compared) + ")"
    theirs = "(" + "".join(f"other.{n}," for n in compared) + ")"
    if name == "__init__":
        parameters, body = [], []
        for f in declared:
            if f.default is not MISSING:
                scope[f"_rec_default_{f.name}"] = f.default
                parameters.append(f"{f.name}=_rec_default_{f.name}")
                value = f.name
            elif f.default_factory is not MISSING:
                scope[f"_rec_factory_{f.name}"] = f.default_factory
                parameters.append(f"{f.name}=_rec_missing")
                value = f"_rec_factory_{f.name}() if {f.name} is _rec_missing else {f.name}"
            else:
                parameters.append(f.name)
                value = f.name
            if cls.__record_frozen__:  # type: ignore[attr-defined]
                body.append(f"    _rec_set(self, {f.name!r}, {value})")
            else:
                body.append(f"    self.{f.name} = {value}")
        if hasattr(cls, "__post_init__"):
            body.append("    self.__post_init__()")
        lines = [f"def __init__({', '.join(['self', *parameters])}):", *(body or ["    pass"])]
    elif name == "__eq__":
        lines = [
            "def __eq__(self, other):",
            "    if other.__class__ is self.__class__:",
            f"        return {own} == {theirs}",
            "    return NotImplemented",
        ]
    elif name == "__hash__":
        lines = ["def __hash__(self):", f"    return hash({own})"]
    else:
        lines = [
            f"def {name}(self, other):",
            "    if other.__class__ is self.__class__:",
            f"        return {own} {_ORDER[name]} {theirs}",
            "    return NotImplemented",
        ]
    namespace: dict[str, Any] = {}
    exec("\n".join(lines), scope, namespace)  # source made of field names only
    method = namespace[name]
    method.__qualname__ = f"{cls.__qualname__}.{name}"
    return method


def _repr(self: Any) -> str:
    shown = ", ".join(
        f"{f.name}={getattr(self, f.name)!r}" for f in type(self).__record_fields__ if f.repr
    )
    return f"{type(self).__qualname__}({shown})"


def _setattr(self: Any, name: str, value: Any) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _delattr(self: Any, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r}")
