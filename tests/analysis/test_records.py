"""`torchls.records`: the record classes every value type of torchls is declared with.

Why: `@record` replaced `@dataclass` to cut the start-up of each `torchls check` process
(no `dataclasses`/`inspect` import, methods compiled only when first called). These tests pin
the behaviour the code base relies on (defaults, factories, frozen, ordering, equality, hashing,
`replace`, pickling through the workers' pipes) and that a check's process really imports
neither module.
In: small classes declared here; a fresh interpreter for the import test. Out: assertions.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from torchls.records import FrozenInstanceError, field, fields, record, replace


@record(frozen=True, order=True)
class Point:
    """A frozen, ordered record."""

    row: int
    column: int = 0


@record
class Bag:
    """A mutable record with a factory and a field left out of repr and equality."""

    name: str
    items: list[int] = field(default_factory=list)
    note: object = field(default=None, repr=False, compare=False)


def test_defaults_and_factories_give_each_instance_its_own_value() -> None:
    first, second = Bag("a"), Bag("a")
    first.items.append(1)
    assert second.items == []
    assert Point(3).column == 0
    assert Bag("a", [1, 2]).items == [1, 2]


def test_repr_and_equality_follow_the_field_flags() -> None:
    assert repr(Point(1, 2)) == "Point(row=1, column=2)"
    assert repr(Bag("x", note="hidden")) == "Bag(name='x', items=[])"
    assert Bag("x", note=1) == Bag("x", note=2)
    assert Bag("x") != Bag("y")
    assert Point(1, 2) != (1, 2)  # a record equals only records of its own class


def test_frozen_records_refuse_assignment_and_hash_by_value() -> None:
    point = Point(1, 2)
    with pytest.raises(FrozenInstanceError):
        point.row = 5  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del point.row  # type: ignore[misc]
    assert hash(point) == hash(Point(1, 2))
    assert {point, Point(1, 2)} == {point}


def test_mutable_records_are_not_hashable() -> None:
    with pytest.raises(TypeError):
        hash(Bag("x"))


def test_order_compares_fields_in_declaration_order() -> None:
    assert sorted([Point(2, 0), Point(1, 5), Point(1, 2)]) == [
        Point(1, 2),
        Point(1, 5),
        Point(2, 0),
    ]
    assert Point(1, 2) <= Point(1, 2) < Point(1, 3)
    with pytest.raises(TypeError):
        _ = Point(1, 2) < (1, 3)  # type: ignore[operator]


def test_replace_copies_with_changes_and_refuses_unknown_fields() -> None:
    point = Point(1, 2)
    assert replace(point, column=7) == Point(1, 7)
    assert point == Point(1, 2)
    with pytest.raises(TypeError):
        replace(point, depth=3)
    assert [f.name for f in fields(Bag)] == ["name", "items", "note"]
    with pytest.raises(TypeError):
        fields(object())


def test_declaration_mistakes_are_refused_as_dataclasses_refuses_them() -> None:
    with pytest.raises(ValueError, match="default_factory"):

        @record
        class Shared:
            """A list default would be shared by every instance."""

            values: list[int] = []

    with pytest.raises(TypeError, match="without a default"):

        @record
        class Misordered:
            """A required field after one with a default."""

            first: int = 0
            second: int  # type: ignore[misc]


def test_methods_the_class_writes_itself_win() -> None:
    @record(frozen=True)
    class Named:
        """Writes its own repr."""

        name: str

        def __repr__(self) -> str:
            return f"<{self.name}>"

    assert repr(Named("n")) == "<n>"
    assert hash(Named("n")) == hash(Named("n"))


def test_post_init_runs_after_the_fields_are_set() -> None:
    @record
    class Derived:
        """Computes a field from the others, as the seccomp filter builds its buffer."""

        text: str
        length: int = 0

        def __post_init__(self) -> None:
            self.length = len(self.text)

    assert Derived("abcd").length == 4


def test_a_method_is_compiled_on_first_use_only() -> None:
    @record(frozen=True)
    class Late:
        """Never compared before the end of the test."""

        value: int

    assert Late.__dict__["__init__"].__qualname__.endswith("stand_in")
    late = Late(1)
    assert Late.__dict__["__init__"].__qualname__.endswith("Late.__init__")
    assert Late.__dict__["__eq__"].__qualname__.endswith("stand_in")
    assert late == Late(1)
    assert Late.__dict__["__eq__"].__qualname__.endswith("Late.__eq__")


def test_records_survive_pickling() -> None:
    # Forked check workers send their outcomes back pickled.
    bag = Bag("x", [1])
    assert pickle.loads(pickle.dumps(Point(1, 2))) == Point(1, 2)
    assert pickle.loads(pickle.dumps(bag)) == bag


def test_a_check_imports_neither_dataclasses_nor_inspect(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import torch\nloss = torch.nn.CrossEntropyLoss()\n", encoding="utf-8")
    probe = (
        "import sys\n"
        "from torchls.cli import main\n"
        f"main(['check', '--no-cache', {str(script)!r}])\n"
        "print(sorted(m for m in ('dataclasses', 'inspect') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert done.stdout.strip().splitlines()[-1] == "[]"
