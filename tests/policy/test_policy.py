"""The restricted policy: what still works (positive) and what is blocked with a useful message (negative)."""

from __future__ import annotations

import uuid

import pytest

import snapcell
from snapcell import Policy
from snapcell.errors import ConfigError, PolicyError

ALLOWED = {
    "class_with_init_and_private_state": (
        "class Account:\n"
        "    def __init__(self, owner):\n"
        "        self._owner = owner\n"
        "        self.__pin = 1234\n"
        "    def __repr__(self):\n"
        "        return f'{self.__class__.__name__}({self._owner!r})'\n"
        "    def __eq__(self, other):\n"
        "        return isinstance(other, Account) and repr(other) == repr(self)\n"
        "    _count = 0\n"
        "    @classmethod\n"
        "    def make(cls):\n"
        "        cls._count += 1\n"
        "        return cls._count\n"
        "    def pin_ok(self):\n"
        "        return self.__pin == 1234\n"
        "(repr(Account('ann')), Account('a') == Account('a'), Account.make(), Account('b').pin_ok())",
        ("Account('ann')", True, 1, True),
    ),
    "super_init": (
        "class Base:\n    def __init__(self, x):\n        self.x = x\n"
        "class Child(Base):\n    def __init__(self):\n        super().__init__(3)\n        Base.__init__(self, 4)\n"
        "Child().x",
        4,
    ),
    "dataclass": (
        "from dataclasses import dataclass, field, asdict\n"
        "@dataclass(frozen=True)\nclass P:\n    x: int\n    tags: list = field(default_factory=list)\n"
        "    def __post_init__(self):\n        assert self.x >= 0\n"
        "asdict(P(1))",
        {"x": 1, "tags": []},
    ),
    "enum": (
        "import enum\nclass Color(enum.Enum):\n    RED = 1\n    BLUE = 2\n[c.name for c in Color]",
        ["RED", "BLUE"],
    ),
    "generator": ("def gen(n):\n    yield from range(n)\nsum(gen(5))", 10),
    "async_with_and_gather": (
        "import asyncio, contextlib\n"
        "@contextlib.asynccontextmanager\nasync def res():\n    yield 2\n"
        "async def work(i):\n    await asyncio.sleep(0)\n    return i\n"
        "async with res() as k:\n    out = await asyncio.gather(*(work(i) for i in range(3)))\n"
        "[o * k for o in out]",
        [0, 2, 4],
    ),
    "contextlib_suppress": ("import contextlib\nwith contextlib.suppress(KeyError):\n    {}['x']\n'ok'", "ok"),
    "lru_cache": (
        "import functools\n@functools.lru_cache(maxsize=None)\ndef fib(n):\n"
        "    return n if n < 2 else fib(n-1) + fib(n-2)\nfib(30)",
        832040,
    ),
    "collections": (
        "from collections import Counter, defaultdict, deque, OrderedDict\n"
        "import collections.abc\n"
        "from collections.abc import Mapping\n"
        "(Counter('aab').most_common(1), isinstance({}, collections.abc.Mapping), isinstance({}, Mapping))",
        ([("a", 2)], True, True),
    ),
    "json_re_datetime": (
        "import json, re, datetime\n"
        "(json.loads(json.dumps({'a': [1]})), re.findall(r'\\d+', 'a1b22'), datetime.date(2024, 1, 2).isoformat())",
        ({"a": [1]}, ["1", "22"], "2024-01-02"),
    ),
    "stdlib_misc": (
        "import decimal, fractions, statistics, math, hashlib, base64, struct, heapq, bisect, itertools, uuid\n"
        "(str(decimal.Decimal('1.1') + 1), int(fractions.Fraction(1, 3) * 3), statistics.mean([1, 2, 3]),\n"
        " hashlib.sha256(b'').hexdigest()[:4], base64.b64encode(b'a'), struct.unpack('<i', struct.pack('<i', 7))[0],\n"
        " len(str(uuid.uuid4())))",
        ("2.1", 1, 2, "e3b0", b"YQ==", 7, 36),
    ),
    "io_in_memory": (
        "import io, csv\nbuf = io.StringIO('a,b\\n1,2\\n')\nlist(csv.DictReader(buf))",
        [{"a": "1", "b": "2"}],
    ),
    "format_plain_fields": ("('{} {x}'.format(1, x=2), '{0[k]} {0}'.format({'k': 1}))", ("1 2", "1 {'k': 1}")),
    "format_dynamic_plain": ("t = '{0}-{n}'\nt.format(1, n=2)", "1-2"),
    "string_formatter_plain": ("import string\nstring.Formatter().format('{a}', a=5)", "5"),
    "attrgetter_public": (
        "import operator\nclass O:\n    pass\no = O()\no.a = O()\no.a.b = 3\noperator.attrgetter('a.b')(o)",
        3,
    ),
    "getattr_public_dynamic": ("class O:\n    color = 'red'\nname = 'col' + 'or'\ngetattr(O, name)", "red"),
    "dir_and_vars_filtered": (
        "class O:\n    def __init__(self):\n        self.a = 1\n(vars(O()), 'a' in dir(O()), "
        "any(n in ('__dict__', '__reduce__', '_x') for n in dir(O())))",
        ({"a": 1}, True, False),
    ),
    "type_name_and_isinstance": (
        "(type(3).__name__, (3).__class__.__name__, isinstance(3, int))",
        ("int", "int", True),
    ),
    "string_annotations": ("def f(x: 'int') -> 'list[int]':\n    return [x]\nf(1)", [1]),
    "time_sleep": ("import time\nt = time.monotonic()\ntime.sleep(0.06)\ntime.monotonic() - t >= 0.06", True),
    "star_import": ("from math import *\nfloor(2.5)", 2),
    "match_class": (
        "class P:\n    __match_args__ = ('x',)\n    def __init__(self):\n        self.x = 1\n"
        "match P():\n    case P(x=1):\n        r = 'one'\nr",
        "one",
    ),
    "slots_and_name": ("class S:\n    __slots__ = ('a',)\n__name__", "__main__"),
    # --- ordinary code near the guard's stand-ins: none of it may be refused
    "functools_wraps_script_function": (
        "import functools\ndef deco(f):\n    @functools.wraps(f)\n    def w(*a):\n        return f(*a) + 1\n"
        "    return w\n@deco\ndef g(x):\n    'doc'\n    return x\n(g(1), g.__name__, g.__doc__)",
        (2, "g", "doc"),
    ),
    "functools_update_wrapper_defaults": (
        "import functools\ndef f(x):\n    return x\nf.tag = 1\ndef w(x):\n    return f(x)\n"
        "functools.update_wrapper(w, f)\n(w.__name__, w.tag, w(3))",
        ("f", 1, 3),
    ),
    "copy_plain_data_and_objects_holding_modules": (
        "import copy, json\nd = {'a': [1, {'b': 2}]}\ne = copy.deepcopy(d)\ne['a'][1]['b'] = 3\n"
        "class P:\n    def __init__(self):\n        self.m = json\n        self.x = [1]\nq = copy.deepcopy(P())\n"
        "(d, copy.copy([1, 2]), q.x, q.m is json, copy.copy(json) is json)",
        ({"a": [1, {"b": 2}]}, [1, 2], [1], True, True),
    ),
    "str_subclass_used_normally": (
        "class S(str):\n    def shout(self):\n        return self.upper() + '!'\ns = S('hi')\n"
        "(s.shout(), getattr(s, 'upper')(), '{0}'.format(s), s.startswith('h'), S('{0}-{x}').format(1, x=2))",
        ("HI!", "HI", "hi", True, "1-2"),
    ),
    "type_three_arguments": (
        "X = type('X', (), {'a': 1})\nY = type('Y', (X,), {'b': 2, '__repr__': lambda self: 'Y!'})\n"
        "t = type\n(X.a, Y().b, repr(Y()), type(3).__name__, t('Z', (), {}).__name__, isinstance(X, type))",
        (1, 2, "Y!", "int", "Z", True),
    ),
    "asyncio_own_tasks": (
        "import asyncio\nasync def w(i):\n    await asyncio.sleep(0.01)\n    return i\n"
        "t = asyncio.create_task(w(5))\nmine = {t, *(asyncio.ensure_future(w(i)) for i in (6, 7))}\n"
        "visible = mine <= asyncio.all_tasks()\nr = await asyncio.gather(w(1), w(2), *mine)\n"
        "(sorted(r), visible, asyncio.current_task() is not None)",
        ([1, 2, 5, 6, 7], True, True),
    ),
    "operator_getters": (
        "import operator\nclass O:\n    pass\no = O()\no.a = O()\no.a.b = 3\no.c = 'x'\n"
        "(operator.attrgetter('a.b')(o), operator.attrgetter('a.b', 'c')(o), operator.methodcaller('upper')('ab'),"
        " operator.methodcaller('split', ',', maxsplit=1)('a,b,c'), operator.methodcaller('format', 1)('{0}!'),"
        " type(operator.attrgetter('c'))('c')(o))",
        (3, (3, "x"), "AB", ["a", "b,c"], "1!", "x"),
    ),
    "string_formatter_subclass": (
        "import string\nclass F(string.Formatter):\n    def format_field(self, v, spec):\n"
        "        return '<' + super().format_field(v, spec) + '>'\n"
        "(F().format('{0} {x:>3} {0[k]}', {'k': 1}, x=2), string.Formatter().vformat('{a}', (), {'a': 1}),"
        " isinstance(F(), string.Formatter))",
        ("<{'k': 1}> <  2> <1>", "1", True),
    ),
    "setting_attributes_of_own_objects": (
        "import json, decimal\nclass A:\n    n = 0\n    def __init__(self):\n        self.v = 1\n        A.n += 1\n"
        "def f():\n    pass\nf.tag = 2\nenc = json.JSONEncoder()\nenc.indent = 2\nctx = decimal.Context(prec=5)\n"
        "ctx.prec += 1\nA()\nA.k = 3\nsetattr(A, 'j', 4)\ndel A.j\nclass B(json.JSONEncoder):\n    pass\n"
        "B.item_separator = ';'\n(A.n, A.k, f.tag, enc.encode([1, 2]), ctx.prec, B().encode([1, 2]))",
        (1, 3, 2, "[\n  1, \n  2\n]", 6, "[1;2]"),
    ),
    "class_decorators_on_own_classes": (
        "import dataclasses, functools, typing, abc\n@dataclasses.dataclass(frozen=True, order=True)\nclass P:\n"
        "    x: int\n    y: list = dataclasses.field(default_factory=list)\n"
        "Q = dataclasses.make_dataclass('Q', [('a', int)], namespace={'twice': lambda self: self.a * 2})\n"
        "@functools.total_ordering\nclass V:\n    def __init__(self, v):\n        self.v = v\n"
        "    def __eq__(self, o):\n        return self.v == o.v\n"
        "    def __lt__(self, o):\n        return self.v < o.v\n"
        "@typing.final\n@typing.no_type_check\ndef h():\n    return 1\n"
        "(P(1) < P(2), Q(3).twice(), V(1) <= V(2), h(), abc.update_abstractmethods(V) is V)",
        (True, 6, True, 1, True),
    ),
    "singledispatch_by_annotation": (
        "import functools, decimal\n@functools.singledispatch\ndef f(x):\n    return 'any'\n"
        "@f.register\ndef _(x: int):\n    return 'int'\n@f.register(str)\ndef _(x):\n    return 'str'\n"
        "@f.register\ndef _(x: 'list | tuple'):\n    return 'seq'\n@f.register\ndef _(x: 'decimal.Decimal'):\n"
        "    return 'dec'\nclass A:\n    @functools.singledispatchmethod\n    def m(self, x):\n        return 'any'\n"
        "    @m.register\n    def _(self, x: int):\n        return 'int'\n"
        "(f(1), f('a'), f(1.5), f([1]), f((1,)), f(decimal.Decimal(1)), A().m(1), A().m('s'))",
        ("int", "str", "any", "seq", "seq", "dec", "int", "any"),
    ),
    "classes_made_by_calls_stay_writable": (
        "import abc, dataclasses, enum, collections, typing\nX = type('X', (), {})\nX.a = 1\n"
        "Q = dataclasses.make_dataclass('Q', [('a', int)])\nQ.b = 2\nZ = abc.ABCMeta('Z', (), {})\nZ.c = 3\n"
        "E = enum.Enum('E', 'A B')\nE.d = 4\nP = collections.namedtuple('P', 'a')\nP.e = 5\n"
        "T = typing.NamedTuple('T', [('a', int)])\nT.f = 6\n(X.a, Q.b, Z.c, E.d, P.e, T.f, X.__module__)",
        (1, 2, 3, 4, 5, 6, "__main__"),
    ),
    "new_class_and_call_calls": (
        "class V:\n    def __new__(cls, x):\n        self = super().__new__(cls)\n"
        "        self.x = x\n        return self\n"
        "    def __add__(self, other):\n        return self.__class__(self.x + other.x)\n"
        "    def __call__(self, y):\n        return self.x * y\n"
        "class W:\n    pass\nw = object.__new__(W)\n"
        "((V(1) + V(2)).x, V(3).__call__(2), type(w).__name__, int.__class__(5).__name__)",
        (3, 6, "W", "int"),
    ),
    "metaclasses_and_abcs": (
        "class M(type):\n    def __new__(mcs, name, bases, ns):\n        ns['tag'] = name.lower()\n"
        "        return super().__new__(mcs, name, bases, ns)\nclass A(metaclass=M):\n    pass\nimport abc, enum\n"
        "class B(abc.ABC):\n    @abc.abstractmethod\n    def m(self): ...\nclass C(enum.Enum):\n    R = 1\n"
        "(A.tag, type(A) is M, C.R.name, enum.Enum('D', 'X Y').X.value)",
        ("a", True, "R", 1),
    ),
    "try_finally_normal": (
        "out = []\nfor i in range(3):\n    try:\n        out.append(i)\n    finally:\n        out.append(-i)\nout",
        [0, 0, 1, -1, 2, -2],
    ),
}


@pytest.mark.parametrize("code, expected", list(ALLOWED.values()), ids=list(ALLOWED))
def test_allowed_code_still_works(run, code, expected):
    result = run(code)
    assert result.error is None, result.error.for_model()
    assert result.value == expected


BLOCKED = {
    "import_os": ("import os", "import of 'os'"),
    "from_os": ("from os import path", "import of 'os'"),
    "relative": ("from . import x", "relative imports"),
    "asyncio_submodule": ("import asyncio.subprocess", "import of 'asyncio.subprocess'"),
    "from_io_open": ("from io import open", "importing 'open' from 'io'"),
    "private_from_import": ("from random import _os", "importing '_os' from 'random'"),
    "dunder_attr": ("(lambda: 0).__globals__", "special attribute .__globals__"),
    "dunder_store": ("class A:\n    pass\nA.__repr__ = None", "assigning the special attribute .__repr__"),
    "frame_attr": ("def g():\n    yield\ng().gi_frame", ".gi_frame"),
    "tb_attr": ("x = None\nx.tb_frame", ".tb_frame"),
    "dunder_name": ("__builtins__", "the name __builtins__"),
    "dunder_import": ("__import__('os')", "the name __import__"),
    "getattr_literal": ("getattr(len, '__self__')", ".__self__"),
    "setattr_literal": ("class A:\n    pass\nsetattr(A, '__module__', 'os')", ".__module__"),
    "format_literal": ("'{0.__class__}'.format(1)", "attribute path {0.__class__}"),
    "format_nested_spec": ("'{0:{1.real}}'.format(1, 2)", "attribute path {1.real}"),
    "attrgetter_literal": ("import operator\noperator.attrgetter('a.__globals__')", ".__globals__"),
    "methodcaller_literal": ("import operator\noperator.methodcaller('__reduce__')", ".__reduce__"),
    "del_finalizer": ("class A:\n    def __del__(self):\n        pass", "defining __del__"),
    "string_annotation_payload": ("def f(x: '().__class__.__base__'):\n    pass", ".__base__"),
    "nested_string_annotation": ("import typing\nx: typing.List['f.__globals__'] = []", ".__globals__"),
    "match_dunder": ("match 1:\n    case int(__globals__=c):\n        pass", ".__globals__"),
}


@pytest.mark.parametrize("code, fragment", list(BLOCKED.values()), ids=list(BLOCKED))
def test_blocked_code_raises_policy_error_before_running(run, code, fragment):
    result = run("ran_before = 1\n" + code)
    assert isinstance(result.error, PolicyError), result.error
    assert fragment in str(result.error)
    assert result.error.lineno is not None and result.error.lineno >= 2
    assert result.error.hint
    # The check runs before anything executes: not even the first line ran.
    assert run("'ran_before' in dir()").value is False


RUNTIME_BLOCKED = {
    # Private attributes are the script's own only on its own objects (decided by the object, at runtime).
    "private_attr_on_other": ("import random\nrandom.Random()._randbelow", "private attribute ._randbelow"),
    "private_on_rebound_self": (
        "import random\nclass A:\n    def m(self):\n        self = random\n        return self._os\nA().m()",
        "private attribute ._os",
    ),
    "private_on_staticmethod_arg": (
        "class A:\n    @staticmethod\n    def m(self):\n        return self._x\nA.m(1)",
        "private attribute ._x",
    ),
    "getattr_dynamic": ("n = '__glo' + 'bals__'\ngetattr(len, n)", ".__globals__"),
    "hasattr_dynamic": ("n = '_' + 'x'\nhasattr(1, n)", "._x"),
    "setattr_dynamic": ("class A:\n    pass\nn = '__cl' + 'ass__'\nsetattr(A(), n, int)", ".__class__"),
    "getattr_frame_dynamic": ("def g():\n    yield\nn = 'gi_' + 'frame'\ngetattr(g(), n)", ".gi_frame"),
    "format_dynamic": ("t = '{0.__cl' + 'ass__}'\nt.format(1)", "attribute path"),
    "format_map_dynamic": ("t = '{a.real}'\nt.format_map({'a': 1})", "attribute path"),
    "str_format_unbound": ("t = '{0.real}'\nstr.format(t, 1)", "attribute path"),
    "format_bound_via_getattr": ("t = '{0.real}'\nm = getattr(t, 'format')\nm(1)", "attribute path"),
    "string_formatter": ("import string\nstring.Formatter().format('{0.real}', 1)", "attribute path"),
    "attrgetter_dynamic": ("import operator\nn = '__' + 'code__'\noperator.attrgetter('a', n)", ".__code__"),
    "vars_no_args": ("vars()", "vars() without an argument"),
    "vars_of_class": ("vars(int)", "vars() of a class"),
    "module_is_read_only": ("import json\njson.dumps = print", "changing the module attribute json.dumps"),
    "shared_class_is_read_only": (
        "import json\njson.JSONEncoder.indent = 2",
        "changing the class json.encoder.JSONEncoder",
    ),
    "shared_function_is_read_only": ("import json\njson.dumps.cache = {}", "changing function dumps"),
    "type_with_finalizer": ("X = type('X', (), {'__del__': print})", "defining __del__"),
    "wraps_with_dunder_names": ("import functools\nfunctools.wraps(len, assigned=('__dict__',))", ".__dict__"),
    "dataclass_field_name_not_an_identifier": (
        "import dataclasses\nA = type('A', (), {'__annotations__': {'x=print(1),*a': int}})\ndataclasses.dataclass(A)",
        "the dataclass field name",
    ),
    "singledispatch_code_annotation": (
        "import functools\nf = functools.singledispatch(len)\n"
        "A = type('A', (), {'__annotations__': {'x': 'int.real'}})\n"
        "f.register(A())",
        "registering by the string annotation",
    ),
}


@pytest.mark.parametrize("code, fragment", list(RUNTIME_BLOCKED.values()), ids=list(RUNTIME_BLOCKED))
def test_dynamic_access_raises_policy_error_at_runtime(run, code, fragment):
    result = run("ran_before = 1\n" + code)
    assert isinstance(result.error, PolicyError), result.error
    assert fragment in str(result.error)
    assert 2 <= result.error.lineno <= code.count("\n") + 2  # the script's own line, not a snapcell frame
    assert "snapcell" not in result.error.for_model()
    assert run("ran_before").value == 1  # earlier variables survive a runtime block


def test_blocked_import_names_the_module_and_lists_allowed_ones(run):
    error = run("import sqlite3").error
    assert isinstance(error, PolicyError)
    assert "'sqlite3'" in str(error)
    assert "Allowed modules:" in error.hint and "json" in error.hint and "math" in error.hint
    assert "import sqlite3" in error.for_model()


@pytest.mark.parametrize(
    "code",
    [
        "import random\n'_os' in dir(random) or 'os' in dir(random)",
        "import typing\n'sys' in dir(typing)",
        "import json\n'codecs' in dir(json)",
        "import enum\n'bltns' in dir(enum)",
        "import dataclasses\n'builtins' in dir(dataclasses)",
        "import asyncio\nany(n in dir(asyncio) for n in ['subprocess', 'open_connection', 'start_server',"
        " 'create_subprocess_exec', 'create_subprocess_shell', 'get_event_loop', 'to_thread', 'events'])",
        "import io\nany(n in dir(io) for n in ['open', 'FileIO', 'open_code'])",
        "import functools\n'RLock' in dir(functools)",
        "import typing\n'ForwardRef' in dir(typing)",
    ],
)
def test_module_views_hide_pivots(run, code):
    result = run(code)
    assert result.error is None, result.error.for_model()
    assert result.value is False


def test_module_views_keep_what_scripts_use(run):
    code = (
        "import asyncio, io, time, hashlib, random\n"
        "all([asyncio.gather, asyncio.create_task, asyncio.ensure_future, asyncio.TaskGroup, asyncio.Queue,"
        " io.StringIO, io.BytesIO, time.time, time.sleep, hashlib.blake2b, random.Random, random.SystemRandom])"
    )
    result = run(code)
    assert result.error is None and result.value is True


def test_hidden_module_attribute_says_the_policy_hides_it(run):
    error = run("import json\njson.codecs").error
    assert error.exc_type == "AttributeError"
    assert "policy hides it" in error.for_model()


def test_module_views_survive_a_checkpoint_and_stay_guarded(pool):
    with pool.checkout() as first:
        first.feed_run("import random, collections.abc\nfrom json import dumps\nr = random")
        checkpoint = first.dump()
    with pool.checkout() as second:
        second.load_session(checkpoint)
        assert second.feed_run("random.choice([7]), dumps([1]), isinstance({}, collections.abc.Mapping)") == (
            7,
            "[1]",
            True,
        )
        assert second.feed_run("'_os' in dir(r) or 'os' in dir(r)") is False
        error = second.run("n = '_o' + 's'\ngetattr(r, n)").error
        assert isinstance(error, PolicyError)
        assert isinstance(second.run("r.x = 1").error, PolicyError)


def test_extra_modules_are_allowed(pool):
    policy = Policy().with_modules(["numpy"])
    assert "numpy" in policy.modules and "json" in policy.modules
    with pool.checkout(policy=policy) as session:
        assert session.feed_run("import numpy as np\nint(np.arange(4).sum())") == 6
        assert isinstance(session.run("import os").error, PolicyError)


def test_unrestricted_policy_checks_nothing(pool):
    with pool.checkout(policy=Policy.unrestricted()) as session:
        assert session.feed_run("import os\n(lambda: 0).__globals__ is not None") is True


@pytest.mark.parametrize(
    "kwargs",
    [
        {"allowed_modules": "json"},
        {"extra_modules": ["numpy", ""]},
        {"extra_modules": ["numpy.linalg"]},
        {"extra_modules": [3]},
        {"restricted": "yes"},
    ],
)
def test_policy_validates_its_fields(kwargs):
    with pytest.raises(ConfigError):
        Policy(**kwargs)


def test_policy_is_frozen_and_extendable():
    policy = Policy(extra_modules={"pandas"})
    assert isinstance(policy.extra_modules, frozenset)
    with pytest.raises(AttributeError):
        policy.restricted = False  # type: ignore[misc]
    wider = policy.with_modules(["numpy"])
    assert wider.extra_modules == {"pandas", "numpy"} and policy.extra_modules == {"pandas"}
    assert wider.allows_module("numpy.linalg") and not wider.allows_module("os")
    assert not Policy().allows_module("asyncio.subprocess") and Policy().allows_module("collections.abc")


def test_restored_functions_use_the_policy_builtins(pool):
    with pool.checkout() as first:
        first.feed_run("def opener():\n    return compile\ndef counts():\n    return len([1, 2])")
        checkpoint = first.dump()
    with pool.checkout() as second:
        second.load_session(checkpoint)
        result = second.run("opener()('1', 'x', 'eval')")  # the policy's stand-in, not the real compile
        assert isinstance(result.error, PolicyError), result.error
        assert second.feed_run("counts()") == 2
        runner = getattr(second._inner._backend, "runner", None)
        if runner is not None:  # inline: look at the restored function itself
            assert runner.namespace["opener"].__builtins__ is runner.builtins
            assert runner.builtins["open"] is not open and runner.builtins["eval"] is not eval  # stand-ins


def test_stand_ins_survive_a_checkpoint_and_stay_guarded(pool):
    with pool.checkout() as first:
        first.feed_run(
            "import operator, string, functools\nfrom asyncio import all_tasks\n"
            "getter, caller = operator.attrgetter('real'), operator.methodcaller('upper')\n"
            "fmt, wraps = string.Formatter(), functools.wraps"
        )
        checkpoint = first.dump()
    with pool.checkout() as second:
        second.load_session(checkpoint)
        assert second.feed_run("(getter(2), caller('a'), fmt.format('{0}', 1), callable(wraps))") == (2, "A", "1", True)
        assert isinstance(second.run("type(getter)('__globals__')").error, PolicyError)
        assert isinstance(second.run("fmt.format('{0.real}', 1)").error, PolicyError)


def test_restored_classes_and_functions_stay_writable(pool):
    with pool.checkout() as first:
        first.feed_run("class A:\n    pass\ndef f():\n    pass")
        checkpoint = first.dump()
    with pool.checkout() as second:
        second.load_session(checkpoint)
        assert second.feed_run("A.x = 1\nf.y = 2\nsetattr(A, 'z', 3)\n(A.x, f.y, A.z)") == (1, 2, 3)


def test_warmed_guarded_builtins_are_copied_fresh_without_walking_the_builtins_again(monkeypatch) -> None:
    from snapcell.policy import _guard

    monkeypatch.setattr(_guard, "_WARM_BUILTINS", [])
    built = _guard.guarded_builtins()
    _guard.warm_guarded_builtins()
    walks = []
    real = _guard._build_guarded_builtins
    monkeypatch.setattr(_guard, "_build_guarded_builtins", lambda: (walks.append(1), real())[1])
    one, two = _guard.guarded_builtins(), _guard.guarded_builtins()
    assert walks == []  # copied from the zygote's, not built again
    assert one == two == built and one is not two  # each session gets a dict of its own
    one["len"] = None  # a session changing its own builtins changes nobody else's
    assert _guard.guarded_builtins()["len"] is len


MISSING = "snapcell_no_such_module"


@pytest.mark.parametrize(
    "code",
    [f"import {MISSING}", f"import {MISSING}.sub as s", f"from {MISSING} import x", f"from {MISSING}.sub import x"],
)
def test_a_module_that_is_not_installed_is_reported_missing_not_refused(pool, code):
    # The policy would refuse it, but even allowing it would not help: the real cause is that it is missing (as
    # numpy is for the default policy on a host without numpy).
    with pool.checkout() as session:
        error = session.run(code).error
        assert error is not None and not isinstance(error, PolicyError)
        assert error.exc_type == "ModuleNotFoundError"
        assert f"No module named {MISSING!r}" in str(error) and "not installed" in str(error)
        # As with any missing module, a script can test for it and carry on.
        assert session.feed_run(f"try:\n    {code}\nexcept ImportError:\n    found = False\nfound") is False
        assert isinstance(session.run("import os").error, PolicyError)  # installed and refused: still a refusal


def test_a_policy_allowing_a_missing_module_warns_once(caplog):
    import logging

    # A name no other test uses: the warning is once per process, and another test's pool may have given it for
    # a name they share.
    missing = f"{MISSING}_{uuid.uuid4().hex}"
    policy = Policy(extra_modules={missing, "json"})
    assert policy.missing_modules() == {missing}
    assert not Policy.stdlib_only().missing_modules() and not Policy.unrestricted().missing_modules()
    with caplog.at_level(logging.WARNING, logger="snapcell"):
        snapcell.Pool(isolation="inline", policy=policy).close()
        snapcell.Pool(isolation="inline", policy=policy).close()
    warnings = [r.getMessage() for r in caplog.records if r.name == "snapcell" and missing in r.getMessage()]
    assert len(warnings) == 1 and "not installed" in warnings[0]


def test_a_checkpoint_naming_a_module_that_is_not_installed_says_so() -> None:
    from snapcell.checkpoint._rule import module_refusal

    refuse_all = lambda _module: False  # noqa: E731  (as the default policy on a host without the module)
    assert module_refusal(f"{MISSING}.sub", refuse_all) == "a module that is not installed here"
    assert module_refusal("sqlite3", refuse_all) == "a module the policy does not allow"
