# ruff: noqa: E501  (scripts are data: a turn reads best as the lines a model would send)
"""Ordinary agent scripts, as multi-turn conversations: what a model writes when it wrangles data.

Each entry is ``(name, turns)``. The test restores every turn from the previous turn's checkpoint in a new
session (a new worker process in process mode) and compares what it gives with plain CPython running the same
turns in one namespace. Host tools the scripts call are in `TOOLS`.
"""

from __future__ import annotations

import asyncio
from typing import Any

ORDERS = [
    {"id": 1, "customer": "ana", "total": 30.5, "day": "2024-03-01", "items": ["pen", "ink"]},
    {"id": 2, "customer": "bo", "total": 12.0, "day": "2024-03-01", "items": ["pad"]},
    {"id": 3, "customer": "ana", "total": 7.25, "day": "2024-03-02", "items": ["pen"]},
    {"id": 4, "customer": "cy", "total": 99.0, "day": "2024-03-03", "items": ["desk", "pen"]},
]
PRICES = {"AAPL": 190.5, "MSFT": 410.25, "NVDA": 880.0}


def get_orders() -> list[dict[str, Any]]:
    """A sync host tool."""
    return [dict(o, items=list(o["items"])) for o in ORDERS]


async def fetch_price(symbol: str) -> float:
    """An async host tool."""
    await asyncio.sleep(0)
    return PRICES[symbol]


async def fetch_weather(city: str) -> dict[str, Any]:
    """An async host tool returning a dict."""
    await asyncio.sleep(0)
    return {"city": city, "temp_c": len(city) * 3.5, "rain": city.startswith("B")}


def search(query: str, limit: int = 3) -> list[str]:
    """A sync host tool with a keyword argument."""
    return [f"{query} result {i}" for i in range(limit)]


TOOLS = {"get_orders": get_orders, "fetch_price": fetch_price, "fetch_weather": fetch_weather, "search": search}

CSV_TEXT = "name,dept,salary\\nann,eng,120\\nbob,ops,90\\ncid,eng,135\\ndee,ops,80\\n"

C = tuple[str, list[str]]

WRANGLING: list[C] = [
    (
        "orders_by_customer",
        [
            "orders = get_orders()\nby = {}\nfor o in orders:\n    by.setdefault(o['customer'], []).append(o['total'])\nsorted(by)",
            "{k: round(sum(v), 2) for k, v in by.items()}",
        ],
    ),
    (
        "top_orders",
        [
            "orders = get_orders()\ntop = sorted(orders, key=lambda o: o['total'], reverse=True)[:2]",
            "[o['id'] for o in top]",
        ],
    ),
    (
        "flatten_items",
        [
            "orders = get_orders()\nitems = [i for o in orders for i in o['items']]\nlen(items)",
            "unique = sorted(set(items))\nunique",
            "{i: items.count(i) for i in unique}",
        ],
    ),
    (
        "nested_update",
        [
            "config = {'db': {'host': 'x', 'port': 5432}, 'debug': False}",
            "config['db'].update(port=6543, user='app')\nconfig['debug'] = True\nconfig",
        ],
    ),
    (
        "list_ops",
        [
            "xs = list(range(20))\nevens = xs[::2]\nodds = [x for x in xs if x % 2]",
            "xs.extend([100, 200])\nxs.remove(0)\n(len(xs), evens[-1], sum(odds), xs[-2:])",
        ],
    ),
    (
        "dict_merge_and_invert",
        [
            "a = {'x': 1, 'y': 2}\nb = {'y': 3, 'z': 4}\nmerged = a | b",
            "inverted = {v: k for k, v in merged.items()}\n(merged, inverted)",
        ],
    ),
    (
        "group_by_day",
        [
            "rows = get_orders()\ndays = {}\nfor r in rows:\n    days[r['day']] = days.get(r['day'], 0) + r['total']",
            "best = max(days, key=days.get)\n(best, days[best], len(days))",
        ],
    ),
    (
        "matrix_transpose",
        [
            "m = [[1, 2, 3], [4, 5, 6]]\nt = [list(col) for col in zip(*m)]",
            "t.append([7, 8])\n(t, [sum(r) for r in m])",
        ],
    ),
    (
        "set_algebra",
        [
            "seen = {'a', 'b', 'c'}\nnew = {'c', 'd'}",
            "seen |= new\n(sorted(seen), sorted(seen & {'a', 'z'}), sorted(new - {'c'}))",
            "frozen = frozenset(seen)\nlen(frozen), 'd' in frozen",
        ],
    ),
    (
        "tuple_records",
        [
            "people = [('ann', 31), ('bob', 25), ('cid', 40)]\nages = dict(people)",
            "oldest = max(people, key=lambda p: p[1])\n(oldest, ages['bob'], sorted(people)[0])",
        ],
    ),
    (
        "dedupe_preserve_order",
        [
            "words = 'the cat and the hat and the bat'.split()\nuniq = list(dict.fromkeys(words))",
            "uniq",
        ],
    ),
    (
        "chunking",
        [
            "data = list(range(11))\nchunks = [data[i:i + 4] for i in range(0, len(data), 4)]",
            "[sum(c) for c in chunks]",
        ],
    ),
]

COLLECTIONS: list[C] = [
    (
        "counter_words",
        [
            "import collections\ntext = 'a b a c b a d'\ncounts = collections.Counter(text.split())",
            "counts.update(['d', 'd'])\ncounts.most_common(2)",
        ],
    ),
    (
        "defaultdict_groups",
        [
            "from collections import defaultdict\ngroups = defaultdict(list)\n"
            "for n in range(10):\n    groups[n % 3].append(n)",
            "groups[5].append(99)\ndict(groups)",
        ],
    ),
    (
        "deque_window",
        [
            "from collections import deque\nwindow = deque(maxlen=3)\nfor x in [1, 2, 3, 4]:\n    window.append(x)",
            "window.appendleft(0)\nlist(window)",
        ],
    ),
    (
        "ordered_dict_lru",
        [
            "from collections import OrderedDict\ncache = OrderedDict()\nfor k in 'abcd':\n    cache[k] = ord(k)",
            "cache.move_to_end('a')\ncache.popitem(last=False)\nlist(cache.items())",
        ],
    ),
    (
        "chainmap_settings",
        [
            "import collections\ndefaults = {'color': 'red', 'size': 1}\nuser = {'size': 3}\n"
            "settings = collections.ChainMap(user, defaults)",
            "(settings['color'], settings['size'], len(settings))",
        ],
    ),
    (
        "counter_arithmetic",
        [
            "from collections import Counter\nstock = Counter(apples=5, pears=2)\nsold = Counter(apples=2, pears=2)",
            "left = stock - sold\n(dict(left), sum(stock.values()))",
        ],
    ),
    (
        "heap_tasks",
        [
            "import heapq\ntasks = []\nfor p, name in [(3, 'c'), (1, 'a'), (2, 'b')]:\n    heapq.heappush(tasks, (p, name))",
            "heapq.heappush(tasks, (0, 'urgent'))\n[heapq.heappop(tasks)[1] for _ in range(len(tasks))]",
        ],
    ),
    (
        "bisect_grades",
        [
            "import bisect\nbreaks = [60, 70, 80, 90]\ngrades = 'FDCBA'\n"
            "def grade(score):\n    return grades[bisect.bisect(breaks, score)]",
            "[grade(s) for s in [33, 99, 77, 70, 89, 90, 100]]",
        ],
    ),
]

DATES: list[C] = [
    (
        "date_arith",
        [
            "import datetime\nstart = datetime.date(2024, 1, 31)\nend = start + datetime.timedelta(days=30)",
            "(end.isoformat(), (end - start).days, end.weekday())",
        ],
    ),
    (
        "strptime_parse",
        [
            "from datetime import datetime\nstamps = ['2024-03-01 08:15', '2024-03-01 17:45']\n"
            "parsed = [datetime.strptime(s, '%Y-%m-%d %H:%M') for s in stamps]",
            "worked = parsed[1] - parsed[0]\nworked.total_seconds() / 3600",
        ],
    ),
    (
        "date_replace_and_format",
        [
            "import datetime\nd = datetime.date(2023, 5, 17)",
            "first = d.replace(day=1)\n(first.strftime('%d %b %Y'), d.isocalendar()[1])",
        ],
    ),
    (
        "month_buckets",
        [
            "import datetime\ndays = [datetime.date(2024, m, 15) for m in (1, 1, 2, 3, 3, 3)]\n"
            "buckets = {}\nfor d in days:\n    buckets[d.strftime('%Y-%m')] = buckets.get(d.strftime('%Y-%m'), 0) + 1",
            "buckets",
        ],
    ),
    (
        "timedelta_sum",
        [
            "import datetime\nlaps = [datetime.timedelta(minutes=m, seconds=s) for m, s in [(4, 5), (3, 59), (4, 30)]]",
            "total = sum(laps, datetime.timedelta())\n(str(total), min(laps) < max(laps))",
        ],
    ),
    (
        "datetime_values_cross",
        [
            "import datetime\nmeeting = datetime.datetime(2024, 6, 3, 14, 30)\nreminder = meeting - datetime.timedelta(hours=1)",
            "(meeting, reminder.time(), reminder.date())",
        ],
    ),
    (
        "calendar_month",
        [
            "import calendar\nweeks = calendar.monthcalendar(2024, 2)",
            "(len(weeks), calendar.isleap(2024), calendar.month_name[2])",
        ],
    ),
    (
        "iso_week_report",
        [
            "import datetime\nd = datetime.date.fromisoformat('2024-12-30')\nyear, week, wd = d.isocalendar()",
            "(year, week, wd)",
        ],
    ),
]

NUMBERS: list[C] = [
    (
        "decimal_invoice",
        [
            "from decimal import Decimal, ROUND_HALF_UP\nlines = [Decimal('19.99'), Decimal('5.01'), Decimal('0.333')]",
            "total = sum(lines)\n(total, total.quantize(Decimal('0.01'), rounding=ROUND_HALF_UP))",
        ],
    ),
    (
        "decimal_context",
        [
            "import decimal\nrate = decimal.Decimal('0.0425')\nprincipal = decimal.Decimal(1000)",
            "interest = (principal * rate).quantize(decimal.Decimal('0.01'))\ninterest",
        ],
    ),
    (
        "fractions_exact",
        [
            "from fractions import Fraction\nparts = [Fraction(1, 3), Fraction(1, 6)]",
            "s = sum(parts)\n(s.numerator, s.denominator, float(s))",
        ],
    ),
    (
        "math_stats",
        [
            "import math\nvals = [2.0, 4.0, 8.0]\ngeo = math.prod(vals) ** (1 / len(vals))",
            "(round(geo, 6), math.isclose(geo, 4.0), math.gcd(12, 18), math.comb(5, 2))",
        ],
    ),
    (
        "complex_and_ranges",
        [
            "z = complex(3, 4)\nr = range(0, 30, 7)",
            "(abs(z), z.conjugate(), list(r), r)",
        ],
    ),
    (
        "seeded_random",
        [
            "import random\nrng = random.Random(7)\nsample = rng.sample(range(100), 5)",
            "(len(sample), sorted(sample) == sorted(set(sample)), rng.random() < 1)",
        ],
    ),
]

CLASSES: list[C] = [
    (
        "dataclass_inventory",
        [
            "from dataclasses import dataclass, field\n@dataclass\nclass Item:\n    name: str\n    qty: int = 0\n"
            "    tags: list = field(default_factory=list)\n\ninv = [Item('pen', 3), Item('ink', 0, ['low'])]",
            "inv.append(Item('pad', 7))\n[i.name for i in inv if i.qty]",
            "import dataclasses\n[dataclasses.asdict(i) for i in inv][1]",
        ],
    ),
    (
        "frozen_dataclass_ordering",
        [
            "import dataclasses\n@dataclasses.dataclass(frozen=True, order=True)\nclass Version:\n    major: int\n"
            "    minor: int\nvs = [Version(1, 2), Version(0, 9), Version(1, 0)]",
            "[(v.major, v.minor) for v in sorted(vs)]",
        ],
    ),
    (
        "dataclass_replace_and_fields",
        [
            "from dataclasses import dataclass, replace, fields\n@dataclass\nclass P:\n    x: int\n    y: int",
            "p = replace(P(1, 2), y=5)\n(p.y, [f.name for f in fields(P)], P.__annotations__ == {'x': int, 'y': int})",
        ],
    ),
    (
        "class_with_methods_next_turn",
        [
            "class Account:\n    def __init__(self, owner):\n        self.owner = owner\n        self.balance = 0\n"
            "    def deposit(self, amount):\n        self.balance += amount\n        return self.balance\n\n"
            "acct = Account('ana')\nacct.deposit(50)",
            "acct.deposit(25)\n(acct.owner, acct.balance)",
        ],
    ),
    (
        "inheritance_and_super",
        [
            "class Shape:\n    def area(self):\n        return 0\n    def describe(self):\n"
            "        return f'{type(self).__name__} with area {self.area():.1f}'\n"
            "class Circle(Shape):\n    def __init__(self, r):\n        self.r = r\n    def area(self):\n"
            "        return 3.14159 * self.r ** 2\n"
            "class Square(Shape):\n    def __init__(self, s):\n        super().__init__()\n        self.s = s\n"
            "    def area(self):\n        return self.s ** 2",
            "shapes = [Circle(1), Square(2)]\n[s.describe() for s in shapes]",
            "[c.__name__ for c in Square.__mro__]",
        ],
    ),
    (
        "properties_and_dunder",
        [
            "class Temp:\n    def __init__(self, c):\n        self._c = c\n    @property\n    def f(self):\n"
            "        return self._c * 9 / 5 + 32\n    def __repr__(self):\n        return f'Temp({self._c})'\n"
            "    def __lt__(self, other):\n        return self._c < other._c\nts = [Temp(30), Temp(-5), Temp(12)]",
            "(repr(min(ts)), [t.f for t in sorted(ts)])",
        ],
    ),
    (
        "closures_counter",
        [
            "def make_counter(start=0):\n    n = start\n    def inc(step=1):\n        nonlocal n\n        n += step\n"
            "        return n\n    return inc\ncounter = make_counter(10)\ncounter()",
            "counter(5)\ncounter()",
        ],
    ),
    (
        "function_defined_then_used",
        [
            "def normalize(name):\n    return ' '.join(part.capitalize() for part in name.split())",
            "[normalize(n) for n in ['ada lovelace', 'ALAN   turing']]",
        ],
    ),
    (
        "global_rebinding_seen_by_function",
        [
            "RATE = 0.1\ndef tax(x):\n    return round(x * RATE, 2)",
            "RATE = 0.2\ntax(100)",
        ],
    ),
    (
        "slots_class",
        [
            "class Point:\n    __slots__ = ('x', 'y')\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n"
            "pts = [Point(i, i * i) for i in range(4)]",
            "([p.y for p in pts], Point.__slots__)",
        ],
    ),
    (
        "instance_dict_introspection",
        [
            "class Config:\n    def __init__(self, **kw):\n        self.__dict__.update(kw)\ncfg = Config(a=1, b='two')",
            "cfg.c = 3\nsorted(vars(cfg)), cfg.__dict__['b']",
        ],
    ),
    (
        "abstract_base",
        [
            "import abc\nclass Source(abc.ABC):\n    @abc.abstractmethod\n    def read(self): ...\n"
            "class Fixed(Source):\n    def read(self):\n        return [1, 2]",
            "try:\n    Source()\n    ok = False\nexcept TypeError:\n    ok = True\n(ok, Fixed().read())",
        ],
    ),
    (
        "class_attrs_and_classmethod",
        [
            "class Registry:\n    items = []\n    @classmethod\n    def add(cls, x):\n        cls.items.append(x)\n"
            "        return len(cls.items)\n    @staticmethod\n    def norm(x):\n        return x.strip().lower()\n"
            "Registry.add(Registry.norm('  A '))",
            "Registry.add('b')\nRegistry.items",
        ],
    ),
]

NAMEDTUPLES_ENUMS: list[C] = [
    (
        "namedtuple_records",
        [
            "from collections import namedtuple\nRow = namedtuple('Row', ['city', 'pop'])\n"
            "rows = [Row('Oslo', 700), Row('Lima', 10000)]",
            "big = [r._replace(pop=r.pop * 2) for r in rows]\n([r._asdict() for r in big], Row._fields)",
        ],
    ),
    (
        "typing_namedtuple",
        [
            "from typing import NamedTuple\nclass Reading(NamedTuple):\n    sensor: str\n    value: float\n"
            "    unit: str = 'C'\nr = Reading('t1', 21.5)",
            "(r, r.unit, Reading._make(['t2', 3.0, 'F']).unit, Reading._field_defaults)",
        ],
    ),
    (
        "enum_states",
        [
            "import enum\nclass State(enum.Enum):\n    NEW = 1\n    DONE = 2\ncurrent = State.NEW",
            "current = State(2)\n(current.name, current.value, [s.name for s in State])",
        ],
    ),
    (
        "intflag_permissions",
        [
            "from enum import IntFlag, auto\nclass Perm(IntFlag):\n    R = auto()\n    W = auto()\n    X = auto()\n"
            "p = Perm.R | Perm.W",
            "(int(p), Perm.W in p, Perm.X in p)",
        ],
    ),
    (
        "str_enum_lookup",
        [
            "import enum\nclass Color(str, enum.Enum):\n    RED = 'red'\n    BLUE = 'blue'",
            "(Color('red').name, Color.BLUE.value.upper(), Color.RED == 'red')",
        ],
    ),
]

ITERATION: list[C] = [
    (
        "generator_pipeline",
        [
            "def evens(n):\n    for i in range(n):\n        if i % 2 == 0:\n            yield i\n"
            "total = sum(x * x for x in evens(10))\ntotal",
            "list(evens(7))",
        ],
    ),
    (
        "itertools_groupby",
        [
            "import itertools\ndata = sorted(['apple', 'avocado', 'banana', 'blueberry', 'cherry'], key=lambda w: w[0])\n"
            "groups = {k: list(g) for k, g in itertools.groupby(data, key=lambda w: w[0])}",
            "{k: len(v) for k, v in groups.items()}",
        ],
    ),
    (
        "itertools_combinatorics",
        [
            "from itertools import combinations, permutations, product, accumulate, chain\n"
            "pairs = list(combinations('abc', 2))",
            "(pairs, len(list(permutations(range(4), 2))), list(product([0, 1], repeat=2))[-1], "
            "list(accumulate([1, 2, 3])), list(chain([1], [2, 3])))",
        ],
    ),
    (
        "itertools_islice_count",
        [
            "import itertools\nsquares = [n * n for n in itertools.islice(itertools.count(1), 5)]",
            "(squares, list(itertools.pairwise(squares)))",
        ],
    ),
    (
        "generator_send",
        [
            "def running_avg():\n    total = count = 0\n    avg = None\n    while True:\n        x = yield avg\n"
            "        total += x\n        count += 1\n        avg = total / count\n"
            "g = running_avg()\nnext(g)\nout = [g.send(v) for v in [10, 20, 60]]\nout",
            "def first(n, it):\n    return [v for _, v in zip(range(n), it)]\nfirst(2, iter(out))",
        ],
    ),
    (
        "enumerate_zip_sorted",
        [
            "names = ['c', 'a', 'b']\nscores = [3, 9, 5]\nranked = sorted(zip(scores, names), reverse=True)",
            "[(i, n) for i, (s, n) in enumerate(ranked, 1)]",
        ],
    ),
]

ASYNC: list[C] = [
    (
        "gather_prices",
        [
            "import asyncio\nsymbols = ['AAPL', 'MSFT', 'NVDA']\n"
            "prices = dict(zip(symbols, await asyncio.gather(*(fetch_price(s) for s in symbols))))",
            "max(prices, key=prices.get), round(sum(prices.values()), 2)",
        ],
    ),
    (
        "gather_weather",
        [
            "import asyncio\ncities = ['Berlin', 'Rome', 'Bonn']\n"
            "reports = await asyncio.gather(*[fetch_weather(c) for c in cities])",
            "[r['city'] for r in reports if r['rain']]",
        ],
    ),
    (
        "asyncio_run_main",
        [
            "import asyncio\nasync def main():\n    a, b = await asyncio.gather(fetch_price('AAPL'), fetch_price('MSFT'))\n"
            "    return b - a\ndiff = asyncio.run(main())\ndiff",
            "round(diff * 2, 2)",
        ],
    ),
    (
        "async_def_reused",
        [
            "import asyncio\nasync def total_value(holdings):\n"
            "    prices = await asyncio.gather(*(fetch_price(s) for s in holdings))\n"
            "    return sum(p * holdings[s] for p, s in zip(prices, holdings))",
            "await total_value({'AAPL': 2, 'NVDA': 1})",
        ],
    ),
    (
        "queue_within_turn",
        [
            "import asyncio\nasync def pipeline(n):\n    q = asyncio.Queue()\n    for i in range(n):\n"
            "        await q.put(i)\n    out = []\n    while not q.empty():\n        out.append(await q.get())\n"
            "    return out\nresult = await pipeline(4)\nresult",
            "sum(result)",
        ],
    ),
    (
        "semaphore_within_turn",
        [
            "import asyncio\nasync def limited(sem, s):\n    async with sem:\n        return await fetch_price(s)\n"
            "async def main():\n    sem = asyncio.Semaphore(2)\n"
            "    return await asyncio.gather(*(limited(sem, s) for s in ['AAPL', 'MSFT', 'NVDA']))\n"
            "vals = await main()",
            "len(vals), min(vals)",
        ],
    ),
    (
        "event_and_tasks",
        [
            "import asyncio\nasync def main():\n    ev = asyncio.Event()\n    got = []\n"
            "    async def waiter():\n        await ev.wait()\n        got.append('woke')\n"
            "    t = asyncio.create_task(waiter())\n    await asyncio.sleep(0)\n    ev.set()\n    await t\n    return got\n"
            "res = await main()",
            "res * 2",
        ],
    ),
    (
        "wait_for_timeout",
        [
            "import asyncio\nasync def slow():\n    await asyncio.sleep(5)\n"
            "try:\n    await asyncio.wait_for(slow(), timeout=0.01)\n    outcome = 'done'\nexcept TimeoutError:\n"
            "    outcome = 'timed out'\noutcome",
            "outcome.upper()",
        ],
    ),
    (
        "sync_and_async_tools",
        [
            "orders = get_orders()\nhits = search('pens', limit=2)\nlen(orders), hits",
            "import asyncio\nprice = await fetch_price('AAPL')\n(price, hits[0])",
        ],
    ),
]

TEXT_IO: list[C] = [
    (
        "csv_from_string",
        [
            f"import csv, io\ntext = '{CSV_TEXT}'\nrows = list(csv.DictReader(io.StringIO(text)))\nlen(rows)",
            "by_dept = {}\nfor r in rows:\n    by_dept.setdefault(r['dept'], []).append(int(r['salary']))\n"
            "{d: sum(v) / len(v) for d, v in by_dept.items()}",
        ],
    ),
    (
        "csv_write_to_string",
        [
            "import csv, io\nbuf = io.StringIO()\nw = csv.writer(buf)\nw.writerow(['a', 'b'])\n"
            "w.writerows([[1, 2], [3, 4]])\nout = buf.getvalue()\nout",
            "out.splitlines()",
        ],
    ),
    (
        "stringio_report",
        [
            "import io\nreport = io.StringIO()\nfor i in range(3):\n    print(f'line {i}', file=report)\n"
            "text = report.getvalue()",
            "text.count('line'), text.splitlines()[-1]",
        ],
    ),
    (
        "json_roundtrip",
        [
            "import json\npayload = json.dumps({'b': [1, 2], 'a': {'x': None}}, sort_keys=True)\npayload",
            "data = json.loads(payload)\ndata['b'].append(3)\njson.dumps(data, indent=1).count('\\n')",
        ],
    ),
    (
        "json_nested_query",
        [
            'import json\ndoc = json.loads(\'{"users": [{"name": "a", "age": 30}, {"name": "b", "age": 20}]}\')',
            "[u['name'] for u in doc['users'] if u['age'] > 25]",
        ],
    ),
    (
        "print_output",
        [
            "for i in range(3):\n    print('row', i, sep='-')",
            "print('done', end='!')\nprint()",
        ],
    ),
]

STRINGS: list[C] = [
    (
        "regex_extract",
        [
            "import re\nlog = 'ERROR 12:01 disk full; WARN 12:05 cpu; ERROR 13:00 net down'\n"
            "errors = re.findall(r'ERROR (\\d\\d:\\d\\d) ([^;]+)', log)",
            "[(t, msg.strip()) for t, msg in errors]",
        ],
    ),
    (
        "regex_compiled_reuse",
        [
            "import re\nEMAIL = re.compile(r'[\\w.]+@([\\w.]+)')\ntexts = ['mail a.b@x.org now', 'none', 'c@y.com']",
            "[m.group(1) for t in texts if (m := EMAIL.search(t))]",
        ],
    ),
    (
        "regex_sub_and_split",
        [
            "import re\ns = 'a1b22c333'\nparts = re.split(r'\\d+', s)",
            "(parts, re.sub(r'(\\d+)', lambda m: f'<{len(m.group(1))}>', s))",
        ],
    ),
    (
        "string_formatting",
        [
            "rows = [('apple', 1.5, 3), ('kiwi', 0.25, 12)]\n"
            "lines = [f'{name:<8}{price:>6.2f}{qty:>4d}' for name, price, qty in rows]",
            "'\\n'.join(lines)",
            "'{:,.1f}% of {}'.format(12345.678, 'total'), '%05.1f|%s' % (3.14159, 'x')",
        ],
    ),
    (
        "str_methods",
        [
            "s = '  Hello, World  '\nclean = s.strip().lower().replace(',', '')",
            "(clean, clean.title(), clean.split(), 'world' in clean, clean.center(15, '*'))",
        ],
    ),
    (
        "textwrap_and_difflib",
        [
            "import textwrap, difflib\nbody = 'The quick brown fox jumps over the lazy dog ' * 2\n"
            "wrapped = textwrap.wrap(body, width=30)",
            "(len(wrapped), difflib.get_close_matches('appel', ['ape', 'apple', 'peach']))",
        ],
    ),
    (
        "string_module_template",
        [
            "import string\nt = string.Template('Hi $name, you owe $$${amount}')",
            "t.substitute(name='Bo', amount=5), string.ascii_lowercase[:5]",
        ],
    ),
    (
        "unicodedata_normalize",
        [
            "import unicodedata\nnames = ['Jos\\u00e9', 'Jose\\u0301']\n"
            "norm = [unicodedata.normalize('NFC', n) for n in names]",
            "norm[0] == norm[1], len(names[1]), unicodedata.name('\\u00e9')",
        ],
    ),
    (
        "hashing_and_encoding",
        [
            "import hashlib, base64, hmac\ndigest = hashlib.sha256(b'data').hexdigest()\n"
            "sig = hmac.new(b'key', b'data', hashlib.sha256).digest()",
            "(digest[:10], base64.b64encode(sig)[:8], base64.urlsafe_b64decode(base64.urlsafe_b64encode(b'xy')))",
        ],
    ),
    (
        "uuid_and_struct",
        [
            "import uuid, struct\nu = uuid.UUID('12345678-1234-5678-1234-567812345678')\n"
            "packed = struct.pack('<IH', 7, 3)",
            "(str(u)[:8], u.version, struct.unpack('<IH', packed), len(packed))",
        ],
    ),
    (
        "pprint_format",
        [
            "import pprint\nnested = {'a': list(range(3)), 'b': {'c': 'd'}}",
            "pprint.pformat(nested, width=20)",
        ],
    ),
]

STDLIB: list[C] = [
    (
        "statistics_summary",
        [
            "import statistics\nsamples = [2.5, 3.1, 4.7, 3.9, 2.2, 5.0]",
            "(statistics.mean(samples), statistics.median(samples), round(statistics.stdev(samples), 4))",
            "statistics.mode([1, 2, 2, 3]), statistics.quantiles(samples, n=4)",
        ],
    ),
    (
        "lru_cache_fib",
        [
            "import functools\n@functools.lru_cache(maxsize=None)\ndef fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"
            "fib(30)",
            "fib(60), fib.cache_info().hits > 0",
        ],
    ),
    (
        "functools_partial_reduce",
        [
            "import functools, operator\npow2 = functools.partial(pow, 2)\n"
            "product = functools.reduce(operator.mul, range(1, 6))",
            "(pow2(10), product, sorted(['b', 'A', 'c'], key=str.lower))",
        ],
    ),
    (
        "operator_getters",
        [
            "import operator\nrows = [{'n': 'b', 'v': 2}, {'n': 'a', 'v': 3}]\nby_v = sorted(rows, key=operator.itemgetter('v'))",
            "[r['n'] for r in by_v], list(map(operator.methodcaller('upper'), ['x', 'y']))",
        ],
    ),
    (
        "copy_deep",
        [
            "import copy\norig = {'a': [1, 2], 'b': {'c': [3]}}\nclone = copy.deepcopy(orig)\nclone['a'].append(9)",
            "orig['a'], clone['a'], copy.copy(orig)['b'] is orig['b']",
        ],
    ),
    (
        "graphlib_order",
        [
            "import graphlib\ndeps = {'deploy': {'test', 'build'}, 'test': {'build'}, 'build': set()}\n"
            "order = list(graphlib.TopologicalSorter(deps).static_order())",
            "order",
        ],
    ),
    (
        "contextlib_suppress",
        [
            "import contextlib\nresults = []\nfor v in ['1', 'x', '3']:\n    with contextlib.suppress(ValueError):\n"
            "        results.append(int(v))",
            "results",
        ],
    ),
    (
        "typing_annotations",
        [
            "from typing import Optional\ndef find(items: list[str], key: str) -> Optional[int]:\n"
            "    return items.index(key) if key in items else None",
            "(find(['a', 'b'], 'b'), find([], 'z'), sorted(find.__annotations__))",
        ],
    ),
    (
        "globals_dynamic_names",
        [
            "for name in ['alpha', 'beta']:\n    globals()[name] = len(name)",
            "alpha + beta, sorted(k for k in globals() if k in ('alpha', 'beta'))",
        ],
    ),
    (
        "zoneinfo_convert",
        [
            "from zoneinfo import ZoneInfo\nimport datetime\n"
            "utc_time = datetime.datetime(2024, 3, 10, 12, 0, tzinfo=datetime.timezone.utc)\n"
            "ny = utc_time.astimezone(ZoneInfo('America/New_York'))\nny.isoformat()",
            "ny.utcoffset().total_seconds() / 3600, ny.hour",
        ],
    ),
    (
        "zoneinfo_across_turns",
        [
            "from zoneinfo import ZoneInfo\ntz = ZoneInfo('Europe/Berlin')",
            "import datetime\ndatetime.datetime(2024, 1, 1, 12, tzinfo=tz).isoformat()",
        ],
    ),
    (
        "ipaddress_and_fnmatch",
        [
            "import ipaddress, fnmatch\nnet = ipaddress.ip_network('192.168.0.0/29')\nhosts = [str(h) for h in net.hosts()]",
            "(len(hosts), fnmatch.filter(['a.csv', 'b.json', 'c.csv'], '*.csv'))",
        ],
    ),
]

ERRORS: list[C] = [
    (
        "try_except_recover",
        [
            "def parse(v):\n    try:\n        return int(v)\n    except ValueError as e:\n        return f'bad: {e}'",
            "[parse(v) for v in ['3', 'x']]",
        ],
    ),
    (
        "custom_exception",
        [
            "class QuotaError(Exception):\n    def __init__(self, used):\n        super().__init__(f'used {used}')\n"
            "        self.used = used",
            "try:\n    raise QuotaError(7)\nexcept QuotaError as e:\n    caught = (str(e), e.used)\ncaught",
        ],
    ),
    (
        "error_then_continue",
        [
            "data = {'a': 1}",
            "data['missing']",
            "data['b'] = 2\nsorted(data)",
        ],
    ),
    (
        "finally_and_else",
        [
            "log = []\ntry:\n    x = 1 / 1\nexcept ZeroDivisionError:\n    log.append('err')\nelse:\n    log.append('ok')\n"
            "finally:\n    log.append('end')",
            "log",
        ],
    ),
    (
        "exception_groups",
        [
            "try:\n    raise ExceptionGroup('many', [ValueError('a'), TypeError('b')])\nexcept* ValueError as eg:\n"
            "    got = [str(e) for e in eg.exceptions]\nexcept* TypeError:\n    got2 = 'type'",
            "got, got2",
        ],
    ),
    (
        "traceback_text",
        [
            "import traceback\ntry:\n    {}['k']\nexcept KeyError:\n    text = traceback.format_exc()",
            "'KeyError' in text",
        ],
    ),
    (
        "raise_in_second_turn",
        [
            "limit = 3",
            "if limit < 5:\n    raise ValueError(f'limit too low: {limit}')",
            "limit = 10\nlimit",
        ],
    ),
]

DATA_LIBS: list[C] = [
    (
        "numpy_basics",
        [
            "import numpy as np\na = np.arange(12).reshape(3, 4)",
            "(a.sum(axis=0).tolist(), float(a.mean()), a.shape)",
        ],
    ),
    (
        "numpy_array_survives",
        [
            "import numpy as np\nrng = np.random.default_rng(0)\nweights = rng.normal(size=5)",
            "weights *= 2\nweights.shape, bool(np.isfinite(weights).all())",
        ],
    ),
    (
        "numpy_scalars_cross",
        [
            "import numpy as np\nx = np.array([1.5, 2.5, 4.0])",
            "{'mean': x.mean(), 'max': x.max(), 'n': x.size}",
        ],
    ),
    (
        "pandas_groupby",
        [
            f"import pandas as pd, io\ndf = pd.read_csv(io.StringIO('{CSV_TEXT}'))",
            "df.groupby('dept')['salary'].mean().to_dict()",
            "df['bonus'] = df['salary'] * 0.1\nround(float(df['bonus'].sum()), 2)",
        ],
    ),
    (
        "pandas_dates",
        [
            "import pandas as pd\ns = pd.Series(pd.to_datetime(['2024-01-05', '2024-02-10', '2024-02-20']))",
            "s.dt.month.value_counts().sort_index().to_dict()",
        ],
    ),
    (
        "pandas_merge",
        [
            "import pandas as pd\nleft = pd.DataFrame({'k': [1, 2, 3], 'a': ['x', 'y', 'z']})\n"
            "right = pd.DataFrame({'k': [2, 3, 4], 'b': [20, 30, 40]})",
            "m = left.merge(right, on='k', how='inner')\nm.to_dict(orient='records')",
        ],
    ),
    (
        "pandas_version_and_describe",
        [
            "import pandas as pd\nok = isinstance(pd.__version__, str)\ndf = pd.DataFrame({'v': [1.0, 2.0, 3.0, 4.0]})",
            "ok, df.describe().loc['mean', 'v']",
        ],
    ),
    (
        "pandas_pivot",
        [
            "import pandas as pd\nsales = pd.DataFrame({'region': ['n', 'n', 's', 's'], 'q': [1, 2, 1, 2], "
            "'amt': [10, 20, 30, 40]})",
            "pv = sales.pivot_table(index='region', columns='q', values='amt', aggfunc='sum')\n"
            "{r: [int(v) for v in row] for r, row in zip(pv.index, pv.values)}",
        ],
    ),
]

CHECKPOINT_SIDE: list[C] = [
    (
        "semaphore_across_turns",
        [
            "import asyncio\nsem = asyncio.Semaphore(2)\nresults = ['kept']",
            "async def limited(s):\n    async with sem:\n        return await fetch_price(s)\n"
            "results.append(await limited('AAPL'))\nresults",
        ],
    ),
    (
        "queue_across_turns",
        [
            "import asyncio\nq = asyncio.Queue()\nq.put_nowait('job-1')\nafter = 'still here'",
            "(q.qsize(), q.get_nowait(), after)",
        ],
    ),
    (
        "lock_and_event_across_turns",
        [
            "import asyncio\nlock = asyncio.Lock()\nready = asyncio.Event()\nnotes = ['x']",
            "async with lock:\n    ready.set()\n(ready.is_set(), notes)",
        ],
    ),
    (
        "stringio_across_turns",
        [
            "import io\nbuf = io.StringIO()\nbuf.write('first line\\n')\ncount = 1",
            "buf.write('second line\\n')\n(buf.getvalue().splitlines(), count)",
        ],
    ),
    (
        "generator_kept_variable",
        [
            "def gen():\n    yield from range(3)\nit = gen()\nfirst = next(it)\nother = 'kept'",
            "(first, other)",
        ],
    ),
]

CORPUS: list[C] = [
    *WRANGLING,
    *COLLECTIONS,
    *DATES,
    *NUMBERS,
    *CLASSES,
    *NAMEDTUPLES_ENUMS,
    *ITERATION,
    *ASYNC,
    *TEXT_IO,
    *STRINGS,
    *STDLIB,
    *ERRORS,
    *DATA_LIBS,
    *CHECKPOINT_SIDE,
]
