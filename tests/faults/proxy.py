"""A fault-injecting TCP proxy on loopback, to put between an S3 client and the moto server.

The proxy runs its own asyncio loop in a daemon thread. A test switches its mode at any time; switching drops
every open connection, so pooled keep-alive connections cannot carry the old mode into the new one.

Modes:
    ``pass``: forward bytes both ways.
    ``refuse``: stop listening: connections are refused by the kernel (and so never counted).
    ``hang``: accept, read the request, never answer.
    ``delay``: forward, but hold each response back ``delay_s`` seconds before its first byte.
    ``slowdown``: answer every request ``503 SlowDown`` (an S3 error body) without contacting the server.
    ``cut``: forward the request, forward the first ``cut_after_bytes`` of the response, then reset the connection.
        An interim ``100 Continue`` is passed whole and not counted, so a PUT that waits for it still reaches the
        server: the write is applied and only its answer is lost.
    ``cut_request``: forward the first ``cut_after_bytes`` of the request, then reset both sides.

With ``times=N``, only the next N connections get the fault; later ones pass (a transient fault).

`connections` counts accepted connections and `requests` the request heads the proxy read in the modes that
read them (``hang``, ``slowdown``), so a test can bound the attempts a client made.

This module does not import snapcell.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any

__all__ = ["MODES", "FaultProxy"]

MODES = frozenset({"pass", "refuse", "hang", "delay", "slowdown", "cut", "cut_request"})
_CHUNK = 65536
_CONTINUE = b"HTTP/1.1 100 "
_SLOWDOWN_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message><RequestId>fault-proxy</RequestId></Error>"
)


class FaultProxy:
    """Forward ``127.0.0.1:<port>`` to ``upstream`` (``http://host:port``), failing on demand.

    Use as a context manager, or call `start` and `stop`.
    """

    def __init__(self, upstream: str) -> None:
        host_port = upstream.removeprefix("http://").rstrip("/")
        host, _, port = host_port.rpartition(":")
        self._upstream = (host, int(port))
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._lock = threading.Lock()
        self.port = 0
        self.mode = "pass"
        self.delay_s = 0.0
        self.cut_after_bytes = 0
        self.times: int | None = None
        self.faulted = 0
        self.connections = 0
        self.requests = 0

    @property
    def url(self) -> str:
        """The proxy's endpoint URL, to give the S3 client."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        self._thread.start()
        self._run(self._listen())
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._run(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def set_mode(self, mode: str, *, delay_s: float = 0.0, cut_after_bytes: int = 0, times: int | None = None) -> None:
        """Switch to ``mode`` (for the next ``times`` connections, or all) and drop every open connection.

        The counters start again from zero.
        """
        if mode not in MODES:
            raise ValueError(f"unknown proxy mode {mode!r}; one of {sorted(MODES)}")
        if times is not None and mode == "refuse":
            raise ValueError("refuse cannot be limited to a number of connections: refused ones are never seen")
        self._run(self._switch(mode, delay_s, cut_after_bytes, times))

    def reset_counts(self) -> None:
        with self._lock:
            self.connections = 0
            self.requests = 0

    # ------------------------------------------------------------------ loop side

    def _run(self, coro: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _close_listener(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _shutdown(self) -> None:
        await self._close_listener()
        self._drop_all()

    def _drop_all(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _switch(self, mode: str, delay_s: float, cut_after_bytes: int, times: int | None) -> None:
        self._drop_all()
        self.mode, self.delay_s, self.cut_after_bytes, self.times = mode, delay_s, cut_after_bytes, times
        self.faulted = 0
        self.reset_counts()
        if mode == "refuse":
            await self._close_listener()
        elif self._server is None:
            await self._listen()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with self._lock:
            self.connections += 1
            mode = self.mode
            if self.times is not None:
                mode = mode if self.faulted < self.times else "pass"
                self.faulted += 1
        self._writers.add(writer)
        try:
            if mode == "hang":
                await self._hang(reader)
            elif mode == "slowdown":
                await self._slowdown(reader, writer)
            else:
                await self._forward(reader, writer, mode)
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            pass
        finally:
            self._writers.discard(writer)
            writer.transport.abort()

    async def _read_head(self, reader: asyncio.StreamReader) -> dict[str, str] | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            return None
        with self._lock:
            self.requests += 1
        headers = {}
        for line in head.decode("latin-1").split("\r\n")[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        return headers

    async def _hang(self, reader: asyncio.StreamReader) -> None:
        await self._read_head(reader)
        while await reader.read(_CHUNK):
            pass  # swallow the body and anything else until the client gives up

    async def _slowdown(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # One answer per connection (``Connection: close``), so ``times=N`` means N throttled requests.
        headers = await self._read_head(reader)
        if headers is None:
            return
        if headers.get("expect", "").lower() != "100-continue":  # with it, the client waits before the body
            await reader.readexactly(int(headers.get("content-length", "0")))
        writer.write(
            b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nConnection: close\r\n"
            + f"Content-Length: {len(_SLOWDOWN_BODY)}\r\n\r\n".encode()
            + _SLOWDOWN_BODY
        )
        await writer.drain()

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, mode: str) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        self._writers.add(up_writer)
        request_sent = asyncio.Event()
        limit = self.cut_after_bytes

        async def upstream() -> None:
            sent = 0
            while data := await reader.read(_CHUNK):
                if mode == "cut_request" and sent + len(data) >= limit:
                    up_writer.write(data[: max(0, limit - sent)])
                    await up_writer.drain()
                    return
                sent += len(data)
                up_writer.write(data)
                await up_writer.drain()
                request_sent.set()

        async def downstream() -> None:
            sent = 0
            interim = bytearray()
            while True:
                data = await up_reader.read(_CHUNK)
                if not data:
                    return
                if mode == "cut" and sent == 0:
                    data = await _pass_interim(interim, data, writer)
                    if not data:
                        continue
                if mode == "delay" and request_sent.is_set():
                    request_sent.clear()  # the first bytes of the answer to a new request: hold them back
                    await asyncio.sleep(self.delay_s)
                if mode == "cut" and sent + len(data) >= limit:
                    writer.write(data[: max(0, limit - sent)])
                    await writer.drain()
                    return
                sent += len(data)
                writer.write(data)
                await writer.drain()

        tasks = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
                    await task
            self._writers.discard(up_writer)
            up_writer.transport.abort()


async def _pass_interim(pending: bytearray, data: bytes, writer: asyncio.StreamWriter) -> bytes:
    """Forward an interim ``100 Continue`` whole and return what follows it (the answer to count and cut).

    The interim answer lets the client send its body, so a cut PUT is applied and only its answer is lost. It may
    come in pieces: they wait in ``pending`` until it is complete.
    """
    pending += data
    if not (pending.startswith(_CONTINUE) or _CONTINUE.startswith(pending)):
        rest = bytes(pending)
        pending.clear()
        return rest
    end = pending.find(b"\r\n\r\n")
    if end < 0:
        return b""
    writer.write(bytes(pending[: end + 4]))
    await writer.drain()
    rest = bytes(pending[end + 4 :])
    pending.clear()
    return rest
