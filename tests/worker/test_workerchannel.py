"""The worker's end of the channel: frames read whole, with as few reads as the socket allows."""

from __future__ import annotations

import socket
import threading
from typing import Any

from snapcell.wire._wire import FRAME, encode
from snapcell.worker._workerchannel import Channel


class _CountingSocket:
    """A socket that counts the reads made of it."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.reads = 0

    def recv(self, size: int) -> bytes:
        self.reads += 1
        return self._sock.recv(size)

    def recv_into(self, buffer: Any) -> int:
        self.reads += 1
        return self._sock.recv_into(buffer)

    def fileno(self) -> int:
        return self._sock.fileno()


def _frame(message: dict[str, Any], blob: bytes = b"") -> bytes:
    payload = encode(message)
    return FRAME.pack(len(payload), len(blob)) + payload + blob


def test_frames_sent_together_are_read_with_one_read_and_all_of_them_are_seen() -> None:
    host, worker = socket.socketpair()
    with host, worker:
        counted = _CountingSocket(worker)
        channel = Channel(counted)  # type: ignore[arg-type]
        host.sendall(b"".join(_frame({"op": "result", "id": i, "value": i}) for i in range(3)))
        assert not channel.has_frame()
        assert channel.receive() == ({"op": "result", "id": 0, "value": 0}, bytearray())
        assert counted.reads == 1
        # The other two came with that read: the socket has nothing more, but the channel knows they are there.
        assert channel.has_frame() and channel.readable(0)
        assert [channel.receive()[0]["id"] for _ in range(2)] == [1, 2]
        assert counted.reads == 1 and not channel.has_frame() and not channel.readable(0)


def test_a_large_blob_is_read_whole_into_its_own_buffer() -> None:
    host, worker = socket.socketpair()
    with host, worker:
        channel = Channel(worker)
        blob = bytes(range(256)) * 4096  # 1 MiB, more than one read
        sender = threading.Thread(target=host.sendall, args=(_frame({"op": "load"}, blob) + _frame({"op": "close"}),))
        sender.start()
        message, received = channel.receive()
        sender.join()
        assert message == {"op": "load"} and received == blob
        assert channel.receive()[0] == {"op": "close"}
