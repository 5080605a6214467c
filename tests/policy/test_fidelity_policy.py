"""No false positives in the policy: ordinary code runs, and the holes stay closed."""

from __future__ import annotations

import importlib.util
import types
from collections.abc import Iterator

import pytest

from snapcell import Policy, PolicyError, Pool, RunResult, Session
from snapcell.policy._fidelity import typed_attr

# Each was refused by the policy before; the value is what plain CPython gives.
ORDINARY: dict[str, tuple[str, object]] = {
    "str_replace": ("'a-b-c'.replace('-', '+')", "a+b+c"),
    "str_replace_dynamic": ("getattr('ab', 'replace')('a', 'x')", "xb"),
    "replace_methodcaller": ("import operator\noperator.methodcaller('replace', 'a', 'b')('aa')", "bb"),
    "date_replace": ("import datetime\ndatetime.date(2024, 1, 31).replace(month=3).isoformat()", "2024-03-31"),
    "datetime_replace": ("import datetime\ndatetime.datetime(2024, 1, 1, 9).replace(hour=17).hour", 17),
    "datetime_strptime": ("import datetime\ndatetime.datetime.strptime('2024-02-29', '%Y-%m-%d').day", 29),
    "time_strptime": ("import time\ntime.strptime('2024 7', '%Y %m').tm_mon", 7),
    "namedtuple_api": (
        "import collections\nP = collections.namedtuple('P', 'x y', defaults=[0])\np = P(1)\n"
        "(p._replace(x=5), p._asdict(), P._fields, P._make([3, 4]), P._field_defaults)",
        ((5, 0), {"x": 1, "y": 0}, ("x", "y"), (3, 4), {"y": 0}),
    ),
    "typing_namedtuple_api": (
        "import typing\nclass Row(typing.NamedTuple):\n    a: int\n    b: str = 'z'\n"
        "r = Row(1)\n(r._asdict(), Row._fields, getattr(r, '_replace')(a=2).a, hasattr(r, '_asdict'))",
        ({"a": 1, "b": "z"}, ("a", "b"), 2, True),
    ),
    "own_private_fields": (
        "class Form:\n    def __init__(self):\n        self._fields = ['a']\n    def names(self):\n"
        "        return list(self._fields)\nForm().names()",
        ["a"],
    ),
    "other_private_in_method": (
        "class T:\n    def __init__(self, c):\n        self._c = self.c = c\n    def __lt__(self, other):\n"
        "        return self._c < other._c\n[t.c for t in sorted([T(3), T(1), T(2)])]",
        [1, 2, 3],
    ),
    "own_private_from_outside": (
        "class T:\n    def __init__(self, c):\n        self._c = c\nt = T(5)\n"
        "def peek(x):\n    return x._c\n(t._c, peek(t), getattr(t, '_c'), hasattr(t, '_d'), T(2)._c)",
        (5, 5, 5, False, 2),
    ),
    "own_class_private_from_outside": ("class K:\n    _n = 3\n(K._n, K()._n)", (3, 3)),
    "made_classes_private_from_outside": (
        "import dataclasses, collections\nD = dataclasses.make_dataclass('D', [('_x', int)])\n"
        "X = type('X', (), {'_a': 1})\n(D(1)._x, X()._a, D.__module__)",
        (1, 1, "__main__"),
    ),
    "typeddict_keys": (
        "from typing import TypedDict, NotRequired\nclass Movie(TypedDict):\n    name: str\n"
        "    year: NotRequired[int]\n"
        "(sorted(Movie.__required_keys__), sorted(Movie.__optional_keys__), Movie.__total__,"
        " list(Movie.__annotations__))",
        (["name"], ["year"], True, ["name", "year"]),
    ),
    "get_type_hints": (
        "import typing\nclass Node:\n    value: int\n    next: 'Node | None'\n"
        "def f(a: 'list[Node]', b: int = 0) -> str:\n    pass\n"
        "hints = typing.get_type_hints(Node)\n"
        "(hints['value'] is int, hints['next'] == (Node | None), typing.get_type_hints(f)['a'] == list[Node],"
        " typing.get_args(typing.get_type_hints(f)['a'])[0] is Node)",
        (True, True, True, True),
    ),
    "function_annotations": ("def f(x: int) -> str:\n    pass\nsorted(f.__annotations__)", ["return", "x"]),
    "class_annotations": ("class C:\n    a: int\n    b: str\nlist(C.__annotations__)", ["a", "b"]),
    "mro": ("class A:\n    pass\nclass B(A):\n    pass\n[c.__name__ for c in B.__mro__]", ["B", "A", "object"]),
    "slots": ("class S:\n    __slots__ = ('x', 'y')\nS.__slots__", ("x", "y")),
    "names_and_doc": (
        "class K:\n    'Doc.'\n    def m(self):\n        pass\n(K.__name__, K.m.__qualname__, K.__module__, K.__doc__)",
        ("K", "K.m", "__main__", "Doc."),
    ),
    "instance_dict": ("class A:\n    def __init__(self):\n        self.x = 1\na = A()\na.__dict__['y'] = 2\na.y", 2),
    "class_dict": ("class A:\n    z = 3\nA.__dict__['z']", 3),
    "globals_read": ("total = 5\nglobals()['total']", 5),
    "globals_write": ("for i in range(2):\n    globals()[f'v{i}'] = i * 10\nv1", 10),
    "globals_listing": ("a = 1\nb = 2\n[k for k in globals() if k in ('a', 'b')]", ["a", "b"]),
    "globals_in_function": ("limit = 3\ndef f():\n    return globals().get('limit')\nf()", 3),
    "asyncio_run": (
        "import asyncio\nasync def main():\n    await asyncio.sleep(0)\n    return 42\nasyncio.run(main())",
        42,
    ),
    "asyncio_run_assigned": (
        "import asyncio as aio\nasync def main():\n    return [1, 2]\nresult = aio.run(main())\nresult",
        [1, 2],
    ),
    "asyncio_run_imported": ("from asyncio import run\nasync def main():\n    return 'ok'\nrun(main())", "ok"),
    "asyncio_run_gather": (
        "import asyncio\nasync def sq(x):\n    await asyncio.sleep(0)\n    return x * x\n"
        "async def main():\n    return await asyncio.gather(*(sq(i) for i in range(4)))\n"
        "if True:\n    out = asyncio.run(main())\nout",
        [0, 1, 4, 9],
    ),
    "import_hmac": (
        "import hmac, hashlib\nhmac.new(b'key', b'msg', hashlib.sha256).hexdigest()[:12]",
        "2d93cbc1be16",
    ),
    "import_graphlib": ("import graphlib\nlist(graphlib.TopologicalSorter({'b': {'a'}}).static_order())", ["a", "b"]),
    "import_html": ("import html\nhtml.unescape(html.escape('<a&b>'))", "<a&b>"),
    "import_secrets": ("import secrets\nlen(secrets.token_hex(8))", 16),
    "import_ipaddress": ("import ipaddress\nstr(ipaddress.ip_network('10.0.0.0/30').broadcast_address)", "10.0.0.3"),
    "import_fnmatch": ("import fnmatch\nfnmatch.filter(['a.csv', 'b.txt'], '*.csv')", ["a.csv"]),
    "import_zoneinfo": (
        "import zoneinfo, datetime\n"
        "datetime.datetime(2024, 7, 1, 12, tzinfo=zoneinfo.ZoneInfo('America/New_York')).utcoffset().total_seconds()",
        -14400.0,
    ),
}


@pytest.fixture(scope="module")
def shared(pool: Pool) -> Iterator[Session]:
    """One session per mode for these checks (a checkout costs a worker start in process mode)."""
    with pool.checkout() as session:
        yield session


@pytest.mark.parametrize(("code", "expected"), list(ORDINARY.values()), ids=list(ORDINARY))
def test_ordinary_code_is_not_refused(shared: Session, code: str, expected: object) -> None:
    result: RunResult = shared.run(code)
    assert result.error is None, result.error.for_model()
    assert result.value == expected


# What stays closed: each would reach something the policy protects.
CLOSED = {
    "globals_builtins": "globals()['__builtins__']",
    "globals_builtins_get": "globals().get('__builtins__')",
    "globals_set_dunder": "globals()['__builtins__'] = {}",
    "globals_subclass": "class G(type(globals())):\n    pass",
    "shared_class_dict": "import json\njson.JSONEncoder.__dict__",
    "namedtuple_api_elsewhere": "import json\njson.JSONDecoder()._make",
    "private_on_shared": "import json\ngetattr(json.JSONDecoder(), '_fields')",
    "other_private_on_shared_object": (
        "import random\nclass T:\n    def peek(self, other):\n"
        "        return other._randbelow\nT().peek(random.Random())"
    ),
    "private_on_stdlib_object_outside_class": "import random\nrandom.Random()._randbelow",
    "private_getattr_on_stdlib_object": "import datetime\ngetattr(datetime.timedelta(1), '_days')",
    "private_on_host_function": "peek = print\npeek._x",
    "private_store_from_outside": "class T:\n    pass\nt = T()\nt._c = 1",
    "type_hints_evaluate_no_calls": (
        "import typing\nclass C:\n    x: int\nC.__annotations__['x'] = 'print(1)'\ntyping.get_type_hints(C)"
    ),
    "type_hints_no_dunder_paths": (
        "import typing\nclass C:\n    x: int\nC.__annotations__['x'] = 'C.__init__.__globals__'\n"
        "typing.get_type_hints(C)"
    ),
    "type_hints_no_private_paths": (
        "import typing, random\nR = random.Random()\nclass C:\n    x: int\nC.__annotations__['x'] = 'R._randbelow'\n"
        "typing.get_type_hints(C)"
    ),
    "type_hints_no_namespaces": "import typing\nclass C:\n    x: 'int'\ntyping.get_type_hints(C, {}, {})",
    "asyncio_run_in_function": (
        "import asyncio\nasync def main():\n    return 1\ndef sync():\n    return asyncio.run(main())\nsync()"
    ),
}


@pytest.mark.parametrize("code", list(CLOSED.values()), ids=list(CLOSED))
def test_what_stays_closed(shared: Session, code: str) -> None:
    result = shared.run(code)
    assert result.error is not None
    assert result.error.exc_type in ("PolicyError", "TypeError", "RuntimeError"), result.error.for_model()
    if result.error.exc_type == "RuntimeError":
        assert "at the top level" in result.error.for_model()
    assert "__builtins__" not in (result.value_repr or "")


def test_code_objects_keep_replace_refused() -> None:
    code = compile("1", "<x>", "eval")
    assert isinstance(code, types.CodeType)
    with pytest.raises(PolicyError, match="replace"):
        typed_attr(code, "replace")
    assert typed_attr("ab", "replace")("a", "b") == "bb"


def test_globals_hides_the_interpreter_entries(run) -> None:
    result = run("x = 1\nsorted(k for k in globals() if k.startswith('__'))")
    assert result.value == ["__name__"]
    assert run("'__builtins__' in globals(), len(globals()) >= 1").value == (False, True)


def test_pd_version_is_readable_when_allowed() -> None:
    if importlib.util.find_spec("numpy") is None:
        pytest.skip("numpy is not installed here")
    with Pool("memory://", isolation="inline", policy=Policy(extra_modules={"numpy"})) as pool:
        with pool.checkout() as session:
            assert session.feed_run("import numpy as np\nnp.__version__") == __import__("numpy").__version__


def _imports(pool: Pool, module: str) -> bool:
    with pool.checkout() as session:
        return session.run(f"import {module}").error is None


def test_process_mode_admits_numpy_and_pandas_by_default_and_inline_does_not() -> None:
    installed = {m for m in ("numpy", "pandas") if importlib.util.find_spec(m) is not None}
    assert Policy.process_default().extra_modules == installed
    assert Policy.stdlib_only().modules == Policy().modules and not Policy.stdlib_only().extra_modules
    if "pandas" not in installed:
        pytest.skip("pandas is not installed here")
    with Pool("memory://", isolation="process") as pool, pool.checkout() as session:
        assert session.feed_run("import pandas as pd\nint(pd.DataFrame({'a': [1, 2]})['a'].sum())") == 3
    with Pool("memory://", isolation="inline") as pool:
        assert not _imports(pool, "pandas")
    with Pool("memory://", isolation="process", policy=Policy.stdlib_only()) as pool:
        assert not _imports(pool, "pandas")
