"""The ``dataclasses.replace``/``asdict``/``astuple`` stand-ins against field tables a checkpoint can build.

They read ``getattr(obj, name)`` for every field, so the name they check must be the name they read: a checkpoint's
BUILD can give an instance its own ``__dataclass_fields__`` (any key goes into an instance's ``__dict__``), and a
``dataclasses.Field`` is built from public names with any ``name`` under any key of the class's table.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from snapcell import PolicyError
from snapcell.policy._standins import asdict, astuple, replace


@dataclasses.dataclass
class Point:
    x: int = 1


def _field(name: str) -> dataclasses.Field[Any]:
    field: dataclasses.Field[Any] = dataclasses.field()
    field.name = name
    field._field_type = vars(dataclasses)["_FIELD"]  # type: ignore[attr-defined]
    return field


def test_an_instance_s_own_field_table_is_not_read() -> None:
    point = Point()
    point.__dict__["__dataclass_fields__"] = {**Point.__dataclass_fields__, "r": _field("__reduce_ex__")}
    assert asdict(point) == {"x": 1}
    assert astuple(point) == (1,)
    assert replace(point, x=2) == Point(2)


class _Keeps:
    """A class with a dataclass table whose key is ordinary but whose field is named ``__reduce_ex__``."""

    __dataclass_fields__ = {"x": _field("__reduce_ex__")}

    def __init__(self, **fields: Any) -> None:
        self.fields = fields


@pytest.mark.parametrize("function", [asdict, astuple, replace])
def test_a_field_named_otherwise_than_its_key_is_refused(function: Any) -> None:
    with pytest.raises(PolicyError, match="special field names"):
        function(_Keeps())


def test_ordinary_dataclasses_still_work() -> None:
    @dataclasses.dataclass
    class Line:
        a: Point
        b: Point
        tag: dataclasses.InitVar[str] = "t"
        _note: str = dataclasses.field(default="n", init=False)

        def __post_init__(self, tag: str) -> None:
            self._note = tag

    line = Line(Point(1), Point(2), "z")
    assert asdict(line) == {"a": {"x": 1}, "b": {"x": 2}, "_note": "z"}
    assert astuple(line) == ((1,), (2,), "z")
    moved = replace(line, b=Point(3), tag="q")
    assert (moved.b, moved._note) == (Point(3), "q")
    with pytest.raises(ValueError, match="init=False"):
        replace(line, _note="x")
    with pytest.raises(ValueError, match="InitVar 'tag'"):

        @dataclasses.dataclass
        class Needs:
            tag: dataclasses.InitVar[str]

            def __post_init__(self, tag: str) -> None:
                pass

        replace(Needs("a"))
