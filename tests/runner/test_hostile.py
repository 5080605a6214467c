"""Hostile scripts: every one is blocked or contained, and each asserts what was stopped.

Each exploit ends with ``pwned = ...`` and ``print("CANARY")``: a case passes only when the run failed
with the expected error AND the namespace has no ``pwned`` AND the canary was never printed.
"""

from __future__ import annotations

import time

import pytest

from snapcell import Limits
from snapcell.errors import PolicyError, ScriptError, TimeLimitExceeded

POLICY = PolicyError  # blocked by the AST check or a guard
SUCCESS = "\npwned = True\nprint('CANARY')\n"

# name: (script, expected error: an exception class, or the exc_type name of a script error)
HOSTILE: dict[str, tuple[str, type[ScriptError] | str]] = {
    # --- import bypasses
    "import_os": ("import os\nos.system('echo CANARY')", POLICY),
    "import_subprocess": ("import subprocess", POLICY),
    "from_os_import_path": ("from os import path", POLICY),
    "dunder_import_call": ("__import__('os')", POLICY),
    "importlib": ("import importlib\nimportlib.import_module('os')", POLICY),
    "sys_modules": ("import sys\nsys.modules['os']", POLICY),
    "builtins_module": ("import builtins\nbuiltins.open('/etc/passwd')", POLICY),
    "asyncio_subprocess_import": ("import asyncio.subprocess", POLICY),
    "asyncio_subprocess_from": ("from asyncio import subprocess", POLICY),
    "io_open_from": ("from io import open\nopen('/etc/passwd')", POLICY),
    "relative_import": ("from .. import os", POLICY),
    "exec_builtin": ("exec('import os')", POLICY),
    "eval_builtin": ("eval('1')", POLICY),
    "compile_builtin": ("compile('1', 'x', 'eval')", POLICY),
    "open_descriptor": ("open(3, 'rb').read()", POLICY),
    "globals_builtin": ("globals()['__builtins__']", POLICY),
    "globals_call": ("g = globals\ng()", POLICY),
    "breakpoint_input": ("breakpoint()", POLICY),
    # --- builtins recovery
    "tuple_subclasses": ("().__class__.__base__.__subclasses__()", POLICY),
    "type_subclasses": ("type.__subclasses__(object)", POLICY),
    "list_mro": ("[].__class__.__mro__[-1].__subclasses__()", POLICY),
    "builtin_self": ("len.__self__.open", POLICY),
    "getattr_self_literal": ("getattr(print, '__self__')", POLICY),
    "getattr_computed": ("def f():\n    pass\ngetattr(f, '__glo' + 'bals__')", POLICY),
    "getattr_computed_builtins": ("n = ''.join(['__buil', 'tins__'])\ngetattr(len, n)", POLICY),
    "object_getattribute": ("def f():\n    pass\nobject.__getattribute__(f, '__globals__')", POLICY),
    "vars_module_private": ("import random\nvars(random)['_os']", "KeyError"),
    "dir_then_getattr": (
        "import random\nhits = [getattr(random, n) for n in dir(random) if n.strip('_') in ('os', 'sys')]\n"
        "hits[0].system('echo CANARY')",
        "IndexError",
    ),
    "attrgetter_literal": ("import operator\ndef f():\n    pass\noperator.attrgetter('__globals__')(f)", POLICY),
    "attrgetter_dynamic": (
        "import operator\ndef f():\n    pass\nname = '__' + 'globals__'\noperator.attrgetter(name)(f)",
        POLICY,
    ),
    "methodcaller_dynamic": ("import operator\noperator.methodcaller('__reduce' + '_ex__', 2)(len)", POLICY),
    "function_globals": ("def f():\n    pass\nf.__globals__['__builtins__']", POLICY),
    "function_code": ("def f():\n    pass\nf.__code__.co_consts", POLICY),
    "setattr_class": ("class A:\n    pass\nsetattr(A(), '__cl' + 'ass__', type)", POLICY),
    # --- frame walks
    "traceback_frame_walk": (
        "try:\n    1 / 0\nexcept Exception as e:\n    e.__traceback__.tb_frame.f_back.f_globals",
        POLICY,
    ),
    "generator_frame": ("def g():\n    yield\ng().gi_frame.f_back.f_builtins", POLICY),
    "coroutine_frame": ("async def c():\n    pass\nc().cr_frame", POLICY),
    "async_gen_frame": ("async def a():\n    yield\na().ag_frame", POLICY),
    "getattr_frame_dynamic": ("def g():\n    yield\ngetattr(g(), 'gi_' + 'frame')", POLICY),
    "task_stack": ("import asyncio\nasyncio.current_task().get_stack()", POLICY),
    "task_loop": ("import asyncio\nasyncio.current_task().get_loop().subprocess_shell", POLICY),
    "traceback_walk_stack": ("import traceback\nlist(traceback.walk_stack(None))", "AttributeError"),
    "event_loop": ("import asyncio\nasyncio.get_event_loop()", "AttributeError"),
    # --- format-string paths
    "format_literal_globals": ("def f():\n    pass\n'{0.__globals__}'.format(f)", POLICY),
    "format_literal_gi_frame": ("def g():\n    yield\n'{0.gi_frame}'.format(g())", POLICY),
    "format_dynamic": ("def f():\n    pass\nt = '{0.__glo' + 'bals__}'\nt.format(f)", POLICY),
    "format_unbound_str": ("t = '{0.__class__.__base__}'\nstr.format(t, 1)", POLICY),
    "format_map_dynamic": ("t = '{x.__class__.__base__}'\nt.format_map({'x': 1})", POLICY),
    "string_formatter": ("import string\ndef f():\n    pass\nstring.Formatter().format('{0.__globals__}', f)", POLICY),
    "format_as_decorator": ("t = '{0.__globals__}'\n@t.format\ndef f():\n    pass", POLICY),
    "format_as_class_decorator": ("t = '{0.__init__.__globals__}'\n@t.format\nclass A:\n    pass", POLICY),
    "format_via_getattr": ("t = '{0.__class__}'\nm = getattr(t, 'format')\nm(1)", POLICY),
    # --- module pivots
    "random_os": ("import random\nrandom._os.system('echo CANARY')", POLICY),
    "typing_sys": ("import typing\ntyping.sys.modules['os']", "AttributeError"),
    "json_codecs": ("import json\njson.codecs.open('/etc/passwd')", "AttributeError"),
    "enum_bltns": ("import enum\nenum.bltns.open('/etc/passwd')", "AttributeError"),
    "dataclasses_builtins": ("import dataclasses\ndataclasses.builtins.open('/etc/passwd')", "AttributeError"),
    "asyncio_subprocess_attr": ("import asyncio\nasyncio.subprocess", "AttributeError"),
    "asyncio_create_subprocess": (
        "import asyncio\nawait asyncio.create_subprocess_shell('echo CANARY')",
        "AttributeError",
    ),
    "asyncio_open_connection": ("import asyncio\nawait asyncio.open_connection('localhost', 1)", "AttributeError"),
    "asyncio_to_thread": ("import asyncio\nawait asyncio.to_thread(print, 'CANARY')", "AttributeError"),
    "total_ordering_globals": ("import functools\nfunctools.total_ordering.__globals__['sys']", POLICY),
    "io_open_attr": ("import io\nio.open('/etc/passwd')", "AttributeError"),
    "io_fileio": ("import io\nio.FileIO('/etc/passwd')", "AttributeError"),
    "random_bound_self": ("import random\nrandom.choice.__self__", POLICY),
    "collections_abc_sys": ("import collections.abc\ncollections.abc.sys", "AttributeError"),
    "get_type_hints_eval": ("import typing\ndef f(x: 'int'):\n    pass\ntyping.get_type_hints(f)", "AttributeError"),
    "annotation_payload": ("def f(x: '().__class__.__base__.__subclasses__()'):\n    pass", POLICY),
    "contextlib_chdir": ("import contextlib\ncontextlib.chdir('/')", "AttributeError"),
    "patch_shared_module": ("import json\njson.dumps = lambda *a, **k: 'CANARY'", POLICY),
    "patch_module_setattr": ("import json\nsetattr(json, 'loads', print)", POLICY),
    # --- BaseException from scripts
    "system_exit": ("raise SystemExit(3)", "SystemExit"),
    "keyboard_interrupt": ("raise KeyboardInterrupt", "KeyboardInterrupt"),
    "generator_exit": ("raise GeneratorExit", "GeneratorExit"),
    "custom_base_exception": ("class Boom(BaseException):\n    pass\nraise Boom('x')", "Boom"),
    "finalizer": ("class A:\n    def __del__(self):\n        print('CANARY')\na = A()", POLICY),
}


@pytest.mark.parametrize("code, expected", list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_script_is_stopped(run, code, expected):
    result = run(code + SUCCESS)
    error = result.error
    assert error is not None, f"not stopped: {result!r}"
    if isinstance(expected, str):
        assert type(error) is ScriptError and error.exc_type == expected, error.for_model()
    else:
        assert isinstance(error, expected), error.for_model()
    assert "CANARY" not in result.stdout + result.stderr
    assert "snapcell" not in error.for_model()
    # What the exploit would have set is not there, and the session is still usable.
    assert run("'pwned' in dir()").value is False


def test_there_are_at_least_40_hostile_scripts():
    assert len(HOSTILE) >= 40


SWALLOWERS = {
    "except_exception": "while True:\n    try:\n        x = 1\n    except Exception:\n        pass",
    "bare_except": "while True:\n    try:\n        while True:\n            pass\n    except:\n        pass",
    "except_base_exception": "while True:\n    try:\n        sum(range(1000))\n    except BaseException:\n        pass",
    "suppress_base_exception": (
        "import contextlib\nwhile True:\n    with contextlib.suppress(BaseException):\n"
        "        while True:\n            pass"
    ),
    "finally_continue": "while True:\n    try:\n        while True:\n            pass\n    finally:\n        continue",
    "exit_returns_true": (
        "class Swallow:\n    def __enter__(self):\n        return self\n"
        "    def __exit__(self, *exc):\n        return True\n"
        "while True:\n    with Swallow():\n        while True:\n            pass"
    ),
    "recursive_handlers": ("def f():\n    try:\n        f()\n    except BaseException:\n        f()\nf()"),
    "async_swallow_cancel": (
        "import asyncio\nwhile True:\n    try:\n        await asyncio.sleep(0.01)\n"
        "    except BaseException:\n        pass"
    ),
    "sleep_forever": "import time\ntime.sleep(3600)",
}


@pytest.mark.parametrize("code", list(SWALLOWERS.values()), ids=list(SWALLOWERS))
def test_swallowed_timeouts_still_stop(run, code):
    start = time.monotonic()
    result = run("before = 41\n" + code + SUCCESS, limits=Limits(wall_time_s=0.3))
    assert time.monotonic() - start < 3
    assert isinstance(result.error, TimeLimitExceeded), result.error
    assert any("stopped after 0.3 s" in n and "earlier variables are still defined" in n for n in result.notes)
    assert "CANARY" not in result.stdout
    assert run("(before + 1, 'pwned' in dir())").value == (42, False)


def test_output_flood_is_capped_and_fast(run):
    start = time.monotonic()
    result = run("for i in range(10**6):\n    print(i)", limits=Limits(max_output_bytes=1000))
    elapsed = time.monotonic() - start
    assert result.error is None
    assert elapsed < 10
    assert result.stdout.endswith("999999\n")
    assert "earlier characters of output were dropped" in result.stdout
    assert len(result.stdout) < 1200


def test_reduce_to_unreachable_module_cannot_even_be_written(run):
    code = "import os\nclass X:\n    def __reduce__(self):\n        return (os.system, ('echo CANARY',))\nx = X()"
    result = run(code)
    assert isinstance(result.error, PolicyError)
    assert run("'x' in dir() or 'X' in dir()").value is False


@pytest.mark.parametrize(
    "payload",
    [
        "(print, ('CANARY',))",
        "(getattr, (len, 'CANARY'))",
        "(type(len), ('CANARY',))",
    ],
)
def test_reduce_hooks_do_not_run_at_load(pool, capfd, payload):
    with pool.checkout() as first:
        first.feed_run(f"kept = 5\nclass X:\n    def __reduce__(self):\n        return {payload}\nx = X()")
        checkpoint = first.dump()
    with pool.checkout() as second:
        second.load_session(checkpoint)
        result = second.run("('x' in dir(), kept)")
    assert result.value == (False, 5)
    assert any("could not be restored" in n and "x" in n for n in result.notes), result.notes
    out, err = capfd.readouterr()
    assert "CANARY" not in out + err
