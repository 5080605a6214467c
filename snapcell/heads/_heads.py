"""Conversation heads: each conversation's current checkpoint ID, its history, and the lease of a turn in progress.

A `HeadStore` is sync at its core, like a `Store`; `AsyncHeads` wraps one for async callers. Every backend is the
same small state machine over one record per conversation, applied atomically by the backend (a lock in memory, a
``BEGIN IMMEDIATE`` transaction in SQLite, a conditional write on S3 or in PostgreSQL). The transitions live here, once.
"""

from __future__ import annotations

import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

from snapcell.errors import ConfigError, Conflict, HeadCorrupt, InvalidKey, StorageError

__all__ = [
    "DEFAULT_MAX_HISTORY",
    "MAX_TURN_ANSWERS",
    "MAX_TURN_IDS",
    "Head",
    "HeadStore",
    "MemoryHeads",
    "RecordHeads",
    "TurnRecord",
    "lease_holder",
    "new_lease_owner",
    "validate_conversation_id",
    "validate_turn_id",
]

DEFAULT_MAX_HISTORY = 50
MAX_TURN_IDS = 64
MAX_TURN_ANSWERS = 8
MAX_CONVERSATION_ID = 128
_CONVERSATION_ID = re.compile(r"[A-Za-z0-9_:-][A-Za-z0-9._:-]{0,127}\Z")


def validate_conversation_id(conversation_id: str) -> str:
    """Check a conversation ID and return it unchanged.

    A conversation ID is 1 to 128 characters of letters, digits, ``.``, ``_``, ``:`` and ``-``, not starting with
    ``.``; it is safe to use inside a storage key or a file name.

    Raises:
        InvalidKey: The ID is malformed; nothing was read or written.
    """
    if not isinstance(conversation_id, str):
        raise InvalidKey(f"a conversation ID must be a str, not {type(conversation_id).__name__}")
    if not _CONVERSATION_ID.match(conversation_id):
        shown = conversation_id if len(conversation_id) <= 40 else conversation_id[:40] + "..."
        raise InvalidKey(
            f"invalid conversation ID {shown!r}: use 1 to {MAX_CONVERSATION_ID} characters of letters, digits, "
            "'.', '_', ':' and '-', not starting with '.' (hash longer or other IDs first)"
        )
    return conversation_id


def validate_turn_id(turn_id: str) -> str:
    """Check a turn ID (an idempotency key) and return it unchanged; the rules are those of a conversation ID.

    Raises:
        InvalidKey: The ID is malformed; nothing was read or written.
    """
    try:
        return validate_conversation_id(turn_id)
    except InvalidKey as exc:
        raise InvalidKey(str(exc).replace("conversation ID", "turn ID")) from None


def lease_holder(owner: str | None) -> str | None:
    """The holder part of a lease owner ``"<holder>/<turn>"``, or None when the owner has no holder part."""
    if owner is None:
        return None
    holder, slash, _ = owner.rpartition("/")
    return holder if slash and holder else None


_last_stamp = 0
_stamp_lock = threading.Lock()


def new_lease_owner(holder: str) -> str:
    """A new turn's lease owner ``"<holder>/<stamp>.<random>"``; each stamp is later than the last one.

    The stamp is the wall clock in nanoseconds (hex), never below the process's previous stamp plus one: a holder's
    later turn outranks its earlier ones, also across a restart under the same holder ID (unless the clock went back
    by more than the restart took; then the new turn waits for the old lease to expire, like another holder's).
    """
    global _last_stamp
    with _stamp_lock:
        _last_stamp = max(time.time_ns(), _last_stamp + 1)
        stamp = _last_stamp
    return f"{holder}/{stamp:x}.{secrets.token_hex(4)}"


def _owner_stamp(owner: str | None) -> int | None:
    """The stamp of an owner made by `new_lease_owner`, or None (an owner of an older release, or another form)."""
    turn = (owner or "").rpartition("/")[2]
    stamp, dot, _ = turn.partition(".")
    if not dot or not 0 < len(stamp) <= 20:
        return None
    try:
        return int(stamp, 16)
    except ValueError:
        return None


def _outranks(owner: str, held_by: str | None) -> bool:
    """Whether ``owner`` may take over a lease of its own holder held by ``held_by``: it is the later turn.

    An earlier turn whose attempt landed late (it timed out, and the holder's next turn took the lease meanwhile)
    must not take the lease from under that turn. Owners without a stamp (older releases) are taken over as before.
    """
    mine, theirs = _owner_stamp(owner), _owner_stamp(held_by)
    return mine is None or theirs is None or mine > theirs


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """A committed turn (or another head move: a rewind, a fork, a file put) as its conversation's head remembers it.

    Attributes:
        turn_id: The turn's ID (generated, or the caller's idempotency key).
        answer: The answer the turn returned; kept only for the `MAX_TURN_ANSWERS` most recent turns, else None.
        checkpoint_id: The checkpoint the turn moved the head to; None when not recorded (a record written by an
            earlier snapcell, or by a move to an empty session).
        started_from: The checkpoint the turn started from (None: an empty session); meaningful only when
            ``checkpoint_id`` is recorded.
    """

    turn_id: str
    answer: str | None = None
    checkpoint_id: bytes | None = None
    started_from: bytes | None = None

    @property
    def states_known(self) -> bool:
        """Whether the record says where the turn started and what it produced (``checkpoint_id`` is set)."""
        return self.checkpoint_id is not None


@dataclass(frozen=True, slots=True)
class Head:
    """A conversation's head as a head store holds it.

    Attributes:
        checkpoint_id: The current checkpoint ID, or None for an empty session.
        history: Earlier checkpoint IDs, newest first, bounded by the store's ``max_history``.
        version: Opaque token that changes on every head change; pass it to `HeadStore.compare_and_set`.
            Lease changes leave it alone. ``""`` only inside a store, for a record that holds a lease but no head.
        updated_at: When the head last moved (seconds since the epoch).
        lease_owner: Who holds the lease of a turn in progress, if anyone (it may have expired).
        lease_expires_at: When that lease expires (seconds since the epoch); 0 without a lease.
        turns: The most recent committed turns, newest first, at most `MAX_TURN_IDS`.
        lease_renewed_at: When the lease was last taken or renewed (seconds since the epoch); 0 when unknown.
    """

    checkpoint_id: bytes | None = None
    history: tuple[bytes, ...] = ()
    version: str = ""
    updated_at: float = 0.0
    lease_owner: str | None = None
    lease_expires_at: float = 0.0
    turns: tuple[TurnRecord, ...] = ()
    lease_renewed_at: float = 0.0

    def lease_held(self, now: float) -> bool:
        """True when someone holds an unexpired lease at ``now``."""
        return self.lease_owner is not None and self.lease_expires_at > now

    def lease_stale(self, now: float) -> bool:
        """True when a held lease missed a renewal (renewals come every third of its ttl): its holder is gone."""
        if not self.lease_held(now):
            return False
        ttl = self.lease_expires_at - self.lease_renewed_at
        if not self.lease_renewed_at or ttl <= 0 or self.lease_renewed_at > now:
            return True  # never renewed by a snapcell that records it, or a clock from the future
        return now - self.lease_renewed_at > 0.4 * ttl

    def turn(self, turn_id: str) -> TurnRecord | None:
        """The committed turn with this ID, if the head still remembers it."""
        return next((turn for turn in self.turns if turn.turn_id == turn_id), None)

    @property
    def malformed(self) -> bool:
        """True for a record that names checkpoints but has no version: not written by snapcell, or edited."""
        return not self.version and (self.checkpoint_id is not None or bool(self.history) or bool(self.turns))


@runtime_checkable
class HeadStore(Protocol):
    """One head per conversation, moved only by compare-and-swap, plus a lease marking a turn in progress.

    Implemented by `MemoryHeads`, `SQLiteHeads`, `S3Heads` and `PostgresHeads`.
    """

    def get(self, conversation_id: str) -> Head | None:
        """Return the conversation's head, or None when it has none yet.

        Raises:
            InvalidKey: The conversation ID is malformed.
            StorageError: The backend failed; the call may be retried.
        """
        ...

    def compare_and_set(
        self,
        conversation_id: str,
        expected_version: str | None,
        checkpoint_id: bytes | None,
        *,
        history: Sequence[bytes] = (),
        owner: str | None = None,
        release_lease: bool = False,
        turn: TurnRecord | None = None,
    ) -> str:
        """Move the head if it is still at ``expected_version``; return the new version.

        Args:
            conversation_id: The conversation.
            expected_version: The version read before the turn, or None to create the head (create-only).
            checkpoint_id: The new current checkpoint ID (None for an empty session).
            history: The new history, newest first; cut to the store's ``max_history``.
            owner: When given, the write also requires that ``owner`` holds the lease (expired or not).
            release_lease: Release ``owner``'s lease in the same write.
            turn: The turn this write commits, recorded first in the head's ``turns`` (bounded); None keeps the
                recorded turns as they are (a new head starts with none).

        Raises:
            Conflict: The head moved, exists (create-only), was deleted, the lease belongs to someone else, or
                ``turn`` was already committed; nothing was written.
            InvalidKey: The conversation ID is malformed.
            StorageError: The backend failed, or the record is malformed; nothing or everything was written
                (read the head back to tell which), the call may be retried.
        """
        ...

    def acquire_lease(self, conversation_id: str, owner: str, ttl_s: float, *, now: float | None = None) -> bool:
        """Take the lease for ``ttl_s`` seconds unless another owner holds an unexpired one; True when taken.

        The owner that holds it may take it again (this extends it). An owner ``"<holder>/<turn>"`` takes over at
        once a lease of the same holder (its own earlier turn: before a restart, or one whose release failed), unless
        both are stamped by `new_lease_owner` and the lease's turn is the later one (a late attempt of an earlier turn
        then fails, rather than take the lease from the turn running now). A
        lease of another holder that expires more than ``ttl_s`` from now (a skewed clock, a bad row) is cut back
        to ``now + ttl_s``, so a conversation is never locked for longer than one ttl after its holder is gone.
        """
        ...

    def renew_lease(self, conversation_id: str, owner: str, ttl_s: float, *, now: float | None = None) -> bool:
        """Extend ``owner``'s lease to ``now + ttl_s``; False when ``owner`` no longer holds it."""
        ...

    def release_lease(self, conversation_id: str, owner: str) -> None:
        """Drop ``owner``'s lease; nothing happens if someone else holds it now."""
        ...

    def delete(self, conversation_id: str, *, expected_version: str | None = None) -> bool:
        """Forget the conversation; with ``expected_version``, only if the head is still there. True if deleted."""
        ...

    def scan(self, *, corrupt: list[HeadCorrupt] | None = None) -> Iterator[tuple[str, Head]]:
        """Yield every conversation that has a head, with the head, in no particular order.

        Args:
            corrupt: When given, a head that cannot be decoded is appended here and skipped instead of raised.

        Raises:
            HeadCorrupt: A head cannot be decoded and ``corrupt`` is None.
            StorageError: The backend failed.
        """
        ...

    def close(self) -> None:
        """Release connections; the store must not be used afterwards."""
        ...


# ----------------------------------------------------------------- transitions


class _Delete:
    """Marker returned by a transition to delete the record."""


DELETE = _Delete()
Transition = Callable[[Head | None], "Head | _Delete | None"]


def _new_version() -> str:
    # Random, so a head that returns to an earlier checkpoint (rewind) still gets a new version: no ABA.
    return secrets.token_hex(8)


def _cas(
    expected_version: str | None,
    checkpoint_id: bytes | None,
    history: Sequence[bytes],
    owner: str | None,
    release_lease: bool,
    max_history: int,
    now: float,
    turn: TurnRecord | None = None,
) -> Transition:
    def apply(record: Head | None) -> Head:
        if record is not None and record.malformed:
            raise StorageError(_malformed_message())
        current = record.version if record is not None else ""
        if expected_version is None and current:
            raise Conflict("the conversation already has a head; nothing was overwritten")
        if expected_version is not None and current != expected_version:
            raise Conflict(
                "another turn moved this conversation's head since it was read; nothing was overwritten "
                "(the newer head stays)"
            )
        holder = record.lease_owner if record is not None and record.lease_expires_at else None
        if owner is not None and holder != owner:
            raise Conflict(
                "this turn's lease on the conversation expired and another turn took it over; nothing was overwritten"
            )
        base = record or Head()
        if turn is not None and base.turn(turn.turn_id) is not None:
            raise Conflict(f"turn {turn.turn_id!r} was already committed; nothing was overwritten")
        lease = (None, 0.0, 0.0) if release_lease else (base.lease_owner, base.lease_expires_at, base.lease_renewed_at)
        return Head(
            checkpoint_id=None if checkpoint_id is None else bytes(checkpoint_id),
            history=tuple(bytes(h) for h in history)[:max_history],
            version=_new_version(),
            updated_at=now,
            lease_owner=lease[0],
            lease_expires_at=lease[1],
            turns=base.turns if turn is None else _record_turn(turn, base.turns),
            lease_renewed_at=lease[2],
        )

    return apply


def _record_turn(turn: TurnRecord, turns: tuple[TurnRecord, ...]) -> tuple[TurnRecord, ...]:
    """Put ``turn`` first; keep `MAX_TURN_IDS` IDs and the answers of the `MAX_TURN_ANSWERS` newest turns."""
    kept = (turn, *turns)[:MAX_TURN_IDS]
    return tuple(t if i < MAX_TURN_ANSWERS or t.answer is None else replace(t, answer=None) for i, t in enumerate(kept))


def turns_to_json(turns: Sequence[TurnRecord]) -> list[list[str | None]]:
    """The JSON form of a head's turns, as backends store it: ``[[turn_id, answer or null], ...]``.

    Where each turn started and what it produced go apart, in `turn_states_to_json`'s form: an earlier snapcell
    reading the same head (servers upgraded one by one) accepts only these pairs, and drops the rest when it writes.
    """
    return [[t.turn_id, t.answer] for t in turns]


def turn_states_to_json(turns: Sequence[TurnRecord]) -> dict[str, list[str | None]]:
    """Where the recorded turns started and what they produced: ``{turn_id: [started_from, checkpoint_id]}`` (hex).

    Keyed by turn ID, so a head rewritten by an earlier snapcell (which keeps the turns, not this) can never pair a
    turn with another turn's checkpoints: it only loses them.
    """
    return {
        t.turn_id: [None if t.started_from is None else t.started_from.hex(), t.checkpoint_id.hex()]
        for t in turns
        if t.checkpoint_id is not None
    }


def turns_from_json(value: object, states: object = None) -> tuple[TurnRecord, ...]:
    """Decode `turns_to_json`'s form, with `turn_states_to_json`'s when the head has it (None: it has not).

    Raises:
        TypeError: The value is not that form (the backend turns this into a `StorageError`).
        ValueError: A checkpoint ID is not hex.
    """
    if not isinstance(value, list):
        raise TypeError(f"turns is a {type(value).__name__}, not a list")
    if states is not None and not isinstance(states, dict):
        raise TypeError(f"turn states is a {type(states).__name__}, not an object")
    turns = []
    for item in value:
        if not (
            isinstance(item, list)
            and len(item) == 2
            and isinstance(item[0], str)
            and (item[1] is None or isinstance(item[1], str))
        ):
            raise TypeError("a recorded turn is not [turn_id, answer]")
        state = states.get(item[0]) if states is not None else None
        if state is None:
            turns.append(TurnRecord(item[0], item[1]))
            continue
        if not (
            isinstance(state, list)
            and len(state) == 2
            and (state[0] is None or isinstance(state[0], str))
            and isinstance(state[1], str)
        ):
            raise TypeError("a recorded turn's states are not [started_from, checkpoint_id]")
        started = None if state[0] is None else bytes.fromhex(state[0])
        turns.append(TurnRecord(item[0], item[1], checkpoint_id=bytes.fromhex(state[1]), started_from=started))
    return tuple(turns)


def _malformed_message(conversation_id: str = "") -> str:
    named = f" of conversation {conversation_id!r}" if conversation_id else ""
    return (
        f"the head{named} names checkpoints but has no version: it was not written by snapcell, or was edited; "
        "nothing was changed. Give it a version (any non-empty text) to continue it, or delete it to start afresh"
    )


class LeaseOnly:
    """A transition that changes only a record's lease, never its head: a store need not make it survive a power loss
    (every holder of a lease on that machine is gone then), as it must a head write (`SQLiteHeads`)."""

    __slots__ = ("_apply",)

    def __init__(self, apply: Transition) -> None:
        self._apply = apply

    def __call__(self, record: Head | None) -> Head | _Delete | None:
        return self._apply(record)


def _acquire(owner: str, ttl_s: float, now: float, *, renew_only: bool) -> Transition:
    holder = lease_holder(owner)

    def apply(record: Head | None) -> Head | None:
        mine = record is not None and record.lease_owner == owner and record.lease_expires_at > 0
        if renew_only and not mine:
            return None
        if record is not None and not mine and record.lease_held(now):
            if holder is not None and lease_holder(record.lease_owner) == holder:
                if not _outranks(owner, record.lease_owner):
                    return None  # a later turn of this holder holds it: this late attempt must not take it
                # else this holder's own earlier turn, whose release never landed: take it over now
            elif record.lease_expires_at > now + ttl_s:
                return replace(record, lease_expires_at=now + ttl_s)  # an absurd expiry: cut back, not taken
            else:
                return None
        return replace(record or Head(), lease_owner=owner, lease_expires_at=now + ttl_s, lease_renewed_at=now)

    return LeaseOnly(apply)


def _release(owner: str) -> Transition:
    def apply(record: Head | None) -> Head | _Delete | None:
        if record is None or record.lease_owner != owner:
            return None
        if not record.version and not record.malformed:
            return DELETE  # a lease-only record: nothing else to keep
        return replace(record, lease_owner=None, lease_expires_at=0.0, lease_renewed_at=0.0)

    return LeaseOnly(apply)


def _delete(expected_version: str | None, now: float, deleted: list[bool]) -> Transition:
    def apply(record: Head | None) -> Head | _Delete | None:
        deleted.clear()  # a backend may retry a transition after a lost race
        if record is None or (expected_version is not None and record.version != expected_version):
            return None
        if record.lease_held(now) and expected_version is not None:
            return None  # a turn is in progress: cleanup leaves the conversation to it
        deleted.append(True)
        return DELETE

    return apply


def _check_lease_args(owner: str, ttl_s: float) -> None:
    if not isinstance(owner, str) or not owner:
        raise ConfigError("a lease owner must be a non-empty string")
    if not isinstance(ttl_s, int | float) or ttl_s <= 0:
        raise ConfigError(f"a lease ttl must be a positive number of seconds, not {ttl_s!r}")


class RecordHeads:
    """The `HeadStore` methods over two primitives a backend supplies: ``_read`` and atomic ``_update``.

    ``_update(conversation_id, transition)`` reads the record, calls ``transition(record)`` and, atomically with the
    read, writes the result (a `Head`), deletes the record (`DELETE`) or writes nothing (None); it returns what was
    written, or None. A transition may raise `Conflict`, which propagates with nothing written.

    Args:
        max_history: Earlier checkpoint IDs kept per conversation (default 50).
        clock: Returns the current time in seconds; injectable for tests.
    """

    def __init__(self, *, max_history: int = DEFAULT_MAX_HISTORY, clock: Callable[[], float] = time.time) -> None:
        if not isinstance(max_history, int) or max_history < 0:
            raise ConfigError(f"max_history must be a non-negative integer, not {max_history!r}")
        self.max_history = max_history
        self.clock = clock
        # Test hook: called by `_update` with the record it read, before deciding and writing (still atomic with
        # both), so a test can make another instance write in between and check the race is caught.
        self._after_read: Callable[[str, Head | None], None] | None = None

    def _read(self, conversation_id: str) -> Head | None:
        raise NotImplementedError

    def _update(self, conversation_id: str, transition: Transition) -> Head | None:
        raise NotImplementedError

    def get(self, conversation_id: str) -> Head | None:
        """See `HeadStore.get`.

        Raises:
            StorageError: Also for a malformed record (checkpoints but no version); nothing is changed.
        """
        record = self._read(validate_conversation_id(conversation_id))
        if record is not None and record.malformed:
            raise StorageError(_malformed_message(conversation_id))
        return record if record is not None and record.version else None

    def record(self, conversation_id: str) -> Head | None:
        """Return the conversation's record as stored, also when it holds only a lease (then its version is ``""``)."""
        return self._read(validate_conversation_id(conversation_id))

    def compare_and_set(
        self,
        conversation_id: str,
        expected_version: str | None,
        checkpoint_id: bytes | None,
        *,
        history: Sequence[bytes] = (),
        owner: str | None = None,
        release_lease: bool = False,
        turn: TurnRecord | None = None,
    ) -> str:
        """See `HeadStore.compare_and_set`."""
        validate_conversation_id(conversation_id)
        if expected_version == "":
            raise ConfigError("expected_version must be a version read from the store, or None to create")
        if turn is not None:
            validate_turn_id(turn.turn_id)
        release = release_lease and owner is not None
        transition = _cas(
            expected_version, checkpoint_id, history, owner, release, self.max_history, self.clock(), turn
        )
        written = self._update(conversation_id, transition)
        if written is None:  # pragma: no cover - a CAS transition always writes or raises
            raise Conflict("the head could not be written; nothing was overwritten")
        return written.version

    def acquire_lease(self, conversation_id: str, owner: str, ttl_s: float, *, now: float | None = None) -> bool:
        """See `HeadStore.acquire_lease`."""
        validate_conversation_id(conversation_id)
        _check_lease_args(owner, ttl_s)
        now = self.clock() if now is None else now
        written = self._update(conversation_id, _acquire(owner, ttl_s, now, renew_only=False))
        return written is not None and written.lease_owner == owner

    def acquire_lease_and_get(self, conversation_id: str, owner: str, ttl_s: float) -> tuple[bool, Head | None]:
        """`acquire_lease`, and when it is taken the head as `get` would return it, read in the same transaction.

        One store round trip instead of two, for the turn that reads its head right after taking the lease.

        Returns:
            Whether the lease was taken, and the head then (None when not taken or before the first turn).

        Raises:
            StorageError: Also for a malformed record, as `get` raises it (the lease may have been taken).
        """
        validate_conversation_id(conversation_id)
        _check_lease_args(owner, ttl_s)
        written = self._update(conversation_id, _acquire(owner, ttl_s, self.clock(), renew_only=False))
        if written is None or written.lease_owner != owner:
            return False, None
        if written.malformed:
            raise StorageError(_malformed_message(conversation_id))
        return True, written if written.version else None

    def renew_lease(self, conversation_id: str, owner: str, ttl_s: float, *, now: float | None = None) -> bool:
        """See `HeadStore.renew_lease`."""
        validate_conversation_id(conversation_id)
        _check_lease_args(owner, ttl_s)
        now = self.clock() if now is None else now
        written = self._update(conversation_id, _acquire(owner, ttl_s, now, renew_only=True))
        return written is not None and written.lease_owner == owner

    def release_lease(self, conversation_id: str, owner: str) -> None:
        """See `HeadStore.release_lease`."""
        self._update(validate_conversation_id(conversation_id), _release(owner))

    def delete(self, conversation_id: str, *, expected_version: str | None = None) -> bool:
        """See `HeadStore.delete`."""
        deleted: list[bool] = []
        self._update(validate_conversation_id(conversation_id), _delete(expected_version, self.clock(), deleted))
        return bool(deleted)

    def close(self) -> None:
        """Nothing to release by default."""


class MemoryHeads(RecordHeads):
    """Heads in a dict, for tests and examples; safe across threads, not across processes.

    Args: as for `RecordHeads`.
    """

    def __init__(self, *, max_history: int = DEFAULT_MAX_HISTORY, clock: Callable[[], float] = time.time) -> None:
        super().__init__(max_history=max_history, clock=clock)
        self._records: dict[str, Head] = {}
        self._lock = threading.Lock()

    def _read(self, conversation_id: str) -> Head | None:
        with self._lock:
            return self._records.get(conversation_id)

    def _update(self, conversation_id: str, transition: Transition) -> Head | None:
        with self._lock:
            record = self._records.get(conversation_id)
            if self._after_read is not None:
                self._after_read(conversation_id, record)
            result = transition(record)
            if isinstance(result, _Delete):
                self._records.pop(conversation_id, None)
                return None
            if result is not None:
                self._records[conversation_id] = result
            return result

    def scan(self, *, corrupt: list[HeadCorrupt] | None = None) -> Iterator[tuple[str, Head]]:
        """See `HeadStore.scan`; memory heads are never corrupt."""
        with self._lock:
            items = [(cid, head) for cid, head in self._records.items() if head.version]
        return iter(items)

    def __repr__(self) -> str:
        return f"MemoryHeads({len(self._records)} conversations)"
