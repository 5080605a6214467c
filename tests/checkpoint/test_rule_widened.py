"""Crafted streams against each entry the checkpoint rule gained for ordinary values.

The rule now admits ``subimport('copy')`` and ``copy.copy``/``deepcopy``, pure builtins such as ``pow``, a class's
text dunders (``enum.Enum.__format__``, ``getattr(str, '__repr__')``), ``_operator.getitem`` as ``operator.getitem``,
and ``dataclasses.replace`` as a guarded stand-in; compiled patterns now pickle as ``re.compile(pattern, flags)``.
Each stream below uses one of those to reach something denied. Loaded by plain ``pickle.loads`` each creates a
canary file (`test_every_stream_is_live_for_a_plain_unpickler`); the host's scanner refuses it, naming the global
that gives it away, and a checkpoint holding it, signed directly with the key, loads without the variable in both
isolation modes and without the canary firing.
"""

from __future__ import annotations

import abc
import copy
import copyreg
import dataclasses
import json
import operator
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import cloudpickle
import pytest

from snapcell import Policy, PolicyError, Pool
from snapcell.checkpoint.scan import scan_pickle
from snapcell.interpreter._runner import checkpoint_rule
from snapcell.policy._standins import asdict as guarded_asdict
from snapcell.policy._standins import astuple as guarded_astuple
from snapcell.policy._standins import replace as guarded_replace
from snapcell.storage import MemoryStore

from .helpers import KEY, crafted_body, load_signed, refused_dump
from .test_unpickle_hostile import _Call, call, getattr_, getitem, glob, s, stream

RULE = checkpoint_rule(Policy())
SUBIMPORT = ("cloudpickle.cloudpickle", "subimport")


def tup(*items: bytes) -> bytes:
    return b"(" + b"".join(items) + b"t"


def _open_file(builtins_dict: bytes, path: str) -> bytes:
    return call(getitem(builtins_dict, "open"), s(path), s("w"))


def _patch_encoder(reader: bytes, *args: bytes) -> bytes:
    """``reader(*args)`` returns json.JSONEncoder; BUILD then sets its ``item_separator`` (a library class, patched)."""
    return call(reader, *args) + b"N}(" + s("item_separator") + s("CANARY") + b"u\x86b"


def _reconstruct_patch(reconstruct: bytes) -> bytes:
    # copy._reconstruct(None, None, getitem, ((JSONEncoder,), 0), (None, {'item_separator': 'CANARY'})): the
    # generic reconstructor calls setattr on what getitem returned, the library class, without any BUILD opcode.
    args = tup(tup(glob("json", "JSONEncoder")), b"K\x00")
    state = tup(b"N", b"}" + s("item_separator") + s("CANARY") + b"s")
    return call(reconstruct, b"N", b"N", glob("operator", "getitem"), args, state)


def _dispatch_table_patch(table: bytes) -> bytes:
    # copy.dispatch_table[JSONEncoder] = str: every later copy or pickle of an encoder, anywhere in the process, runs
    # the checkpoint's reducer (here a harmless one, so that nothing else in the stream is refused).
    return call(glob("operator", "setitem"), table, glob("json", "JSONEncoder"), glob("builtins", "str"))


def _metaclass_replace_stream(path: str) -> bytes:
    # A class whose metaclass is a dataclass with the field ``__getattribute__``: dataclasses.replace(C) reads
    # getattr(C, '__getattribute__') -- object.__getattribute__, an attribute reader no check sees -- and hands it
    # to the metaclass; from there to json.dumps.__globals__['__builtins__']['open'].
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(
        "import dataclasses\n"
        "def new(mcls, *args, **fields):\n"
        "    return fields if fields else type.__new__(mcls, *args)\n"
        "M = dataclasses.make_dataclass('M', [('__getattribute__', object)], bases=(type,), init=False, eq=False,\n"
        "                               namespace={'__new__': new})\n"
        "class C(metaclass=M):\n"
        "    pass\n",
        namespace,
    )
    fields = _Call(dataclasses.replace, namespace["C"])
    reader = _Call(operator.getitem, fields, "__getattribute__")
    globals_ = _Call(reader, json.dumps, "__globals__")
    builtins_ = _Call(operator.getitem, _Call(operator.getitem, globals_, "__builtins__"), "open")
    return cloudpickle.dumps(_Call(builtins_, path, "w"), protocol=5)


def _metaclass_dataclass_stream(function: str, path: str) -> bytes:
    # The same class built from public names only: abc.ABCMeta('M', (ABCMeta,), {'__dataclass_fields__': {...}}), a
    # dataclasses.Field named __getattribute__, then C = M('C', (), {}). asdict(C) / astuple(C) read the field of C.
    field_type = call(glob("cloudpickle.cloudpickle", "_get_dataclass_field_type_sentinel"), s("_FIELD"))
    slots = b"}" + s("name") + s("__getattribute__") + b"s" + s("_field_type") + field_type + b"s"
    field = call(glob("copyreg", "__newobj__"), glob("dataclasses", "Field")) + tup(b"N", slots) + b"b"
    namespace = b"}" + s("__dataclass_fields__") + b"}" + s("__getattribute__") + field + b"s" + b"s"
    meta = call(glob("abc", "ABCMeta"), s("M"), tup(glob("abc", "ABCMeta")), namespace)
    leaked = call(glob("dataclasses", function), call(meta, s("C"), b")", b"}"))
    reader = (
        getitem(leaked, "__getattribute__")
        if function == "asdict"
        else call(glob("_operator", "getitem"), leaked, b"K\x00")
    )
    return stream(_open_file(getitem(call(reader, glob("json", "dumps"), s("__globals__")), "__builtins__"), path))


def streams(path: str) -> dict[str, bytes]:
    """Every crafted stream, each creating the file ``path`` (or patching json.JSONEncoder) when plain-unpickled."""
    touch = s(f"touch {path}")
    copy_module = call(glob(*SUBIMPORT), s("copy"))
    partial = glob("functools", "partial")
    return {
        # functools.partial(pow, 2) admits pow; partial itself must not carry a denied or name-taking callable.
        "partial_of_eval": stream(call(call(partial, glob("builtins", "eval"), s(f"open({path!r}, 'w').close()")))),
        "partial_of_import": stream(
            call(getattr_(call(call(partial, glob("builtins", "__import__"), s("os"))), "system"), touch)
        ),
        "partial_of_getattr": stream(
            _open_file(
                getitem(
                    call(call(partial, glob("builtins", "getattr"), glob("json", "dumps")), s("__globals__")),
                    "__builtins__",
                ),
                path,
            )
        ),
        # pow's neighbours min/max/sum, and copy.copy, return what they are given: a library class gets no BUILD.
        "min_of_library_class_build": stream(_patch_encoder(glob("builtins", "min"), tup(glob("json", "JSONEncoder")))),
        "copy_of_library_class_build": stream(_patch_encoder(glob("copy", "copy"), glob("json", "JSONEncoder"))),
        # subimport('copy') admits the module and copy.copy/deepcopy; not its reconstructor or copyreg's table.
        "copy_reconstruct_global": stream(_reconstruct_patch(glob("copy", "_reconstruct"))),
        "copy_reconstruct_via_getattr": stream(_reconstruct_patch(getattr_(copy_module, "_reconstruct"))),
        "copy_dispatch_table_global": stream(_dispatch_table_patch(glob("copy", "dispatch_table"))),
        "copy_dispatch_table_via_getattr": stream(_dispatch_table_patch(getattr_(copy_module, "dispatch_table"))),
        # A class's text dunders by name; never their globals, another dunder, or a generic attribute reader.
        "enum_format_globals": stream(
            _open_file(getitem(getattr_(glob("enum", "Enum.__format__"), "__globals__"), "__builtins__"), path)
        ),
        "class_dunder_init_globals": stream(
            _open_file(getitem(getattr_(glob("json", "JSONEncoder.__init__"), "__globals__"), "__builtins__"), path)
        ),
        "getattr_object_getattribute": stream(
            _open_file(
                getitem(
                    call(
                        getattr_(glob("builtins", "object"), "__getattribute__"),
                        glob("json", "dumps"),
                        s("__globals__"),
                    ),
                    "__builtins__",
                ),
                path,
            )
        ),
        # _operator.getitem stands for operator.getitem: still a lookup (no BUILD on its result), and only that name.
        "operator_alias_build_on_result": stream(
            _patch_encoder(glob("_operator", "getitem"), tup(glob("json", "JSONEncoder")), b"K\x00")
        ),
        "operator_alias_other_name": stream(
            _open_file(
                getitem(
                    call(call(glob("_operator", "attrgetter"), s("__globals__")), glob("json", "dumps")), "__builtins__"
                ),
                path,
            )
        ),
        # typing.Optional[...] pickles through _operator.getitem; a string inside one must never be evaluated.
        "typing_optional_forward_ref_eval": stream(
            call(
                glob("typing", "_eval_type"),
                call(glob("_operator", "getitem"), glob("typing", "Optional"), s(f"open({path!r}, 'w').close()")),
                b"}",
                b"}",
            )
        ),
        # dataclasses.replace reads every field of type(obj) by name.
        "dataclass_metaclass_replace": _metaclass_replace_stream(path),
        # Found on the way (not a widening): asdict and astuple read fields the same way, and the host's scan passes
        # these streams, so an inline load of a signed one ran open() with the real builtins.
        "dataclass_metaclass_asdict": _metaclass_dataclass_stream("asdict", path),
        "dataclass_metaclass_astuple": _metaclass_dataclass_stream("astuple", path),
    }


# What the scanner's refusal names: the global (or helper argument) that gives each stream away.
REFUSED_AT = {
    "partial_of_eval": "builtins.eval",
    "partial_of_import": "builtins.__import__",
    "partial_of_getattr": "passed as a value",
    "copy_reconstruct_global": "copy._reconstruct",
    "copy_reconstruct_via_getattr": "'_reconstruct'",
    "copy_dispatch_table_global": "copy.dispatch_table",
    "copy_dispatch_table_via_getattr": "'dispatch_table'",
    "enum_format_globals": "'__globals__'",
    "class_dunder_init_globals": "JSONEncoder.__init__",
    "getattr_object_getattribute": "'__getattribute__'",
    "operator_alias_build_on_result": "BUILD on an object a lookup returned",
    "min_of_library_class_build": "BUILD on an object a lookup returned",
    "copy_of_library_class_build": "BUILD on an object a lookup returned",
    "operator_alias_other_name": "_operator.attrgetter",
    "typing_optional_forward_ref_eval": "typing._eval_type",
}
# Only the loader can refuse these: the metaclass and its fields arrive as data, as every script class's do. The
# loader resolves ``dataclasses.asdict``/``astuple`` to the policy's stand-ins, and does not look ``replace`` up by
# name (a script's ``replace`` is the stand-in, pickled as itself); each takes dataclass instances with ordinary field
# names only.
LOAD_TIME_ONLY = {"dataclass_metaclass_replace", "dataclass_metaclass_asdict", "dataclass_metaclass_astuple"}
# BUILD runs inside the C unpickler, where no hook sees its target: only the scanner refuses these.
SCAN_TIME_ONLY = {"operator_alias_build_on_result", "min_of_library_class_build", "copy_of_library_class_build"}
CASES = sorted(streams("/nonexistent"))


def test_every_stream_is_live_for_a_plain_unpickler(tmp_path: Path) -> None:
    """Without protection each stream runs: plain pickle.loads in a throwaway interpreter creates every canary."""
    payloads = {name: (str(tmp_path / name), streams(str(tmp_path / name))[name].hex()) for name in CASES}
    script = (
        "import copyreg, json, pickle, sys\n"
        "for name, (path, data) in json.loads(sys.argv[1]).items():\n"
        "    try:\n"
        "        pickle.loads(bytes.fromhex(data))\n"
        "    except Exception:\n"
        "        pass\n"
        "    if copyreg.dispatch_table.pop(json.JSONEncoder, None) is not None:  # a reducer for every later dump\n"
        "        open(path, 'w').close()\n"
        "    if json.JSONEncoder.item_separator != ', ':  # a library class patched in place\n"
        "        open(path, 'w').close()\n"
        "        json.JSONEncoder.item_separator = ', '\n"
    )
    subprocess.run([sys.executable, "-c", script, json.dumps(payloads)], check=True, timeout=60, cwd=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == CASES


def test_every_case_says_where_it_is_refused() -> None:
    assert sorted([*REFUSED_AT, *LOAD_TIME_ONLY]) == CASES


@pytest.mark.parametrize("case", sorted(REFUSED_AT))
def test_the_scanner_refuses_every_stream(tmp_path: Path, case: str) -> None:
    refusal = scan_pickle(streams(str(tmp_path / case))[case], RULE)
    assert refusal is not None, case
    assert REFUSED_AT[case] in f"{refusal.module}.{refusal.name} ({refusal.reason})", refusal


@pytest.mark.parametrize("case", sorted(REFUSED_AT))
def test_the_host_never_signs_a_dump_holding_one(tmp_path: Path, case: str) -> None:
    """A worker (here: a backend returning crafted bytes) sends the stream; the dump fails and nothing is stored."""
    refusal, stored = refused_dump(crafted_body(streams(str(tmp_path / case))[case]))
    assert refusal.variable_names == ["x"]
    assert stored == []


@pytest.fixture(scope="module", params=["inline", "process"])
def loading_pool(request: pytest.FixtureRequest) -> Any:
    store = MemoryStore()
    with Pool(store, signing_keys=[KEY], isolation=request.param) as pool:
        yield pool, store


@pytest.mark.parametrize("case", [c for c in CASES if c not in SCAN_TIME_ONLY])
def test_the_loader_refuses_every_stream_even_when_signed(loading_pool: Any, tmp_path: Path, case: str) -> None:
    pool, store = loading_pool
    canary = tmp_path / case
    result = load_signed(pool, store, crafted_body(streams(str(canary))[case]))
    assert result.value is False
    assert any("x" in note for note in result.notes), result.notes
    assert not canary.exists()
    assert json.JSONEncoder.item_separator == ", "  # the host's library classes are untouched
    assert json.JSONEncoder not in copyreg.dispatch_table  # and so is the host's table of reducers


def test_the_asdict_and_astuple_stand_ins_refuse_what_the_real_ones_leak() -> None:
    meta = dataclasses.make_dataclass("M", [("__getattribute__", object)], bases=(abc.ABCMeta,), init=False, eq=False)
    cls = meta("C", (), {})
    assert dataclasses.asdict(cls)["__getattribute__"] is object.__getattribute__
    assert dataclasses.astuple(cls)[0] is object.__getattribute__
    holder = dataclasses.make_dataclass("H", [("inner", object)])(cls)  # the class one level down
    for function in (guarded_asdict, guarded_astuple):
        for value in (cls, holder):
            with pytest.raises(PolicyError):
                function(value)


def test_the_asdict_and_astuple_stand_ins_give_what_the_real_ones_give() -> None:
    class Pair(NamedTuple):
        a: Any
        b: int

    inner = dataclasses.make_dataclass("Inner", [("v", list)])
    outer = dataclasses.make_dataclass("Outer", [("i", object), ("t", tuple), ("d", dict), ("n", Pair)])
    value = outer(inner([1, [2]]), (inner([3]),), {"k": inner([4])}, Pair(inner([5]), 6))
    assert guarded_asdict(value) == dataclasses.asdict(value)
    assert guarded_astuple(value) == dataclasses.astuple(value)
    reverse = lambda items: dict(reversed(items))  # noqa: E731
    assert guarded_asdict(value, dict_factory=reverse) == dataclasses.asdict(value, dict_factory=reverse)
    assert guarded_asdict(value)["n"] == Pair({"v": [5]}, 6)
    with pytest.raises(TypeError):
        guarded_asdict([1])


def test_the_replace_stand_in_refuses_what_dataclasses_replace_leaks() -> None:
    """The real replace hands out object.__getattribute__ for a metaclass dataclass; the stand-in refuses it."""
    namespace: dict[str, Any] = {}

    def new(mcls: type, *args: Any, **fields: Any) -> Any:
        return fields if fields else type.__new__(mcls, *args)

    meta = dataclasses.make_dataclass(
        "M", [("__getattribute__", object)], bases=(type,), init=False, eq=False, namespace={"__new__": new}
    )
    cls = meta("C", (), namespace)
    assert dataclasses.replace(cls)["__getattribute__"] is object.__getattribute__
    with pytest.raises(PolicyError):
        guarded_replace(cls)
    with pytest.raises(TypeError):
        guarded_replace([1])
    dunder_field = dataclasses.make_dataclass("D", [("__getattribute__", object)], init=False)()
    with pytest.raises(PolicyError):
        guarded_replace(dunder_field)
    point = dataclasses.make_dataclass("P", [("x", int), ("y", int)])(1, 2)
    assert guarded_replace(point, y=5) == type(point)(1, 5)


def test_copy_dispatch_table_is_hidden_from_scripts_and_restored_code() -> None:
    """Code restored from a checkpoint gets the copy module as the policy's view: no dispatch_table to fill in."""
    view = Policy().view("copy")
    assert not hasattr(view, "dispatch_table")
    assert view.deepcopy is copy.deepcopy
    with Pool("memory://", isolation="inline") as pool, pool.checkout() as session:
        result = session.run("import copy\ncopy.dispatch_table")
    assert result.error is not None and result.error.exc_type in ("AttributeError", "PolicyError"), result.error
