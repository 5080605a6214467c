"""A hostile stand-in for ``python -s -P -m snapcell.worker._worker``: it speaks the wire protocol and then lies.

Started by the host as ``python -I fake_worker.py ATTACK [ARGUMENT] FD HOST_PID``. It starts and becomes ready like a
real worker (unless the attack is about start-up), then answers the first request the attack is about
(``run``, ``dump`` or ``load``) with the attack. It imports nothing from snapcell, so it starts in a few
milliseconds, and writes its frames by hand: a 16-byte header (message length, blob length, big-endian),
the JSON message, the blob.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

FRAME = struct.Struct(">QQ")
MIB = 1024 * 1024
RAN: dict[str, Any] = {
    "op": "ran",
    "value": None,
    "value_repr": None,
    "stdout": "",
    "stderr": "",
    "duration_s": 0.0,
    "notes": [],
    "error": None,
    "memory_bytes": None,
    "namespace_summary": "",
}


class Peer:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, message: dict[str, Any], blob: bytes = b"") -> None:
        payload = json.dumps(message, separators=(",", ":")).encode()
        self.raw(FRAME.pack(len(payload), len(blob)) + payload + blob)

    def send_bytes(self, payload: bytes, blob: bytes = b"") -> None:
        self.raw(FRAME.pack(len(payload), len(blob)) + payload + blob)

    def read(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            if not chunk:
                os._exit(0)
            data += chunk
        return data

    def receive(self) -> dict[str, Any]:
        size, blob = FRAME.unpack(self.read(FRAME.size))
        message: dict[str, Any] = json.loads(self.read(size))
        if blob:
            self.read(blob)
        return message


def stall() -> None:
    time.sleep(3600)


def ran_with(**fields: Any) -> dict[str, Any]:
    return {**RAN, **fields}


def items(count: int) -> bytes:
    return b"[" + b",".join([b"0"] * count) + b"]"


# Each attack: the request op it answers, and what it does then.
ATTACKS: dict[str, tuple[str, Callable[[Peer], None]]] = {}


def attack(name: str, op: str = "run") -> Callable[[Callable[[Peer], None]], Callable[[Peer], None]]:
    def register(func: Callable[[Peer], None]) -> Callable[[Peer], None]:
        ATTACKS[name] = (op, func)
        return func

    return register


# ---------------------------------------------------------------- frames


@attack("length_2_pow_40")
def _(peer: Peer) -> None:
    peer.raw(FRAME.pack(2**40, 0))
    stall()


@attack("length_over_the_run_budget")
def _(peer: Peer) -> None:
    peer.raw(FRAME.pack(64 * MIB, 0) + b'{"op":"ran","stdout":"' + b"x" * MIB)
    stall()


@attack("truncated_frame_then_eof")
def _(peer: Peer) -> None:
    peer.raw(FRAME.pack(1000, 0) + b'{"op":"ra')
    os._exit(0)


@attack("garbage_json")
def _(peer: Peer) -> None:
    peer.send_bytes(b"\xff\xfe not json {{{")
    stall()


@attack("deep_nesting")
def _(peer: Peer) -> None:
    peer.send_bytes(b'{"op":"ran","value":' + b"[" * 200_000 + b"]" * 200_000 + b"}")
    stall()


@attack("huge_item_count")
def _(peer: Peer) -> None:
    # 1.5 million items in 3 MB: within the run's byte budget, far over its item budget.
    peer.send_bytes(b'{"op":"ran","value":' + items(1_500_000) + b"}")
    stall()


@attack("empty_containers_within_bytes")
def _(peer: Peer) -> None:
    # The densest objects per byte ([] is 56 bytes for 3 bytes sent), hidden in a text field.
    peer.send_bytes(b'{"op":"ran","stdout":[' + b",".join([b"[]"] * 1_500_000) + b"]}")
    stall()


@attack("wrong_op_for_the_request")
def _(peer: Peer) -> None:
    peer.send({"op": "dumped", "new_blobs": [], "parts": [0], "refresh": []})
    stall()


@attack("reply_to_a_request_never_sent")
def _(peer: Peer) -> None:
    peer.send({"op": "result", "id": 12345, "value": 1})
    stall()


@attack("unknown_error_class")
def _(peer: Peer) -> None:
    peer.send({"op": "error", "error": {"class": "SystemExit", "message": "bye", "traceback_text": 7}})
    stall()


@attack("error_with_enormous_message")
def _(peer: Peer) -> None:
    peer.send({"op": "error", "error": {"class": "ScriptError", "message": "m" * (4 * MIB), "hint": "h" * MIB}})
    stall()


@attack("twelve_million_notes")
def _(peer: Peer) -> None:
    notes = b'"",' * 12_000_000
    payload = b'{"op":"ran","notes":[' + notes + b'""]}'
    peer.raw(FRAME.pack(len(payload), 0))
    peer.raw(payload)
    stall()


@attack("notes_over_the_count")
def _(peer: Peer) -> None:
    peer.send(ran_with(notes=["note"] * 1000))
    stall()


@attack("giant_value")
def _(peer: Peer) -> None:
    peer.send(ran_with(value="v" * (8 * MIB)))
    stall()


@attack("value_that_claims_plain_type_but_is_not")
def _(peer: Peer) -> None:
    peer.send(ran_with(value={"$pickle": "gASVAAAAAAAAAAAu"}))
    stall()


@attack("interleaved_replies")
def _(peer: Peer) -> None:
    one = json.dumps(ran_with(value=1)).encode()
    two = json.dumps(ran_with(value=2)).encode()
    peer.raw(FRAME.pack(len(one), 0) + one + FRAME.pack(len(two), 0) + two)
    stall()


@attack("reply_after_the_deadline")
def _(peer: Peer) -> None:
    time.sleep(5)
    peer.send(ran_with(value="late"))
    stall()


@attack("stall_mid_frame")
def _(peer: Peer) -> None:
    peer.raw(FRAME.pack(100, 0) + b'{"op":')
    stall()


@attack("slow_loris")
def _(peer: Peer) -> None:
    payload = json.dumps(ran_with(stdout="x" * 1000)).encode()
    for byte in FRAME.pack(len(payload), 0) + payload:
        peer.raw(bytes([byte]))
        time.sleep(0.2)


@attack("stderr_flood_with_memoryerror")
def _(peer: Peer) -> None:
    line = b"MemoryError: out of memory\n"
    for _ in range(200):
        os.write(2, line * 2000)  # 10 MiB in all
    os._exit(1)


@attack("exit_with_a_fake_exit_code")
def _(peer: Peer) -> None:
    os.write(2, b"MemoryError\n")
    os._exit(137)


@attack("dies_after_filling_its_memory")
def _(peer: Peer) -> None:
    # Touched pages: its peak RSS is what the host reads from wait4. The size comes from the test (the word
    # after the attack's name), as the memory limit and the host's own peak, which a child inherits, decide it.
    hog = bytearray(int(sys.argv[2]))
    hog[::4096] = b"x" * len(range(0, len(hog), 4096))
    os._exit(1)


@attack("closing_the_socket_mid_run")
def _(peer: Peer) -> None:
    peer.raw(FRAME.pack(50, 0) + b'{"op"')
    peer.sock.shutdown(socket.SHUT_RDWR)
    peer.sock.close()
    stall()


@attack("blob_on_a_run_reply")
def _(peer: Peer) -> None:
    payload = json.dumps(RAN).encode()
    peer.raw(FRAME.pack(len(payload), 4 * 1024**3) + payload + b"x" * 1000)
    stall()


# ---------------------------------------------------------------- host calls


@attack("host_call_for_a_function_not_offered")
def _(peer: Peer) -> None:
    peer.send({"op": "call", "id": 1, "name": "secret", "args": [], "kwargs": {}})
    result = peer.receive()
    peer.send(ran_with(value=[result.get("id"), (result.get("error") or {}).get("type")]))
    stall()


@attack("host_calls_beyond_the_budget")
def _(peer: Peer) -> None:
    for call_id in range(1, 51):
        peer.send({"op": "call", "id": call_id, "name": "record", "args": [call_id], "kwargs": {}})
    stall()


@attack("host_call_with_huge_args")
def _(peer: Peer) -> None:
    peer.send({"op": "call", "id": 1, "name": "record", "args": ["a" * (4 * MIB)], "kwargs": {}})
    stall()


@attack("host_call_args_not_a_list")
def _(peer: Peer) -> None:
    peer.send({"op": "call", "id": 1, "name": "record", "args": "abc", "kwargs": {}})
    stall()


@attack("host_call_outside_a_run", op="dump")
def _(peer: Peer) -> None:
    peer.send({"op": "call", "id": 1, "name": "record", "args": [1], "kwargs": {}})
    stall()


# ---------------------------------------------------------------- dump replies and blobs


def dumped(parts: Any, names: list[str], blob: bytes, **extra: Any) -> dict[str, Any]:
    return {"op": "dumped", "new_blobs": names, "parts": parts, "refresh": [], **extra}


def body_with_manifest(manifest: bytes) -> bytes:
    """A checkpoint body's start, by hand (the header as `Header.pack` writes it), then ``manifest`` as its JSON."""
    fixed = struct.pack(">8sHBBbB", b"SNAPCELL", 3, sys.version_info.major, sys.version_info.minor, 1, 0)
    strings = b"".join(struct.pack(">H", len(text)) + text for text in (b"cloudpickle", b"3", b"0", b"0"))
    return fixed + strings + struct.pack(">I", len(manifest)) + manifest + struct.pack(">I", 0)


@attack("blob_claims_more_than_it_sends", op="dump")
def _(peer: Peer) -> None:
    payload = json.dumps(dumped([1024**3], [], b"")).encode()
    peer.raw(FRAME.pack(len(payload), 1024**3) + payload + b"x" * 4096)
    os._exit(0)


@attack("blob_over_the_budget", op="dump")
def _(peer: Peer) -> None:
    peer.raw(FRAME.pack(2, 2**50) + b"{}")
    stall()


@attack("blob_sizes_that_do_not_add_up", op="dump")
def _(peer: Peer) -> None:
    peer.send(dumped([10, 5], ["a" * 64], b""), b"x" * 12)
    stall()


@attack("negative_blob_size", op="dump")
def _(peer: Peer) -> None:
    peer.send(dumped([14, -2], ["a" * 64], b""), b"x" * 12)
    stall()


@attack("float_blob_size", op="dump")
def _(peer: Peer) -> None:
    peer.send(dumped([6.0, 6.0], ["a" * 64], b""), b"x" * 12)
    stall()


@attack("bool_blob_size", op="dump")
def _(peer: Peer) -> None:
    peer.send(dumped([11, True], ["a" * 64], b""), b"x" * 12)
    stall()


@attack("duplicate_blob_refs", op="dump")
def _(peer: Peer) -> None:
    peer.send(dumped([4, 4, 4], ["a" * 64, "a" * 64], b""), b"x" * 12)
    stall()


@attack("blob_count_beyond_the_budget", op="dump")
def _(peer: Peer) -> None:
    count = 70_000
    names = [f"{i:064x}" for i in range(count)]
    peer.send(dumped([0] * (count + 1), names, b""))
    stall()


@attack("dumped_manifest_with_millions_of_items", op="dump")
def _(peer: Peer) -> None:
    # Within the manifest's byte limit, far over its item budget: refused before it is parsed.
    body = body_with_manifest(b"[" + b",".join([b"[]"] * 3_000_000) + b"]")
    peer.send(dumped([len(body)], [], b""), body)
    stall()


@attack("manifest_with_millions_of_items", op="load")
def _(peer: Peer) -> None:
    # A load reply is a control reply: this one is over its budget, and refused unread.
    peer.send({"op": "loaded", "manifest": "[" + ",".join(["[]"] * 3_000_000) + "]"})
    stall()


@attack("loaded_with_a_forged_manifest", op="load")
def _(peer: Peer) -> None:
    # A valid manifest (the argument), but not the checkpoint's: the host must keep its own parse of what it verified.
    peer.send({"op": "loaded", "manifest": sys.argv[2]})


# ---------------------------------------------------------------- start-up


@attack("garbage_instead_of_started", op="start")
def _(peer: Peer) -> None:
    peer.send_bytes(b"[1, 2, 3]")
    stall()


@attack("ready_with_a_sandbox_that_is_not_a_dict", op="init")
def _(peer: Peer) -> None:
    peer.send({"op": "ready", "sandbox": "all layers active, trust me"})
    stall()


def main() -> None:
    name, fd = sys.argv[1], int(sys.argv[-2])  # ATTACK [ARGUMENT] FD HOST_PID
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only the host's SIGKILL stops it
    peer = Peer(socket.socket(fileno=fd))
    op, func = ATTACKS[name]
    if op == "start":
        func(peer)
    peer.send({"op": "started", "pid": os.getpid()})
    peer.receive()  # init
    if op == "init":
        func(peer)
    peer.send({"op": "ready", "sandbox": {}})
    while True:
        request = peer.receive()
        if request.get("op") == op:
            func(peer)
        elif request.get("op") == "dump":
            peer.send(dumped([0], [], b""))
        elif request.get("op") == "run":
            peer.send(RAN)
        else:
            peer.send({"op": {"queue": "queued", "load": "loaded"}.get(request.get("op"), request.get("op"))})


if __name__ == "__main__":
    main()
