"""OpenTelemetry spans (names and attributes as documented in snapcell.telemetry), logging, namespace summaries."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from snapcell import Limits, Pool, WorkerLost
from snapcell.interpreter._runner import summarize_namespace
from snapcell.ops import cleanup
from snapcell.storage import MemoryStore
from snapcell.telemetry import conversation_context, set_tracer_provider, trace_run


@pytest.fixture
def provider() -> Iterator[TracerProvider]:
    provider = TracerProvider()
    set_tracer_provider(provider)
    yield provider
    set_tracer_provider(None)


@pytest.fixture
def spans(provider: TracerProvider) -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


def _named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


@pytest.fixture(scope="module")
def inline_pool() -> Iterator[Pool]:
    with Pool("memory://", isolation="inline") as pool:
        yield pool


def _fetch(n: int) -> int:
    return n * 2


async def _afetch(n: int) -> int:
    return n * 3


def _fail() -> None:
    raise ValueError("no such customer")


TOOLS = {"fetch": _fetch, "afetch": _afetch, "fail": _fail}
SCRIPT = """\
import asyncio
a, b = await asyncio.gather(afetch(1), afetch(2))
c = fetch(3)
try:
    fail()
except ValueError:
    pass
print("héllo")
a + b + c
"""


def test_run_span_and_host_call_children(inline_pool: Pool, spans: InMemorySpanExporter) -> None:
    with inline_pool.checkout() as session, conversation_context("conv-42"):
        result = session.run(SCRIPT, external_lookup=TOOLS)
    assert result.value == 15

    (run,) = _named(spans, "snapcell.run")
    attrs = _attrs(run)
    assert attrs["snapcell.conversation_id"] == "conv-42"
    assert attrs["snapcell.code_bytes"] == len(SCRIPT.encode())
    assert attrs["snapcell.outcome"] == "ok"
    assert "snapcell.error_type" not in attrs
    assert attrs["snapcell.output_bytes"] == len("héllo\n".encode())
    assert attrs["snapcell.host_call_count"] == 4
    assert attrs["snapcell.duration_s"] > 0
    assert run.status.status_code is StatusCode.UNSET

    calls = _named(spans, "snapcell.host_call")
    assert sorted(_attrs(c)["snapcell.function"] for c in calls) == ["afetch", "afetch", "fail", "fetch"]
    assert all(c.parent is not None and c.parent.span_id == run.context.span_id for c in calls)
    assert all(_attrs(c)["snapcell.duration_s"] >= 0 for c in calls)
    (failed,) = [c for c in calls if _attrs(c)["snapcell.function"] == "fail"]
    assert _attrs(failed)["snapcell.error_type"] == "ValueError"
    assert failed.status.status_code is StatusCode.ERROR
    assert "snapcell.outcome" not in _attrs(failed)


def test_host_call_span_is_current_inside_the_host_function(inline_pool: Pool, spans: InMemorySpanExporter) -> None:
    seen: list[int] = []

    def lookup(name: str) -> str:
        seen.append(trace.get_current_span().get_span_context().span_id)
        return name + "!"

    async def alookup(name: str) -> str:
        seen.append(trace.get_current_span().get_span_context().span_id)
        return name + "?"

    with inline_pool.checkout() as session:
        value = session.feed_run(
            "lookup('x') + await alookup('y')", external_lookup={"lookup": lookup, "alookup": alookup}
        )
    assert value == "x!y?"
    calls = _named(spans, "snapcell.host_call")
    assert sorted(seen) == sorted(c.context.span_id for c in calls)


@pytest.mark.parametrize(
    ("code", "outcome", "error_type"),
    [("1/0", "error", "ZeroDivisionError"), ("import socket", "error", "PolicyError")],
)
def test_run_outcomes(inline_pool: Pool, spans: InMemorySpanExporter, code: str, outcome: str, error_type: str) -> None:
    with inline_pool.checkout() as session:
        assert session.run(code).error is not None
    (run,) = _named(spans, "snapcell.run")
    assert _attrs(run)["snapcell.outcome"] == outcome
    assert _attrs(run)["snapcell.error_type"] == error_type
    assert run.status.status_code is StatusCode.ERROR


def test_timeout_outcome(inline_pool: Pool, spans: InMemorySpanExporter) -> None:
    with inline_pool.checkout(limits=Limits(wall_time_s=0.2)) as session:
        assert session.run("while True:\n    pass").error is not None
    (run,) = _named(spans, "snapcell.run")
    assert _attrs(run)["snapcell.outcome"] == "timeout"
    assert _attrs(run)["snapcell.error_type"] == "TimeLimitExceeded"


def test_worker_lost_outcome(spans: InMemorySpanExporter) -> None:
    class Lost:
        @trace_run
        async def run(self, code: str) -> None:
            raise WorkerLost("the worker died", reason="crash")

    with pytest.raises(WorkerLost):
        asyncio.run(Lost().run("x = 1"))
    (run,) = _named(spans, "snapcell.run")
    assert _attrs(run)["snapcell.outcome"] == "worker_lost"
    assert _attrs(run)["snapcell.error_type"] == "WorkerLost"
    assert run.status.status_code is StatusCode.ERROR
    assert any(e.name == "exception" for e in run.events)


def test_dump_and_load_spans(inline_pool: Pool, spans: InMemorySpanExporter) -> None:
    with inline_pool.checkout() as session, conversation_context("conv-7"):
        assert session.run("big = bytearray(200_000)\nsmall = 1\ngen = (i for i in range(2))").ok
        checkpoint = session.dump()
        session.load_session(checkpoint)
    (dump,) = _named(spans, "snapcell.dump")
    attrs = _attrs(dump)
    assert attrs["snapcell.conversation_id"] == "conv-7"
    assert attrs["snapcell.checkpoint_bytes"] == attrs["snapcell.bytes_written"] > 0
    assert attrs["snapcell.variable_count"] >= 2
    assert attrs["snapcell.dropped_count"] == 1
    assert isinstance(attrs["snapcell.buffer_count"], int)
    (load,) = _named(spans, "snapcell.load")
    attrs = _attrs(load)
    assert attrs["snapcell.checkpoint_bytes"] == _attrs(dump)["snapcell.checkpoint_bytes"]
    assert attrs["snapcell.buffer_count"] == _attrs(dump)["snapcell.buffer_count"]
    assert "snapcell.error_type" not in attrs


def test_failed_load_span(inline_pool: Pool, spans: InMemorySpanExporter) -> None:
    with inline_pool.checkout() as session:
        checkpoint = session.dump()
        with pytest.raises(Exception, match="signature"):
            session.load_session(checkpoint[:-1] + bytes([checkpoint[-1] ^ 1]))
    (load,) = _named(spans, "snapcell.load")
    assert _attrs(load)["snapcell.error_type"] == "CheckpointCorrupt"
    assert load.status.status_code is StatusCode.ERROR


def test_sync_session_runs_inside_the_callers_span(
    inline_pool: Pool, provider: TracerProvider, spans: InMemorySpanExporter
) -> None:
    tracer = provider.get_tracer("app")
    with tracer.start_as_current_span("agent turn") as parent, inline_pool.checkout() as session:
        session.run("x = 1")
    (run,) = _named(spans, "snapcell.run")
    assert run.parent is not None and run.parent.span_id == parent.get_span_context().span_id


def test_process_mode_host_calls_are_children(spans: InMemorySpanExporter) -> None:
    with Pool("memory://", isolation="process") as pool, pool.checkout() as session:
        result = session.run("x = await afetch(2) + fetch(1)\nx", external_lookup=TOOLS)
    assert result.value == 8
    (run,) = _named(spans, "snapcell.run")
    assert isinstance(_attrs(run)["snapcell.memory_bytes"], int)
    calls = _named(spans, "snapcell.host_call")
    assert sorted(_attrs(c)["snapcell.function"] for c in calls) == ["afetch", "fetch"]
    assert all(c.parent is not None and c.parent.span_id == run.context.span_id for c in calls)


def test_cleanup_span(spans: InMemorySpanExporter) -> None:
    store = MemoryStore()
    store.put("checkpoints/2020-01-01/old", b"x" * 10, expires_at=0)
    store.put("checkpoints/2020-01-01/new", b"y" * 5, expires_at=0)
    report = cleanup(store, now=10**10, dry_run=True)
    (span,) = _named(spans, "snapcell.cleanup")
    attrs = _attrs(span)
    assert attrs["snapcell.dry_run"] is True
    assert attrs["snapcell.scanned_objects"] == 2
    assert attrs["snapcell.deleted_objects"] == report.deleted_expired_objects + report.deleted_quota_objects == 2
    assert attrs["snapcell.deleted_bytes"] == 15
    assert attrs["snapcell.over_quota"] is False


def test_debug_log_lines(inline_pool: Pool, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="snapcell"), inline_pool.checkout() as session:
        session.run("1/0")
    lines = [r.getMessage() for r in caplog.records if r.name == "snapcell"]
    assert any("snapcell.run" in line and "outcome=error" in line and "ZeroDivisionError" in line for line in lines)


def test_logger_is_quiet_by_default() -> None:
    logger = logging.getLogger("snapcell")
    assert any(isinstance(h, logging.NullHandler) for h in logger.handlers)


def test_nothing_changes_without_opentelemetry() -> None:
    script = """
import sys
sys.modules["opentelemetry"] = None  # as if the package were not installed
import snapcell
from snapcell.storage import MemoryStore
from snapcell.ops import cleanup
with snapcell.Pool("memory://", isolation="inline") as pool, pool.checkout() as session:
    result = session.run("x = f(2)\\nx", external_lookup={"f": lambda n: n + 1})
    assert result.value == 3, result
    session.load_session(session.dump())
    assert session.feed_run("x") == 3
cleanup(MemoryStore(), dry_run=True)
loaded = [m for m in sys.modules if m.startswith("opentelemetry")]
assert loaded == ["opentelemetry"], loaded
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


# ------------------------------------------------------ namespace summary


def test_namespace_summary_in_results(inline_pool: Pool) -> None:
    with inline_pool.checkout() as session:
        assert session.run("1 + 1").namespace_summary == ""
        small = session.run("a = 1\nb = 'text'")
        assert small.namespace_summary.startswith("2 variables, ")
        assert "largest" not in small.namespace_summary
        big = session.run("rows = ['x' * 100 for _ in range(20_000)]\nimport math")
    summary = big.namespace_summary
    assert summary.startswith("3 variables, ~")
    assert "largest: rows (list, ~" in summary and "MiB" in summary
    assert "math" not in summary


def test_namespace_summary_in_process_mode() -> None:
    with Pool("memory://", isolation="process") as pool, pool.checkout() as session:
        result = session.run("data = bytes(3_000_000)")
    assert result.namespace_summary.startswith("1 variable, 2.9 MiB; largest: data (bytes, 2.9 MiB)")
    assert result.memory_bytes is not None and result.memory_bytes > 3_000_000


def test_namespace_summary_trusts_no_script_sizeof() -> None:
    calls = []

    class Liar:
        def __sizeof__(self) -> int:
            calls.append(1)
            return 10**12

    class LyingList(list[int]):
        def __sizeof__(self) -> int:
            calls.append(1)
            return 10**12

    summary = summarize_namespace({"__name__": "__main__", "liar": Liar(), "items": LyingList([1]), "n": 1})
    assert calls == []
    assert summary.startswith("3 variables, ~")


def test_namespace_summary_is_cheap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its work is bounded by what it sizes: one size a variable, a sample of a container, the first 1,000 names."""
    sized: list[object] = []
    real = sys.getsizeof

    def counting(value: object, *default: int) -> int:
        sized.append(value)
        return real(value, *default)

    monkeypatch.setattr(sys, "getsizeof", counting)
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": {}}
    namespace.update(a=1, b=2.5, c="hello", d=[1, 2, 3], e={"x": 1}, f=(1, 2), g=None, h=True, i="x" * 100, j=b"a")
    assert summarize_namespace(namespace).startswith("10 variables")
    assert len(sized) <= 10 + 3 * 8 * 2  # each variable, and at most a sample of each container's items
    sized.clear()
    huge = {f"v{i}": [i] * 20 for i in range(100_000)}
    assert summarize_namespace(huge).startswith("1000+ variables")
    assert len(sized) <= 1000 * (1 + 8 * 2)  # the first 1,000 names only, each container from its sample


def test_no_span_is_started_until_a_tracer_provider_is_configured(
    inline_pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[str] = []
    real_start = trace.ProxyTracer.start_span

    def counting(self: trace.ProxyTracer, name: str, *args: Any, **kwargs: Any) -> Any:
        started.append(name)
        return real_start(self, name, *args, **kwargs)

    monkeypatch.setattr(trace.ProxyTracer, "start_span", counting)
    monkeypatch.setattr(trace.NoOpTracer, "start_span", counting)
    with inline_pool.checkout() as session:
        assert session.feed_run("1 + 1") == 2
        monkeypatch.setattr(trace, "get_tracer_provider", trace.NoOpTracerProvider)
        assert session.feed_run("2 + 2") == 4
        assert started == []  # the API alone (no provider set, or the no-op one): every span would record nothing
        # A global provider set later is used from the next run on.
        provider = TracerProvider()
        exporter = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
        assert session.feed_run("3 + 3") == 6
    assert [span.name for span in _named(exporter, "snapcell.run")] == ["snapcell.run"]


def test_a_tool_turn_is_one_span_with_its_load_run_and_dump_as_children(
    inline_pool: Pool, spans: InMemorySpanExporter
) -> None:
    from snapcell import SyncCodeTool
    from snapcell.heads import MemoryHeads

    tool = SyncCodeTool(inline_pool, heads=MemoryHeads())
    try:
        tool.run_code("conv-t", "x = 1")
        spans.clear()
        tool.run_code("conv-t", "x + 1")
    finally:
        tool.close()
    (turn,) = _named(spans, "snapcell.turn")
    assert _attrs(turn)["snapcell.conversation_id"] == "conv-t"
    assert turn.parent is None
    for name in ("snapcell.load", "snapcell.run", "snapcell.dump"):
        (child,) = _named(spans, name)
        assert child.parent is not None and child.parent.span_id == turn.context.span_id, name
