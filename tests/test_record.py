"""`snapcell._support._record.dataclass` behaves as `dataclasses.dataclass` for what snapcell's classes use.

It compiles nothing.

Each scenario builds the same class body twice, with the real decorator and with the record one, and compares.
"""

from __future__ import annotations

import builtins
import copy
import dataclasses
import pickle
import subprocess
import sys
from typing import Any, ClassVar

import pytest

from snapcell._support import _record
from snapcell.interpreter._result import Artifact, RunResult
from snapcell.limits import Limits
from snapcell.policy._policy import Policy
from snapcell.sandbox._sandbox import SandboxReport
from snapcell.wire._budget import Budget
from snapcell.wire._values import ScriptValue
from snapcell.workspace._local import Snapshot
from snapcell.workspace._paths import FileInfo


def _both(body: Any, **options: Any) -> tuple[Any, Any]:
    """The class ``body()`` makes, as a real dataclass and as a record."""
    return dataclasses.dataclass(**options)(body()), _record.dataclass(**options)(body())


def _frozen_kw() -> type:
    class Frozen:
        """A docstring."""

        limit: int | None = 3
        names: frozenset[str] = dataclasses.field(default_factory=frozenset)
        shared: ClassVar[int] = 7
        seen: tuple[str, ...] = ()

        def __post_init__(self) -> None:
            object.__setattr__(self, "names", frozenset(self.names))

    return Frozen


def _positional() -> type:
    class Positional:
        code: str
        value: int
        items: list[int] = dataclasses.field(default_factory=list)

    return Positional


def _as_record_field(cls: type) -> type:
    # The record decorator reads its own `field` markers: swap the dataclasses ones for them.
    for name, value in list(vars(cls).items()):
        if isinstance(value, dataclasses.Field):
            setattr(cls, name, _record.field(default_factory=value.default_factory))
    return cls


def _records(body: Any, **options: Any) -> tuple[Any, Any]:
    return dataclasses.dataclass(**options)(body()), _record.dataclass(**options)(_as_record_field(body()))


def test_a_frozen_keyword_only_record_matches_the_dataclass() -> None:
    real, made = _records(_frozen_kw, frozen=True, slots=True, kw_only=True)
    for cls in (real, made):
        a, b = cls(limit=None, names=["x"]), cls(limit=None, names={"x"})
        assert a.names == frozenset({"x"}) and a == b  # __post_init__ ran
        assert cls().names == frozenset() and cls().names is not None
    assert repr(made(limit=1)).replace(made.__qualname__, "Q") == repr(real(limit=1)).replace(real.__qualname__, "Q")
    assert made(limit=1) == made(limit=1) and made(limit=1) != made(limit=2)
    assert hash(made(limit=1)) == hash(made(limit=1)) == hash(real(limit=1))
    assert made(limit=1) != real(limit=1)  # another class: not equal, as between two dataclasses
    assert made.__match_args__ == real.__match_args__ == ()
    assert made.__slots__ == real.__slots__ == ("limit", "names", "seen")
    assert made.shared == 7 and "shared" not in made.__slots__
    with pytest.raises(TypeError):
        made(1)  # keyword-only
    with pytest.raises(TypeError, match="unexpected keyword argument 'nope'"):
        made(nope=1)
    obj = made(limit=1)
    for attack in (lambda: setattr(obj, "limit", 2), lambda: delattr(obj, "limit"), lambda: setattr(obj, "new", 1)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            attack()
    assert obj.limit == 1


def test_a_positional_record_matches_the_dataclass() -> None:
    real, made = _records(_positional, slots=True)
    for cls in (real, made):
        one = cls("c", 1)
        assert one == cls(code="c", value=1) and one.items == [] and one.items is not cls("c", 1).items
        one.value = 2  # not frozen
        assert one.value == 2
        with pytest.raises(TypeError):
            hash(one)  # eq without frozen: unhashable, as a dataclass
        with pytest.raises(TypeError):
            cls("c")  # missing value
        with pytest.raises(TypeError):
            cls("c", 1, [], 4)  # too many
        with pytest.raises(TypeError):
            cls("c", code="d", value=1)  # twice
    assert made.__match_args__ == real.__match_args__ == ("code", "value", "items")
    assert repr(made("c", 1)).replace(made.__qualname__, "Q") == repr(real("c", 1)).replace(real.__qualname__, "Q")


def test_records_refuse_what_dataclasses_refuse() -> None:
    class Mutable:
        items: list[int] = []

    with pytest.raises(ValueError, match="mutable default"):
        _record.dataclass(Mutable)

    class Order:
        a: int = 1
        b: int

    with pytest.raises(TypeError, match="non-default argument 'b'"):
        _record.dataclass(Order)
    with pytest.raises(ValueError):
        _record.field(default=1, default_factory=int)


def test_the_dataclasses_functions_work_on_records() -> None:
    limits = Limits(wall_time_s=5.0)
    assert dataclasses.is_dataclass(Limits) and dataclasses.is_dataclass(limits)
    assert [f.name for f in dataclasses.fields(Limits)] == list(Limits.__annotations__)
    assert dataclasses.asdict(limits)["wall_time_s"] == 5.0
    changed = dataclasses.replace(limits, grace_s=1.0)
    assert (changed.wall_time_s, changed.grace_s, type(changed)) == (5.0, 1.0, Limits)
    policy = Policy(extra_modules=frozenset({"numpy"}))
    assert {f.name: f.default_factory for f in dataclasses.fields(policy)}["extra_modules"] is frozenset
    assert dataclasses.replace(policy) == policy
    result = RunResult(value=1, files=(Artifact(path="out/a", size_bytes=1, media_type="text/plain"),))
    assert dataclasses.replace(result, restarted=True).restarted and result.status == "ok"
    assert dataclasses.asdict(result)["files"][0]["path"] == "out/a"
    snap = Snapshot()
    snap.skipped.append("x")
    assert Snapshot().skipped == [] and dataclasses.asdict(snap)["skipped"] == ["x"]


@pytest.mark.parametrize(
    "value",
    [
        Limits(memory_bytes=None),
        Policy.unrestricted(),
        RunResult(value=[1], notes=("n",)),
        Budget(message_bytes=1, items=2),
        ScriptValue("T", "t"),
        FileInfo(path="a", size_bytes=1, media_type="text/plain"),
        SandboxReport({"seccomp": "active"}),
    ],
)
def test_shipped_records_pickle_and_copy(value: Any) -> None:
    for copied in (pickle.loads(pickle.dumps(value)), copy.copy(value), copy.deepcopy(value)):
        assert copied == value and type(copied) is type(value)
        with pytest.raises(dataclasses.FrozenInstanceError):
            object.__getattribute__(copied, "__setattr__")("x", 1)


def test_shipped_records_repr_as_dataclasses_do() -> None:
    assert repr(ScriptValue("T", "shown")) == "shown"  # its own __repr__ is kept
    assert repr(Budget(message_bytes=1, items=2)) == "Budget(message_bytes=1, items=2, blob_bytes=0)"
    assert repr(Limits()).startswith("Limits(wall_time_s=30.0, grace_s=2.0, cpu_time_s=600.0, ")
    loop: list[Any] = []
    loop.append(RunResult(value=loop))
    assert "value=[...]" in repr(loop[0])  # a value holding its result: no endless recursion


def test_making_the_shipped_records_compiles_nothing() -> None:
    # What a zygote pays for at start-up: `dataclasses.dataclass` compiles ~6 functions a class.
    probe = (
        "import builtins, sys\n"
        "calls = []\n"
        "for name in ('exec', 'eval', 'compile'):\n"
        "    real = getattr(builtins, name)\n"
        "    def spy(*a, _real=real, _name=name, **k):\n"
        "        if isinstance(a[0], str):\n"
        "            calls.append(sys._getframe(1).f_code.co_filename)\n"
        "        return _real(*a, **k)\n"
        "    setattr(builtins, name, spy)\n"
        "from snapcell.worker import _zygote\n"
        "_zygote.import_worker()\n"
        "import snapcell.sandbox._sandbox\n"
        "print(sorted(set(calls)), 'dataclasses' in sys.modules, 'inspect' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, check=True, env={})
    callers, *imported = out.stdout.rsplit(maxsplit=2)
    assert imported == ["False", "False"]
    # Only the standard library's namedtuples (functools, shutil) compile source text now.
    assert all(caller.endswith("collections/__init__.py'") for caller in callers.strip("[]").split(", ")), callers
    assert builtins.exec is exec  # the probe patched only its own interpreter


@pytest.mark.parametrize("cls", [Limits, Policy, RunResult, Budget])
def test_shipped_records_repr_and_defaults_match_a_real_dataclass(cls: Any) -> None:
    # The same fields and defaults through dataclasses.dataclass itself: the defaults an instance gets, and its repr.
    fields = dataclasses.fields(cls)
    namespace: dict[str, Any] = {"__annotations__": {f.name: f.type for f in fields}}
    namespace.update(
        {f.name: dataclasses.field(default=f.default) for f in fields if f.default is not dataclasses.MISSING}
    )
    namespace.update({f.name: f for f in fields if f.default_factory is not dataclasses.MISSING})
    real = dataclasses.dataclass(frozen=True, kw_only=True)(type(cls.__name__, (), namespace))
    required = {"message_bytes": 1, "items": 2} if cls is Budget else {}
    made, expected = cls(**required), real(**required)
    assert repr(made) == repr(expected).replace("status=None", "status='ok'")  # RunResult's __post_init__
    assert [getattr(made, f.name) for f in fields if f.name != "status"] == [
        getattr(expected, f.name) for f in fields if f.name != "status"
    ]


def test_a_well_formed_call_builds_no_table_of_its_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    """RunResult (by keyword) and HostCall (by position) are made on every run and host call: one pass, no dict."""
    from snapcell.interpreter._host import HostCall

    tables: list[tuple[Any, ...]] = []
    real = _record._arguments
    monkeypatch.setattr(_record, "_arguments", lambda *args: tables.append(args) or real(*args))
    result = RunResult(value=2, stdout="x", notes=("n",))
    call = HostCall("f", 0.5)
    assert (result.value, result.stdout, result.notes, result.status, result.files) == (2, "x", ("n",), "ok", ())
    assert (call.name, call.duration_s, call.error) == ("f", 0.5, None)
    assert tables == []
    with pytest.raises(TypeError, match="unexpected keyword argument 'nope'"):
        RunResult(value=1, nope=2)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="missing 1 required argument"):
        HostCall("f")  # type: ignore[call-arg]
