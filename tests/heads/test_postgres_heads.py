"""PostgreSQL heads and conversations beyond the conformance suites: the URL, errors a person can act on, the tables,
a shared or borrowed pool, races between instances and processes, and several servers taking turns on one
conversation. Every test runs against a real PostgreSQL server that the suite starts (`tests/pgserver.py`)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from snapcell import ConfigError, Conflict, Conversation, StorageError
from snapcell.conversation import PostgresConversationStore
from snapcell.errors import HeadCorrupt, StorageUnavailable
from snapcell.heads import Head, PostgresHeads, TurnRecord, open_heads
from tests.pgserver import postgres_server, postgres_url

__all__ = ["postgres_server", "postgres_url"]

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
A, B, C = b"a" * 40, b"b" * 40, b"c" * 40
NOW = 1_700_000_000.0


@pytest.fixture
def heads(postgres_url: str) -> Iterator[PostgresHeads]:
    made = PostgresHeads(postgres_url, max_history=3)
    yield made
    made.close()


def _sql(url: str, *statements: str) -> list[tuple[object, ...]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        rows: list[tuple[object, ...]] = []
        for statement in statements:
            cursor = connection.execute(statement)
            rows = cursor.fetchall() if cursor.description else []
        return rows


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ------------------------------------------------------------------ the URL


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_open_heads_takes_both_schemes_and_never_shows_the_password(postgres_url: str, scheme: str) -> None:
    url = postgres_url.replace("postgresql://postgres@", f"{scheme}://postgres:sekrit@")
    heads = open_heads(url, table="my_heads")
    try:
        assert isinstance(heads, PostgresHeads) and heads.table == "my_heads"
        heads.compare_and_set("c", None, A)
        assert heads.get("c").checkpoint_id == A  # type: ignore[union-attr]
        assert "sekrit" not in repr(heads) + heads.url and heads.url.endswith("#my_heads")
        assert _sql(postgres_url, "SELECT conversation_id FROM my_heads") == [("c",)]
    finally:
        heads.close()


def test_cleanup_mode_never_creates_the_table(postgres_url: str) -> None:
    with pytest.raises(ConfigError, match="table snapcell_heads does not exist"):
        open_heads(postgres_url, must_exist=True)
    assert _sql(postgres_url, "SELECT to_regclass('snapcell_heads')") == [(None,)]
    PostgresHeads(postgres_url).close()  # a server made it
    heads = open_heads(postgres_url, must_exist=True)
    assert list(heads.scan()) == []
    heads.close()


def test_without_psycopg_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # what an import finds when the package is not installed
    for make in (
        lambda: PostgresHeads("postgresql://app@db.example/app"),
        lambda: open_heads("postgres://app@db.example/app"),
        lambda: PostgresConversationStore("postgresql://app@db.example/app"),
    ):
        with pytest.raises(ConfigError, match=r"pip install 'snapcell\[postgres\]'"):
            make()


@pytest.mark.parametrize(
    "target",
    ["sqlite:///x", "postgresql://h/db?nonsense=1", 42, "host=h dbname=db"],
    ids=["scheme", "param", "int", "dsn"],
)
def test_malformed_targets_and_settings_are_config_errors(target: object) -> None:
    with pytest.raises(ConfigError):
        PostgresHeads(target)  # type: ignore[arg-type]


@pytest.mark.parametrize("table", ["Heads", "a-b", "x.y.z", "", "1abc", "a" * 52])
def test_malformed_table_names_are_refused_before_connecting(table: str) -> None:
    with pytest.raises(ConfigError, match="table name"):
        PostgresHeads("postgresql://nobody@127.0.0.1:1/none", table=table)


# ------------------------------------------------------------------ errors


def test_an_unreachable_server_says_so_without_the_password() -> None:
    port = _free_port()  # nothing listens there
    with pytest.raises(StorageUnavailable, match="Connection refused") as caught:
        PostgresHeads(f"postgresql://app:sekrit@127.0.0.1:{port}/app")
    assert "Is the server running" in str(caught.value) and "sekrit" not in str(caught.value)
    assert f"PostgreSQL at postgresql://app@127.0.0.1:{port}/app" in str(caught.value)


def test_an_unknown_user_or_database_says_what_to_check(postgres_url: str) -> None:
    with pytest.raises(StorageUnavailable, match=r'role "nobody" does not exist \(check the user name in the URL'):
        PostgresHeads(postgres_url.replace("//postgres@", "//nobody@"))
    missing = postgres_url.rpartition("/")[0] + "/no_such_db"
    with pytest.raises(StorageUnavailable, match=r'database "no_such_db" does not exist \(check the database name'):
        PostgresConversationStore(missing)


def test_a_user_without_rights_on_the_table_gets_storage_unavailable(postgres_url: str) -> None:
    PostgresHeads(postgres_url).close()
    _sql(postgres_url, "CREATE ROLE reader LOGIN")
    heads = PostgresHeads(postgres_url.replace("//postgres@", "//reader@"))
    try:
        with pytest.raises(StorageUnavailable, match="permission denied for table snapcell_heads"):
            heads.get("c")
    finally:
        heads.close()
        _sql(postgres_url, "DROP OWNED BY reader", "DROP ROLE reader")


def test_a_busy_pool_says_it_is_busy_not_unreachable(postgres_url: str) -> None:
    heads = PostgresHeads(postgres_url, max_connections=1, connect_timeout_s=0.2)
    try:
        with heads.db.connection("hold the only connection"):
            with pytest.raises(StorageUnavailable, match=r"no connection within 0.2 s \(the server accepts"):
                heads.get("c")
        assert heads.get("c") is None  # given back: usable again
    finally:
        heads.close()


def test_connections_the_server_dropped_are_replaced_before_use(heads: PostgresHeads, postgres_url: str) -> None:
    version = heads.compare_and_set("c", None, A)
    # What a server restart or a failover does to every idle connection of the pool.
    dropped = _sql(
        postgres_url,
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    assert dropped[0][0] >= 1
    assert heads.compare_and_set("c", version, B, history=[A])
    assert heads.get("c").checkpoint_id == B  # type: ignore[union-attr]


# ------------------------------------------------------------------ the tables


def test_a_table_of_someone_else_or_a_newer_schema_is_refused(postgres_url: str) -> None:
    _sql(postgres_url, "CREATE TABLE snapcell_heads (id int)")
    with pytest.raises(ConfigError, match="not snapcell's heads"):
        PostgresHeads(postgres_url)
    _sql(postgres_url, "COMMENT ON TABLE snapcell_heads IS 'snapcell heads, schema 99'")
    with pytest.raises(ConfigError, match="newer snapcell"):
        PostgresHeads(postgres_url)
    with pytest.raises(ConfigError, match="not snapcell's conversations"):
        PostgresConversationStore(postgres_url, table="snapcell_heads")


def test_the_heads_table_is_versioned_and_readable_by_a_person(heads: PostgresHeads, postgres_url: str) -> None:
    heads.compare_and_set("c", None, B, history=[A], turn=TurnRecord("t1", "the answer"))
    assert _sql(postgres_url, "SELECT obj_description('snapcell_heads'::regclass, 'pg_class')") == [
        ("snapcell heads, schema 1",)
    ]
    ((checkpoint, history, turns),) = _sql(
        postgres_url,
        "SELECT encode(checkpoint_id, 'escape'), array_length(history, 1), turns->0->>1 FROM snapcell_heads",
    )
    assert (checkpoint, history, turns) == (B.decode(), 1, "the answer")


def test_a_heads_table_made_before_turn_states_gains_the_column(postgres_url: str) -> None:
    heads = PostgresHeads(postgres_url)
    heads.compare_and_set("c", None, A, turn=TurnRecord("t1", "one"))
    heads.close()
    _sql(postgres_url, "ALTER TABLE snapcell_heads DROP COLUMN turn_states")  # as the first schema 1 made it
    heads = PostgresHeads(postgres_url)
    try:
        head = heads.get("c")
        assert head is not None and head.turns == (TurnRecord("t1", "one"),)
        heads.compare_and_set("c", head.version, B, history=[A], turn=TurnRecord("t2", "two", B, A))
        assert heads.get("c").turn("t2") == TurnRecord("t2", "two", checkpoint_id=B, started_from=A)  # type: ignore[union-attr]
    finally:
        heads.close()


def test_a_schema_qualified_table(postgres_url: str) -> None:
    _sql(postgres_url, "CREATE SCHEMA agents")
    heads = PostgresHeads(postgres_url, table="agents.heads")
    store = PostgresConversationStore(heads.pool, table="agents.conversations")
    try:
        heads.compare_and_set("c", None, A)
        store.save_sync(Conversation(id="c", messages=[{"role": "user", "content": "hi"}]))
        tables = _sql(postgres_url, "SELECT tablename FROM pg_tables WHERE schemaname = 'agents' ORDER BY 1")
        assert tables == [("conversations",), ("conversations_records",), ("heads",)]
    finally:
        store.close()
        heads.close()


@pytest.mark.parametrize("bad", ["turns = '{\"a\": 1}'", "history = '{NULL}'", "turns = '[[\"t\", 1]]'"])
def test_a_row_not_written_by_snapcell_is_head_corrupt(heads: PostgresHeads, postgres_url: str, bad: str) -> None:
    heads.compare_and_set("bad", None, A)
    heads.compare_and_set("good", None, B)
    _sql(postgres_url, f"UPDATE snapcell_heads SET {bad} WHERE conversation_id = 'bad'")
    with pytest.raises(HeadCorrupt, match="'bad'") as caught:
        heads.get("bad")
    assert caught.value.conversation_id == "bad" and isinstance(caught.value, StorageError)
    corrupt: list[HeadCorrupt] = []
    assert [cid for cid, _ in heads.scan(corrupt=corrupt)] == ["good"]
    assert [exc.conversation_id for exc in corrupt] == ["bad"]
    with pytest.raises(HeadCorrupt):
        list(heads.scan())


def test_scan_reads_page_by_page(heads: PostgresHeads, monkeypatch: pytest.MonkeyPatch) -> None:
    from snapcell.heads import _postgres

    monkeypatch.setattr(_postgres, "_SCAN_PAGE", 3)
    for i in range(8):
        heads.compare_and_set(f"c{i}", None, A)
    assert heads.acquire_lease("lease-only", "o", 10)
    assert sorted(cid for cid, _ in heads.scan()) == [f"c{i}" for i in range(8)]


def test_a_row_inserted_by_hand_with_the_defaults_is_a_head(heads: PostgresHeads, postgres_url: str) -> None:
    _sql(postgres_url, "INSERT INTO snapcell_heads (conversation_id, checkpoint_id, version) VALUES ('c', 'x', 'v1')")
    head = heads.get("c")
    assert head is not None and head.checkpoint_id == b"x" and head.version == "v1" and head.turns == ()
    assert heads.compare_and_set("c", "v1", A, history=[b"x"])


# ------------------------------------------------------------------ pools


@pytest.mark.parametrize("rows", ["tuple", "dict"])
def test_heads_and_conversations_on_the_application_s_own_pool(postgres_url: str, rows: str) -> None:
    from psycopg.rows import dict_row, tuple_row
    from psycopg_pool import ConnectionPool

    # Not in autocommit mode, and maybe with another row factory: the stores work with a pool as it comes.
    factory = dict_row if rows == "dict" else tuple_row
    pool = ConnectionPool(postgres_url, min_size=1, max_size=2, open=True, kwargs={"row_factory": factory})
    try:
        heads = PostgresHeads(pool)
        store = PostgresConversationStore(pool)
        assert heads.pool is pool and store.pool is pool
        assert heads.acquire_lease("c", "s/t1", 60)
        version = heads.compare_and_set("c", None, A, owner="s/t1", release_lease=True, turn=TurnRecord("t1"))
        conversation = Conversation(id="c")
        conversation.record_turn(A, "t1")
        store.add_messages_sync(conversation, [{"role": "user", "content": "hi"}])
        heads.close()
        store.close()
        assert not pool.closed  # borrowed: left open
        # Everything was committed, as another connection sees.
        assert _sql(postgres_url, "SELECT version, lease_owner FROM snapcell_heads") == [(version, None)]
        reader = PostgresConversationStore(postgres_url)
        loaded = reader.load_sync("c")
        reader.close()
        assert loaded is not None and loaded.checkpoint_id == A and loaded.messages == conversation.messages
    finally:
        pool.close()


# ------------------------------------------------------------------ conversations


def test_conversation_rows_a_save_replaces_the_records_before_it(postgres_url: str) -> None:
    store = PostgresConversationStore(postgres_url)
    try:
        conversation = Conversation(id="c", messages=[{"role": "user", "content": "0"}])
        store.save_sync(conversation)
        store.add_messages_sync(conversation, [{"role": "assistant", "content": "1"}])
        store.add_messages_sync(conversation, [{"role": "user", "content": "2"}])
        records = "SELECT revision, record->>'rev', record->'add'->0->>'content' FROM snapcell_conversations_records"
        assert _sql(postgres_url, records + " ORDER BY 1") == [(1, "1", None), (2, "2", "1"), (3, "3", "2")]
        assert _sql(postgres_url, "SELECT revision FROM snapcell_conversations") == [(3,)]
        conversation.truncate(1)
        store.save_sync(conversation)
        assert _sql(postgres_url, records) == [(4, "4", None)]
        store.delete_sync("c")
        assert _sql(postgres_url, "SELECT count(*) FROM snapcell_conversations_records") == [(0,)]
    finally:
        store.close()


_WAITING_FOR_A_LOCK = "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"


def test_a_delete_racing_a_write_leaves_no_half_conversation(postgres_url: str) -> None:
    """The write holds the conversation's row; a delete that comes meanwhile waits, then removes what it added."""
    import psycopg

    store = PostgresConversationStore(postgres_url)
    try:
        conversation = Conversation(id="c", messages=[{"role": "user", "content": "0"}])
        store.save_sync(conversation)
        with psycopg.connect(postgres_url) as writer:  # a write in progress, holding the row like `_append`
            writer.execute("UPDATE snapcell_conversations SET revision = 2 WHERE conversation_id = 'c'")
            deleted = threading.Thread(target=store.delete_sync, args=("c",))
            deleted.start()
            record = json.dumps({"rev": 2, "add": [{"role": "user", "content": "1"}], "meta": {}})
            writer.execute("INSERT INTO snapcell_conversations_records VALUES ('c', 2, %s::json)", (record,))
            deadline = time.monotonic() + 30  # a hang guard for a loaded machine, not a measurement
            while not _sql(postgres_url, _WAITING_FOR_A_LOCK) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert deleted.is_alive() and _sql(postgres_url, _WAITING_FOR_A_LOCK)  # the delete waits for the write
            writer.commit()
        deleted.join(30)
        assert store.load_sync("c") is None
        assert _sql(postgres_url, "SELECT count(*) FROM snapcell_conversations_records") == [(0,)]
    finally:
        store.close()


# ------------------------------------------------------------------ races


def test_a_write_between_read_and_write_is_caught(postgres_url: str) -> None:
    mine, other = PostgresHeads(postgres_url), PostgresHeads(postgres_url)
    try:
        version = mine.compare_and_set("c", None, A)
        raced: list[str] = []

        def other_writes(conversation_id: str, record: Head | None) -> None:
            if not raced:  # once: the other instance moves the head after this one read it
                raced.append(other.compare_and_set("c", version, C, history=[A]))

        mine._after_read = other_writes
        with pytest.raises(Conflict, match="moved"):
            mine.compare_and_set("c", version, B, history=[A])
        head = mine.get("c")
        assert head is not None and head.checkpoint_id == C and head.version == raced[0]

        # The same for a lease: the other took it meanwhile, so this one, deciding again, does not.
        def other_leases(conversation_id: str, record: Head | None) -> None:
            if len(raced) == 1:
                raced.append(str(other.acquire_lease("c", "other/t", 60, now=NOW)))

        mine._after_read = other_leases
        assert not mine.acquire_lease("c", "mine/t", 60, now=NOW + 1)
        assert raced[1] == "True" and mine.get("c").lease_owner == "other/t"  # type: ignore[union-attr]
    finally:
        mine.close()
        other.close()


_HAMMER = """
import sys, time
from snapcell import Conflict
from snapcell.heads import PostgresHeads
heads = PostgresHeads(sys.argv[1])
# Yield the CPU between reading the row and writing it: a gap in the atomicity of an update becomes a lost increment.
heads._after_read = lambda conversation_id, record: time.sleep(0.002)
print("ready", flush=True)
sys.stdin.readline()
head = heads.get("counter")
print("read", flush=True)  # every child reads the same first version before any of them writes
sys.stdin.readline()
done = conflicts = 0
while done < int(sys.argv[2]):
    try:
        heads.compare_and_set("counter", head.version, str(int(head.checkpoint_id) + 1).encode())
        done += 1
    except Conflict:
        conflicts += 1
    head = heads.get("counter")
print(conflicts, flush=True)
"""


def _children(code: str, *argv: list[str]) -> list[subprocess.Popen[str]]:
    return [
        subprocess.Popen(
            [sys.executable, "-c", code, *args],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args in argv
    ]


def _start_together(children: list[subprocess.Popen[str]], steps: tuple[str, ...] = ("ready",)) -> list[str]:
    """At each step, wait for every child to print it, then let them all go on at once; return what each printed
    after the last step."""
    for step in steps:
        for child in children:
            assert child.stdout is not None
            line = child.stdout.readline().strip()
            assert line == step, line + (child.stderr.read() if child.stderr else "")
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
    outputs = []
    for child in children:
        out, err = child.communicate(timeout=110)
        assert child.returncode == 0, err
        outputs.append(out)
    return outputs


def test_cas_hammer_from_many_processes_loses_no_increment(heads: PostgresHeads, postgres_url: str) -> None:
    heads.compare_and_set("counter", None, b"0")
    outputs = _start_together(_children(_HAMMER, *([postgres_url, "15"] for _ in range(3))), ("ready", "read"))
    head = heads.get("counter")
    assert head is not None and head.checkpoint_id == b"45"
    # They really raced, counted rather than timed: all first writes name the version every child read before any
    # wrote, so all but one of them are refused.
    assert sum(int(out) for out in outputs) >= 2


_SERVER = """
import json, sys
from snapcell import Pool, SyncCodeTool
from snapcell.heads import PostgresHeads
url, store, holder, turns = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
answers = []
with Pool(store, isolation="inline", signing_keys=["pg-servers-signing-key-0123456789"], create_store=True) as pool:
    print("ready", flush=True)
    sys.stdin.readline()
    heads = PostgresHeads(url)  # all servers at once, on a database without the table yet
    tool = SyncCodeTool(pool, heads=heads, holder_id=holder, lease_wait_s=100)
    for k in range(1, turns + 1):
        turn = f"{holder}-t{k}"
        code = f"try:\\n    log\\nexcept NameError:\\n    log = []\\nlog.append({turn!r})\\nlen(log)"
        answer = tool.run_code("shared", code, turn_id=turn)
        # A retry of a committed turn, from this server: the code does not run again (the log the checker reads at
        # the end holds no 'again'), and the answer is the committed one, or says it is no longer kept when the
        # other servers committed more than MAX_TURN_ANSWERS turns while this one waited for the lease.
        again = tool.run_code("shared", "log.append('again')", turn_id=turn)
        assert again == answer or f"(turn ID {turn!r}) already ran" in again, (answer, again)
        answers.append([turn, answer])
    tool.close()
heads.close()
print(json.dumps(answers), flush=True)
"""


@pytest.mark.slow
def test_servers_sharing_one_conversation_commit_every_turn_once_and_in_order(
    postgres_url: str, tmp_path: Path
) -> None:
    """Three servers (processes, each with its own holder ID and pool) start at once on a new database and run turns
    of one conversation, on a shared checkpoint store and one PostgreSQL head store: the table is made once, the
    leases let one turn run at a time, each turn sees every turn committed before it, nothing is lost or run
    twice."""
    servers, turns = 3, 5
    store = f"file://{tmp_path / 'store'}"
    outputs = _start_together(
        _children(_SERVER, *([postgres_url, store, f"server-{i}", str(turns)] for i in range(servers)))
    )
    answers = {turn: answer for out in outputs for turn, answer in json.loads(out.strip().splitlines()[-1])}
    every = {f"server-{i}-t{k}" for i in range(servers) for k in range(1, turns + 1)}
    assert set(answers) == every
    # Each turn saw a log one longer than the turn before it: they ran one at a time, none was lost or repeated.
    assert sorted(int(answer.strip().splitlines()[-1]) for answer in answers.values()) == list(range(1, len(every) + 1))
    heads = PostgresHeads(postgres_url)
    try:
        head = heads.get("shared")
        assert head is not None and len(head.history) == len(every) - 1
        committed = [turn.turn_id for turn in reversed(head.turns)]
        assert sorted(committed) == sorted(every)
        for i in range(servers):  # each server's turns in the order it sent them
            mine = [turn for turn in committed if turn.startswith(f"server-{i}-")]
            assert mine == [f"server-{i}-t{k}" for k in range(1, turns + 1)]
        # The namespace agrees with the head: the log is the committed turns in commit order, each once.
        from snapcell import Pool, SyncCodeTool

        with Pool(store, isolation="inline", signing_keys=["pg-servers-signing-key-0123456789"]) as pool:
            tool = SyncCodeTool(pool, heads=heads, holder_id="checker")
            assert tool.run_code("shared", "log").strip().splitlines()[-1] == repr(committed)
            tool.close()
    finally:
        heads.close()
