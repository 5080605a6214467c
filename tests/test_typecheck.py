"""Type checking of scripts against host stubs, with the real ty."""

from __future__ import annotations

import asyncio
import collections
import datetime
import math
import textwrap
from typing import Any, Literal, NotRequired, TypedDict

import pytest

from snapcell.errors import ConfigError, TypingError
from snapcell.typecheck import Diagnostic, TypeChecker, declarations_from_namespace, find_ty, stubs_from_functions

STUBS = """
from typing import TypedDict
class Customer(TypedDict):
    id: str
    name: str
    churned_at: str | None
def list_customers() -> list[Customer]: ...
async def list_open_tickets(customer_id: str) -> list[dict[str, str]]: ...
"""

GOOD = """
customers = list_customers()
churned = [c for c in customers if c["churned_at"]]
tickets = await asyncio.gather(*[list_open_tickets(c["id"]) for c in churned])
summary = {c["name"]: len(t) for c, t in zip(churned, tickets)}
summary
"""


@pytest.fixture(scope="module")
def checker() -> Any:
    tc = TypeChecker(STUBS)
    yield tc
    tc.close()


def errors(found: list[Diagnostic]) -> list[Diagnostic]:
    return [d for d in found if d.severity == "error"]


def test_correct_script_passes(checker: TypeChecker) -> None:
    assert errors(checker.check(GOOD)) == []
    assert checker.check_or_raise(GOOD) == []


def test_top_level_async_forms_pass(checker: TypeChecker) -> None:
    code = """
    import asyncio
    results = await asyncio.gather(*[list_open_tickets(c["id"]) for c in list_customers()])
    firsts = [await list_open_tickets(c["id"]) for c in list_customers()[:2]]
    async def gen():
        yield 1
    async for item in gen():
        print(item)
    lock = asyncio.Lock()
    async with lock:
        pass
    """
    assert errors(checker.check(textwrap.dedent(code))) == []


def test_wrong_argument_type_reported_at_its_line(checker: TypeChecker) -> None:
    code = 'name = "x"\nx = await list_open_tickets(42)\n'
    [diag] = errors(checker.check(code))
    assert (diag.code, diag.line, diag.column) == ("invalid-argument-type", 2, 29)
    assert "Expected `str`" in diag.message
    assert diag.source_line == "x = await list_open_tickets(42)"
    assert diag.stub_note == "async def list_open_tickets(customer_id: str) -> list[dict[str, str]]: ..."


def test_wrong_attribute_and_key_on_stub_type_reported(checker: TypeChecker) -> None:
    code = 'first = list_customers()[0]\nprint(first["nmae"])\nprint(first.name)\n'
    found = errors(checker.check(code))
    assert [(d.code, d.line) for d in found] == [("invalid-typed-dict-key", 2), ("missing-attribute", 3)]
    assert "nmae" in found[0].message
    assert found[0].stub_note == "class Customer(TypedDict):"


def test_unknown_name_reported(checker: TypeChecker) -> None:
    [diag] = errors(checker.check("rows = list_customers()\nprint(list_clients())\n"))
    assert (diag.code, diag.line, diag.column) == ("unresolved-reference", 2, 7)
    assert "list_clients" in diag.message


def test_awaiting_sync_function_reported(checker: TypeChecker) -> None:
    [diag] = errors(checker.check("rows = await list_customers()"))
    assert (diag.code, diag.line, diag.column) == ("invalid-await", 1, 14)


def test_real_syntax_error_still_reported(checker: TypeChecker) -> None:
    found = errors(checker.check("x = (1,\n"))
    assert found and found[0].code == "invalid-syntax"


def test_prior_cells_make_names_known(checker: TypeChecker) -> None:
    turn1 = GOOD + "\n_private = 3\nimport math as m\ndef count(xs: list[str]) -> int:\n    return len(xs)\n"
    turn2 = "print(churned[0]['name'], summary, _private + 1, m.pi, count(['a']))\n"
    assert errors(checker.check(turn2)) != []
    assert errors(checker.check(turn2, prior_cells=[turn1])) == []
    [diag] = errors(checker.check("count([1])", prior_cells=[turn1]))
    assert (diag.code, diag.line) == ("invalid-argument-type", 1)


def test_prior_cells_diagnostics_are_ignored(checker: TypeChecker) -> None:
    broken_earlier = "a = 1\nb = await list_customers()\n"
    assert errors(checker.check("print(a)", prior_cells=[broken_earlier])) == []


def test_comprehension_variable_of_prior_cell_is_not_a_name(checker: TypeChecker) -> None:
    [diag] = errors(checker.check("print(item)", prior_cells=["xs = [item for item in range(3)]"]))
    assert diag.code == "unresolved-reference"


def test_declarations_from_namespace_make_names_known(checker: TypeChecker) -> None:
    class Account:
        pass

    def scale(x: float, *, factor: int = 2) -> float:
        return x * factor

    ns: dict[str, object] = {
        "__builtins__": {},
        "churned": [{"id": "a", "n": 1}, {"id": "b", "n": 2}],
        "count": 3,
        "ratio": 0.5,
        "flag": True,
        "nothing": None,
        "pair": (1, "a"),
        "tags": {"x", "y"},
        "math": math,
        "sqrt": math.sqrt,
        "Account": Account,
        "acct": Account(),
        "scale": scale,
        "od": collections.OrderedDict(),
        "_hidden": "s",
    }
    decls = declarations_from_namespace(ns)
    assert decls == declarations_from_namespace(dict(reversed(ns.items())))
    assert "churned: list[dict[str, Any]]" in decls
    assert "def scale(x: float, *, factor: int = ...) -> float: ..." in decls
    assert "__builtins__" not in decls
    code = (
        "print(churned[0]['id'], count + 1, ratio * 2, flag, nothing, pair[1].upper(), tags, math.pi,\n"
        "      sqrt(2.0), Account(1).anything, acct.balance, scale(1.0, factor=3), od, _hidden.upper())\n"
    )
    assert errors(checker.check(code, declarations=decls)) == []
    found = errors(checker.check("count.upper()\nscale('x')\nundefined_thing\n", declarations=decls))
    assert [(d.code, d.line) for d in found] == [
        ("missing-attribute", 1),
        ("invalid-argument-type", 2),
        ("unresolved-reference", 3),
    ]


def test_the_sessions_own_builtins_are_known(checker: TypeChecker) -> None:
    code = "m = memory()\nm['resident_bytes'] or 0\n"
    assert errors(checker.check(code)) == []
    assert errors(checker.check(code, declarations="count: int")) == []
    assert [d.code for d in errors(checker.check("memory().upper()"))] == ["missing-attribute"]


def test_the_types_the_stubs_gave_the_names_a_script_binds_are_reported(checker: TypeChecker) -> None:
    code = "c = list_customers()\nfirst = c[0]\nn = len(c)\nnothing = None\nt = await list_open_tickets('x')\n"
    found, types = checker.check_with_types(code)
    assert errors(found) == []
    assert types == {"c": "list[__snapcell_stubs__.Customer]", "first": "__snapcell_stubs__.Customer"}
    with pytest.raises(TypingError):
        checker.check_with_types("c = list_customers()\nc[0]['nmae']")
    # Declared with those types, a later cell's wrong key is caught; a value that disagrees keeps its own type.
    decls = declarations_from_namespace({"c": [{"id": "1", "name": "a", "churned_at": None}]}, types=types)
    assert "c: list[__snapcell_stubs__.Customer]" in decls
    assert [d.code for d in errors(checker.check("c[0]['nmae']", declarations=decls))] == ["invalid-typed-dict-key"]
    assert errors(checker.check("c[0]['name'].upper()", declarations=decls)) == []
    assert "c: int" in declarations_from_namespace({"c": 5}, types=types)
    # A name the script or the namespace gives a class of its own is not taken for the stub's.
    _, shadowed = checker.check_with_types("class Customer:\n    pass\nc = list_customers()\n")
    assert shadowed == {}
    _, shadowed = checker.check_with_types("c = list_customers()", declarations="class Customer: ...")
    assert shadowed == {}


def test_hand_written_declarations(checker: TypeChecker) -> None:
    assert errors(checker.check("churned[0]['x'].foo", declarations="churned: list[dict[str, Any]]")) == []
    with pytest.raises(ConfigError):
        checker.check("x", declarations="churned: list[")


def test_multi_line_script_maps_lines_and_columns(checker: TypeChecker) -> None:
    code = (
        "import asyncio\n"
        'note = """first\n'
        '   still in the string"""\n'
        "rows = await asyncio.gather(list_open_tickets('a'))\n"
        "total = sum(len(r) for r in rows) + 'é' + list_open_tickets(7)\n"
        "rows\n"
    )
    found = errors(checker.check(code))
    assert found, "expected errors on line 5"
    assert {d.line for d in found} == {5}
    arg = next(d for d in found if d.code == "invalid-argument-type")
    assert arg.column == code.splitlines()[4].index("7") + 1
    assert arg.source_line == code.splitlines()[4]


def test_display_concise_and_full(checker: TypeChecker) -> None:
    code = "ok = 1\nx = await list_open_tickets(42)\n"
    with pytest.raises(TypingError) as info:
        checker.check_or_raise(code)
    err = info.value
    assert err.lineno == 2
    assert "did not run" in str(err)
    concise = err.display("concise")
    assert concise.startswith("line 2:29: [invalid-argument-type] Argument to function `list_open_tickets`")
    assert "\n" not in concise
    full = err.display("full").splitlines()
    assert full[0] == concise
    assert full[1] == "    x = await list_open_tickets(42)"
    assert full[2] == "    " + " " * 28 + "^^"
    assert full[3] == "    stub: async def list_open_tickets(customer_id: str) -> list[dict[str, str]]: ..."
    assert err.display("full") in err.for_model()
    assert err.for_model().startswith("The script did not run")


def test_warnings_do_not_fail(checker: TypeChecker) -> None:
    found = checker.check_or_raise("list_open_tickets('a')\n")
    assert [d.severity for d in found] == ["warning"]
    assert "(warning)" in found[0].render("concise")


def test_acheck_runs_off_the_loop(checker: TypeChecker) -> None:
    async def main() -> tuple[list[Diagnostic], list[Diagnostic]]:
        return await asyncio.gather(checker.acheck(GOOD), checker.acheck("nope"))

    good, bad = asyncio.run(main())
    assert errors(good) == []
    assert [d.code for d in errors(bad)] == ["unresolved-reference"]


def test_empty_stubs() -> None:
    tc = TypeChecker()
    try:
        assert errors(tc.check("import math\nx = math.sqrt(2)\nx")) == []
        assert [d.code for d in errors(tc.check("list_customers()"))] == ["unresolved-reference"]
    finally:
        tc.close()


def test_missing_ty_binary_is_config_error(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"pip install 'snapcell\[typecheck\]'"):
        TypeChecker(STUBS, ty_path=str(tmp_path / "no-such-ty"))
    monkeypatch.setattr("sys.executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError, match=r"pip install 'snapcell\[typecheck\]'"):
        find_ty()


def test_find_ty_prefers_the_interpreter_directory() -> None:
    assert find_ty().endswith("ty")


class Address(TypedDict):
    city: str
    zip_code: NotRequired[str]


class Account(TypedDict):
    id: str
    name: str
    address: Address
    churned_at: str | None


def list_accounts(status: Literal["open", "closed"] = "open", limit: int = 10) -> list[Account]:
    """List the accounts."""
    return []


async def account_notes(account_id: str, *, since: datetime.date | None = None) -> dict[str, list[str]]:
    return {}


def untyped(x, *args, **kwargs):  # type: ignore[no-untyped-def]
    return x


def test_stubs_from_functions_carry_their_signatures_and_typeddicts() -> None:
    stubs = stubs_from_functions({"list_accounts": list_accounts, "notes": account_notes, "untyped": untyped})
    compile(stubs, "<stubs>", "exec")  # valid Python
    assert "class Account(TypedDict):" in stubs and "    address: Address" in stubs
    assert "    zip_code: NotRequired[str]" in stubs
    assert "def list_accounts(status: Literal['open', 'closed'] = 'open', limit: int = 10) -> list[Account]:" in stubs
    assert "async def notes(account_id: str, *, since: datetime.date | None = None) -> dict[str, list[str]]:" in stubs
    assert "def untyped(x: Any, *args: Any, **kwargs: Any) -> Any:" in stubs
    checker = TypeChecker(stubs)
    try:
        good = "a = list_accounts('closed')\nn = await notes(a[0]['id'])\n(a[0]['address']['city'], n)"
        assert errors(checker.check(good)) == []
        bad = "a = list_accounts('gone')\na[0]['nmae']\nawait notes(1)\nuntyped(1).anything"
        assert [(d.code, d.line) for d in errors(checker.check(bad))] == [
            ("invalid-argument-type", 1),
            ("invalid-typed-dict-key", 2),
            ("invalid-argument-type", 3),
        ]
    finally:
        checker.close()
