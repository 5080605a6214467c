"""Crafted pickle streams that a plain unpickler runs: the host refuses to sign them, and the loader refuses them.

Each stream, loaded by plain ``pickle.loads``, creates a canary file (checked once, in a throwaway interpreter, by
`test_every_stream_is_live_for_a_plain_unpickler`). For each one: the host's scanner refuses it (so a dump that
carries it is never stored or signed), and a checkpoint holding it, signed directly with the key (a key-holding
attacker, or a checkpoint written before the scanner), loads without the variable in both isolation modes and
without the canary firing (inline loads run in the host process).
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from snapcell import Policy, Pool
from snapcell.checkpoint import dump_namespace, scan_body
from snapcell.checkpoint.scan import scan_pickle
from snapcell.interpreter._runner import checkpoint_rule
from snapcell.storage import MemoryStore

from .helpers import KEY, crafted_body, load_signed, refused_dump

RULE = checkpoint_rule(Policy())

# ------------------------------------------------------------------------------------------ a tiny assembler


def s(text: str) -> bytes:
    raw = text.encode()
    return (b"\x8c" + bytes([len(raw)]) if len(raw) < 256 else b"X" + len(raw).to_bytes(4, "little")) + raw


def glob(module: str, name: str) -> bytes:
    return s(module) + s(name) + b"\x93"


def call(func: bytes, *args: bytes) -> bytes:
    return func + b"(" + b"".join(args) + b"tR"


def getattr_(obj: bytes, name: str) -> bytes:
    return call(glob("builtins", "getattr"), obj, s(name))


def getitem(obj: bytes, key: str) -> bytes:
    return call(glob("operator", "getitem"), obj, s(key))


def stream(body: bytes) -> bytes:
    return b"\x80\x05" + body + b"."


def _open_file(builtins_dict: bytes, path: str) -> bytes:
    return call(getitem(builtins_dict, "open"), s(path), s("w"))


class _Call:
    """Pickles as ``func(*args)``; builds streams whose callables are cloudpickle objects (code by value)."""

    def __init__(self, func: Any, *args: Any) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.func, self.args

    def __call__(self, *args: Any) -> Any:  # the pickler wants reducers' callables to be callable
        raise NotImplementedError


def _code(path: str) -> Any:
    namespace: dict[str, Any] = {}
    exec(f"def f():\n    open({path!r}, 'w').close()\n", namespace)
    return namespace["f"].__code__


def _function_type_stream(path: str) -> bytes:
    # types.FunctionType(code, {}) from cloudpickle's _builtin_type: globals without __builtins__.
    function_type = _Call(cloudpickle.cloudpickle._builtin_type, "FunctionType")
    return cloudpickle.dumps(
        _Call(
            _Call(function_type, _code(path), {}),
        ),
        protocol=5,
    )


def _subclass_walk_stream(path: str) -> bytes:
    # Bytecode that needs no builtins: from () to object's subclasses, to os._wrap_close, to os.system.
    namespace: dict[str, Any] = {}
    source = (
        "def f():\n"
        "    for c in ().__class__.__base__.__subclasses__():\n"
        "        if c.__name__ == '_wrap_close':\n"
        f"            c.__init__.__globals__['system']('touch {path}')\n"
    )
    exec(source, namespace)
    made = _Call(cloudpickle.cloudpickle._make_function, namespace["f"].__code__, {}, "f", None, None)
    return cloudpickle.dumps(_Call(made), protocol=5)


def _make_function_stream(path: str) -> bytes:
    # cloudpickle's own _make_function with an empty globals dict; plain cloudpickle puts the real builtins in.
    made = _Call(cloudpickle.cloudpickle._make_function, _code(path), {}, "f", None, None)
    return cloudpickle.dumps(_Call(made), protocol=5)


def streams(path: str) -> dict[str, bytes]:
    """Every crafted stream, each creating the file ``path`` when plain-unpickled."""
    touch = s(f"touch {path}")
    json_builtins = getitem(getattr_(glob("json", "dumps"), "__globals__"), "__builtins__")
    attrgetter_globals = call(call(glob("operator", "attrgetter"), s("__globals__")), glob("json", "dumps"))
    computed_os = call(glob("builtins", "str"), s("os"))
    return {
        "typing_private_eval_type": stream(
            call(
                glob("typing", "_eval_type"),
                call(glob("typing", "ForwardRef"), s(f"open({path!r}, 'w').close()")),
                b"}",
                b"}",
            )
        ),
        "dataclasses_private_create_fn": stream(
            call(call(glob("dataclasses", "_create_fn"), s("f"), b"]", b"]" + s(f"open({path!r}, 'w')") + b"a"))
        ),
        "dill_dotted_os_system": stream(call(glob("dill._dill", "os.system"), touch)),
        "dill_eval_repr": stream(call(glob("dill._dill", "_eval_repr"), s(f"open({path!r}, 'w')"))),
        "getattr_globals_chain": stream(_open_file(json_builtins, path)),
        "getattr_private_module": stream(
            call(
                getattr_(getattr_(call(glob("cloudpickle.cloudpickle", "subimport"), s("random")), "_os"), "system"),
                touch,
            )
        ),
        "subimport_os_system": stream(
            call(getattr_(call(glob("cloudpickle.cloudpickle", "subimport"), s("os")), "system"), touch)
        ),
        "attrgetter_globals": stream(_open_file(getitem(attrgetter_globals, "__builtins__"), path)),
        "function_type_without_builtins": _function_type_stream(path),
        "make_function_without_builtins": _make_function_stream(path),
        "crafted_bytecode_subclass_walk": _subclass_walk_stream(path),
        "reduce_os_system": stream(call(glob("os", "system"), touch)),
        "reduce_subprocess": stream(call(glob("subprocess", "check_call"), b"](" + s("touch") + s(path) + b"e")),
        "builtins_eval": stream(call(glob("builtins", "eval"), s(f"open({path!r}, 'w').close()"))),
        "policy_hidden_io_open": stream(call(glob("io", "open"), s(path), s("w"))),
        "module_pivot_typing_sys": stream(
            call(getattr_(getitem(glob("typing", "sys.modules"), "os"), "system"), touch)
        ),
        "stack_global_computed_module": stream(computed_os + s("system") + b"\x93" + b"(" + touch + b"tR"),
        "stack_global_memo_get": stream(s("os") + b"\x940" + b"h\x00" + s("system") + b"\x93(" + touch + b"tR"),
        "patch_build_on_global": stream(
            glob("json", "JSONEncoder") + b"N}(" + s("item_separator") + s("CANARY") + b"u\x86b"
        ),
        "patch_build_on_lookup": stream(
            getattr_(call(glob("cloudpickle.cloudpickle", "subimport"), s("json")), "JSONEncoder")
            + b"N}("
            + s("item_separator")
            + s("CANARY")
            + b"u\x86b"
        ),
        "patch_class_setstate_on_global": stream(
            call(
                glob("cloudpickle.cloudpickle", "_class_setstate"),
                glob("json", "JSONEncoder"),
                b"}(" + s("item_separator") + s("CANARY") + b"u}\x86",
            )
        ),
        "stack_global_memo_overwritten": stream(
            s("json") + b"\x940" + computed_os + b"q\x000" + b"h\x00" + s("system") + b"\x93(" + touch + b"tR"
        ),
    }


# The host's scanner cannot refuse these without refusing every function a script pickles by value and calls
# from a reducer; they are made safe at load instead: restored functions get the session's builtins, and restored
# code may not use names scripts cannot (``__subclasses__``, ``__globals__``).
LOAD_TIME_ONLY = {"make_function_without_builtins", "crafted_bytecode_subclass_walk"}
# BUILD runs inside the C unpickler, where no hook can see its target: only the scanner refuses these, so a
# checkpoint signed directly with the key can still patch a library class's attributes in an inline load.
SCAN_TIME_ONLY = {"patch_build_on_global", "patch_build_on_lookup"}
CASES = sorted(streams("/nonexistent"))
# Why the scanner refuses each stream: the global it names and the check that stops it. Another check refusing the
# same stream would leave the intended one untested.
REFUSED_BY = {
    "attrgetter_globals": "operator.attrgetter (called with ('__globals__'): a private attribute)",
    "builtins_eval": "builtins.eval (a builtin that checkpoints may not use)",
    "dataclasses_private_create_fn": "dataclasses._create_fn (a name the policy hides)",
    "dill_dotted_os_system": "dill._dill.os.system (a serializer's or snapcell's internals",
    "dill_eval_repr": "dill._dill._eval_repr (a serializer's or snapcell's internals",
    "function_type_without_builtins": "_builtin_type (called with ('FunctionType'): a type it may not build)",
    "getattr_globals_chain": "builtins.getattr (called with (_Global(module='json', name='dumps'",
    "getattr_private_module": "builtins.getattr (called with (OPAQUE, '_os'): a private attribute)",
    "module_pivot_typing_sys": "typing.sys.modules (a path through another module)",
    "patch_build_on_global": "json.JSONEncoder (BUILD on a global (patching it in place))",
    "patch_build_on_lookup": "(BUILD on an object a lookup returned",
    "patch_class_setstate_on_global": "json.JSONEncoder (its state setter on a global (patching it in place))",
    "policy_hidden_io_open": "io.open (a name the policy hides)",
    "reduce_os_system": "os.system (a module the policy does not allow)",
    "reduce_subprocess": "subprocess.check_call (a module the policy does not allow)",
    "stack_global_computed_module": "OPAQUE.system (STACK_GLOBAL operands that are not constant strings)",
    "stack_global_memo_get": "os.system (a module the policy does not allow)",  # the memo followed to "os"
    "stack_global_memo_overwritten": "(a pickle stream that numbers its memo both ways (PUT and MEMOIZE)",
    "subimport_os_system": "cloudpickle.cloudpickle.subimport (called with ('os'): a module the policy does not allow)",
    "typing_private_eval_type": "typing._eval_type (a name the policy hides)",
}


# --------------------------------------------------------------------------------------------------- tests


def test_every_stream_is_live_for_a_plain_unpickler(tmp_path: Path) -> None:
    """Without protection each stream runs: plain pickle.loads in a throwaway interpreter creates every canary."""
    payloads = {name: (str(tmp_path / name), data.hex()) for name, data in _all_streams(tmp_path).items()}
    script = (
        "import json, pickle, sys\n"
        "for name, (path, data) in json.loads(sys.argv[1]).items():\n"
        "    try:\n"
        "        pickle.loads(bytes.fromhex(data))\n"
        "    except Exception:\n"
        "        pass\n"
        "    if json.JSONEncoder.item_separator == 'CANARY':  # a library class patched in place\n"
        "        open(path, 'w').close()\n"
        "        json.JSONEncoder.item_separator = ', '\n"
    )
    subprocess.run([sys.executable, "-c", script, json.dumps(payloads)], check=True, timeout=60, cwd=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == CASES


def _all_streams(tmp_path: Path) -> dict[str, bytes]:
    return {name: streams(str(tmp_path / name))[name] for name in CASES}


@pytest.mark.parametrize("case", [c for c in CASES if c not in LOAD_TIME_ONLY])
def test_the_scanner_refuses_every_stream(tmp_path: Path, case: str) -> None:
    refusal = scan_pickle(streams(str(tmp_path / case))[case], RULE)
    assert refusal is not None, case
    assert REFUSED_BY[case] in refusal.describe(), refusal.describe()


@pytest.mark.parametrize("case", [c for c in CASES if c not in LOAD_TIME_ONLY])
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


def test_an_untouched_namespace_passes_the_scanner() -> None:
    """Ordinary values (functions by value, classes, dataclasses, enums) pass: the rule refuses attacks, not data."""
    import dataclasses
    import enum

    @dataclasses.dataclass
    class Point:
        x: int = 0

    class Colour(enum.Enum):
        RED = 1

    values = [Point(1), Colour.RED, lambda a: a + 1, {"k": [1, 2.5, None, "s"]}, type(None), NotImplemented, ...]
    dumped = dump_namespace({"values": values, "n": list(range(1000))}, namespace={}, created_at=0.0)
    assert scan_body(dumped.body, rule=RULE) is None
    assert scan_pickle(pickle.dumps(list(range(1000)), protocol=5), RULE) is None
