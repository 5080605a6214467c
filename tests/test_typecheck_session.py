"""Type checking wired into sessions: scripts with type errors never run."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TypedDict

import pytest

from snapcell import ConfigError, Pool, SyncCodeTool, TypingError
from snapcell.heads import MemoryHeads

STUBS = textwrap.dedent(
    """
    from typing import TypedDict
    class Customer(TypedDict):
        id: str
        name: str
        churned_at: str | None
    def list_customers() -> list[Customer]: ...
    async def list_open_tickets(customer_id: str) -> list[dict[str, str]]: ...
    """
)


def list_customers() -> list[dict[str, str | None]]:
    return [
        {"id": "c-1", "name": "Acme", "churned_at": "2026-08-14"},
        {"id": "c-2", "name": "Globex", "churned_at": None},
    ]


async def list_open_tickets(customer_id: str) -> list[dict[str, str]]:
    return [{"id": "T-1"}] if customer_id == "c-1" else []


TOOLS = {"list_customers": list_customers, "list_open_tickets": list_open_tickets}
KEY = "type-check-test-key-0123456789"


def test_wrong_argument_type_is_refused_and_the_session_is_unchanged(pool: Pool) -> None:
    with pool.checkout(type_check=True, type_check_stubs=STUBS) as session:
        session.feed_run("n = 1", external_lookup=TOOLS)
        with pytest.raises(TypingError) as error:
            session.feed_run("n = 2\ntickets = await list_open_tickets(42)", external_lookup=TOOLS)
        assert error.value.diagnostics and error.value.diagnostics[0].line == 2
        assert "list_open_tickets" in error.value.display("full")
        assert session.feed_run("n", external_lookup=TOOLS) == 1


def test_a_later_turn_sees_earlier_variables(pool: Pool) -> None:
    turn_1 = "churned = [c for c in list_customers() if c['churned_at']]\nlen(churned)"
    turn_2 = "import asyncio\nt = await asyncio.gather(*[list_open_tickets(c['id']) for c in churned])\nlen(t)"
    with pool.checkout(type_check=True, type_check_stubs=STUBS) as session:
        assert session.feed_run(turn_1, external_lookup=TOOLS) == 1
        assert session.feed_run(turn_2, external_lookup=TOOLS) == 1
        with pytest.raises(TypingError):
            session.feed_run("undefined_name + 1", external_lookup=TOOLS)
        assert session.feed_run("len(churned)", external_lookup=TOOLS, skip_type_check=True) == 1


def test_checking_after_load_in_a_new_process(tmp_path: Path) -> None:
    store = f"file://{tmp_path}"
    with (
        Pool(store, isolation="inline", signing_keys=[KEY]) as pool,
        pool.checkout(type_check=True, type_check_stubs=STUBS) as session,
    ):
        session.feed_run("churned = [c for c in list_customers() if c['churned_at']]", external_lookup=TOOLS)
        checkpoint = session.dump().hex()
    child = textwrap.dedent(
        f"""
        import snapcell
        from tests.test_typecheck_session import STUBS, TOOLS
        with snapcell.Pool({store!r}, signing_keys=[{KEY!r}]) as pool:
            with pool.checkout(type_check=True, type_check_stubs=STUBS) as session:
                session.load_session(bytes.fromhex({checkpoint!r}))
                print(session.feed_run("[c['name'] for c in churned]", external_lookup=TOOLS))
                try:
                    session.feed_run("churned.nope", external_lookup=TOOLS)
                except snapcell.TypingError as exc:
                    print("refused", exc.diagnostics[0].line)
        """
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=120, cwd=root, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["['Acme']", "refused 1"]


def test_missing_checker_is_a_clear_error(pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    import snapcell.typecheck._checker as typecheck

    def missing() -> str:
        raise ConfigError("ty is not installed; pip install 'snapcell[typecheck]'")

    monkeypatch.setattr(typecheck, "find_ty", missing)
    with pytest.raises(ConfigError, match="snapcell\\[typecheck\\]"):
        with pool.checkout(type_check=True, type_check_stubs=STUBS):
            pass


class Customer(TypedDict):
    id: str
    name: str
    churned_at: str | None


def typed_customers() -> list[Customer]:
    """List the customers."""
    return [{"id": "c-1", "name": "Acme", "churned_at": None}]


def test_a_tool_checks_against_stubs_made_from_its_host_functions(pool: Pool) -> None:
    tool = SyncCodeTool(pool, heads=MemoryHeads(), tools={"list_customers": typed_customers}, type_check=True)
    try:
        assert "class Customer(TypedDict)\n    id: str\n    name: str\n    churned_at: str | None" in tool.description
        assert "def list_customers() -> list[Customer]\n    List the customers." in tool.description
        refused = tool.run_code("c-auto", "c = list_customers()\nc[0]['nmae']")
        assert "did not run" in refused and "nmae" in refused, refused
        assert tool.run_code("c-auto", "c = list_customers()\nc[0]['name']") == "'Acme'"
    finally:
        tool.close()
    plain = SyncCodeTool(pool, heads=MemoryHeads(), tools={"list_customers": typed_customers})
    try:
        assert plain.run_code("c-plain", "list_customers()[0]['nmae']").count("KeyError") == 1
    finally:
        plain.close()


def test_a_variable_keeps_the_type_the_stubs_gave_it_in_later_turns(pool: Pool) -> None:
    with pool.checkout(type_check=True, type_check_stubs=STUBS) as session:
        session.feed_run("c = list_customers()\nfirst = c[0]", external_lookup=TOOLS)
        with pytest.raises(TypingError, match="nmae"):
            session.feed_run("c[0]['nmae']", external_lookup=TOOLS)
        with pytest.raises(TypingError, match="nmae"):
            session.feed_run("first['nmae']", external_lookup=TOOLS)
        assert session.feed_run("c[0]['name']", external_lookup=TOOLS) == "Acme"
        checkpoint_id = session.dump()
        # A run that was not checked makes its own types: the stubs' no longer apply to what it assigned.
        session.feed_run("first = {'nmae': 1}", external_lookup=TOOLS, skip_type_check=True)
        assert session.feed_run("first['nmae']", external_lookup=TOOLS) == 1
    with pool.checkout(type_check=True, type_check_stubs=STUBS) as later:  # another session, as in another process
        later.load_session(checkpoint_id)
        with pytest.raises(TypingError, match="nmae"):
            later.feed_run("c[0]['nmae']", external_lookup=TOOLS)
        assert later.feed_run("len(c), first['id']", external_lookup=TOOLS) == (2, "c-1")
