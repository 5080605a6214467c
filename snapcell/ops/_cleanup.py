"""The cleanup job (expiry and quota) and the usage report, as plain functions over a `Store`."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

from snapcell.errors import (
    CheckpointCorrupt,
    CheckpointNotFound,
    CheckpointVersionError,
    ConfigError,
    HeadCorrupt,
    SnapcellError,
)
from snapcell.heads import HeadStore
from snapcell.storage import DEFAULT_TTL_S, BulkDelete, LocalStore, ObjectInfo, Store, validate_prefix
from snapcell.telemetry import trace_cleanup

__all__ = [
    "DEFAULT_BLOB_GRACE_S",
    "DEFAULT_GRACE_S",
    "MIN_BLOB_GRACE_S",
    "MIN_GRACE_S",
    "CleanupReport",
    "DayUsage",
    "UsageReport",
    "cleanup",
    "format_bytes",
    "usage",
]

DEFAULT_GRACE_S = 3600.0
DEFAULT_BLOB_GRACE_S = 86400.0
# A checkpoint is written before its conversation's head moves to it, and a turn's blobs before its checkpoint:
# anything younger than the longest turn may be needed by a turn still running. Turns are bounded by the run's
# wall time (30 s by default), the dump, a few storage calls (10 s deadline each) and the lease wait (30 s); ten
# minutes leaves a wide margin.
MIN_GRACE_S = 600.0
# A dump reuses a stored blob without refreshing it while the blob is younger than snapcell.checkpoint's
# REFRESH_AFTER_S (6 h), so an unreferenced-looking blob that young may be about to be referenced again.
MIN_BLOB_GRACE_S = 6 * 3600.0 + MIN_GRACE_S
# A local write removes its temporary file within moments; one a day old was left by a crash.
_TEMP_FILE_AGE_S = 86400.0
_DAY_S = 86400.0
_BULK_BATCH = 1000


def format_bytes(n: int) -> str:
    """Render a byte count for people: ``1.5 GiB``."""
    if abs(n) < 1024:
        return f"{n} B"
    value = n / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


@dataclass(frozen=True, kw_only=True, slots=True)
class CleanupReport:
    """What a cleanup run found and deleted (or, with ``dry_run``, would delete).

    Attributes:
        store_url: The store that was cleaned.
        prefix: The prefix whose objects were eligible for deletion.
        dry_run: True when nothing was actually deleted.
        scanned_objects: Objects in the whole store.
        scanned_bytes: Their total size.
        deleted_expired_objects: Objects under the prefix deleted for being older than the ttl.
        deleted_expired_bytes: Their total size.
        deleted_quota_objects: Objects deleted, oldest first, to get under the quota.
        deleted_quota_bytes: Their total size.
        kept_objects: Objects left in the store.
        protected_objects: Objects under the prefix the quota pass could not delete (in ``keep`` or younger than
            the grace period).
        bytes_in_use_after: Total size of the objects left.
        quota_bytes: The quota, or ``None`` for no quota.
        over_quota: True when the store is still over the quota; the CLI then exits non-zero.
        deleted_keys: Every key deleted (or to delete), expired ones first.
        deleted_heads: Conversation heads deleted (or to delete) because their checkpoint expired.
        deleted_temp_files: Temporary files of interrupted writes deleted (or to delete); local stores only.
        skipped_heads: One line per conversation head that could not be read and was skipped (its checkpoints were
            not protected from the quota pass, and it was not deleted); the CLI then exits non-zero.
    """

    store_url: str
    prefix: str
    dry_run: bool
    scanned_objects: int
    scanned_bytes: int
    deleted_expired_objects: int
    deleted_expired_bytes: int
    deleted_quota_objects: int
    deleted_quota_bytes: int
    kept_objects: int
    protected_objects: int
    bytes_in_use_after: int
    quota_bytes: int | None
    over_quota: bool
    deleted_keys: tuple[str, ...] = field(default=(), repr=False)
    deleted_heads: int = 0
    deleted_blob_objects: int = 0
    deleted_blob_bytes: int = 0
    deleted_temp_files: int = 0
    skipped_heads: tuple[str, ...] = ()

    def to_json(self, *, include_keys: bool = False) -> str:
        """Return the report as one JSON object; the deleted keys only with ``include_keys``."""
        data = asdict(self)
        if include_keys:
            data["deleted_keys"] = list(self.deleted_keys)
        else:
            del data["deleted_keys"]
        return json.dumps(data, sort_keys=True)

    def summary(self) -> str:
        """Return the report as a few lines of text for people."""
        verb = "would delete" if self.dry_run else "deleted"
        lines = [
            f"store {self.store_url}{' (dry run: nothing deleted)' if self.dry_run else ''}",
            f"scanned  {self.scanned_objects} objects, {format_bytes(self.scanned_bytes)}",
            f"{verb:<8} {self.deleted_expired_objects} expired, {format_bytes(self.deleted_expired_bytes)}",
            f"{verb:<8} {self.deleted_quota_objects} over quota, {format_bytes(self.deleted_quota_bytes)}",
            f"{verb:<8} {self.deleted_blob_objects} unreferenced blobs, {format_bytes(self.deleted_blob_bytes)}",
            f"kept     {self.kept_objects} objects, {format_bytes(self.bytes_in_use_after)} in use"
            + (f" of a {format_bytes(self.quota_bytes)} quota" if self.quota_bytes is not None else ""),
        ]
        if self.deleted_heads:
            lines.append(f"{verb:<8} {self.deleted_heads} conversation heads whose checkpoints expired")
        if self.deleted_temp_files:
            lines.append(f"{verb:<8} {self.deleted_temp_files} temporary files left by interrupted writes")
        if self.skipped_heads:
            lines.append(
                f"SKIPPED  {len(self.skipped_heads)} unreadable conversation heads (their checkpoints were not "
                "protected from the quota); repair or delete them:"
            )
            lines += [f"  {problem}" for problem in self.skipped_heads]
        if self.over_quota:
            lines.append(
                f"OVER QUOTA: {self.protected_objects} objects under {self.prefix!r} are still needed (kept heads) "
                "or younger than the grace period; raise the quota or release heads"
            )
        return "\n".join(lines)


@trace_cleanup
def cleanup(
    store: Store,
    *,
    now: float | None = None,
    ttl_s: float = DEFAULT_TTL_S,
    quota_bytes: int | None = None,
    keep: Collection[str] = (),
    grace_s: float = DEFAULT_GRACE_S,
    dry_run: bool = False,
    prefix: str = "checkpoints/",
    progress: Callable[[int, int], None] | None = None,
    heads: HeadStore | None = None,
    key_of: Callable[[bytes], str] | None = None,
    blob_refs: Callable[[bytes], Collection[str]] | None = None,
    blob_prefix: str = "blobs/",
    blob_grace_s: float = DEFAULT_BLOB_GRACE_S,
    force: bool = False,
) -> CleanupReport:
    """Delete expired objects, then the oldest unneeded ones while the store is over its quota.

    First every object under ``prefix`` older than ``ttl_s`` goes (``keep`` does not save an expired object: its
    checkpoint cannot be loaded any more). Then, while the bytes of *all* objects in the store exceed
    ``quota_bytes``, objects under ``prefix`` go oldest first, skipping those in ``keep``. Nothing younger than
    ``grace_s`` is ever deleted, so a dump in progress is never raced. A key already gone is not an error, so two
    runs at once are safe. The whole plan is made from one listing before anything is deleted.

    A conversation head that cannot be decoded (`HeadCorrupt`) is skipped and named in the report's
    ``skipped_heads``; everything else still runs. Any other failure of the head store stops the cleanup before
    anything is deleted: without the heads, the quota pass could delete what conversations need.

    Args:
        store: The store to clean.
        now: Current time in seconds since the epoch (default: the clock); inject it to test expiry.
        ttl_s: Age in seconds past which an object has expired.
        quota_bytes: Byte budget for the whole store, or ``None`` for none.
        keep: Keys that must survive the quota pass (conversation heads).
        grace_s: Objects younger than this many seconds are never deleted.
        dry_run: Plan and report, delete nothing.
        prefix: Only objects under this prefix are ever deleted.
        progress: Called as ``progress(done, total)`` while deleting.
        heads: A head store whose conversations' current checkpoints and histories are added to ``keep``. A head
            that has not moved for ``ttl_s`` and whose current checkpoint is expired or gone is deleted (only if it
            is unchanged and no turn holds its lease at that moment).
        key_of: Maps a checkpoint ID to its storage key (``lambda i: pool.keyring.parse_id(i).storage_key``);
            required with ``heads``. IDs it rejects protect nothing.
        blob_refs: Maps a checkpoint's stored bytes to the names (content hashes) of the blobs it refers to
            (`snapcell.checkpoint.blob_keys_of`). With it, blobs under ``blob_prefix`` that no surviving
            checkpoint refers to and that are older than ``blob_grace_s`` are deleted (mark and sweep). Without
            it, blobs are never deleted. A blob is looked at once more right before its deletion and kept if a
            dump refreshed it meanwhile.
        blob_prefix: Where blobs live.
        blob_grace_s: Unreferenced blobs younger than this are kept (a dump writes its blobs before its
            checkpoint, and refreshes the blobs it reuses only every few hours).
        force: Accept ``grace_s`` below `MIN_GRACE_S` (10 min) and ``blob_grace_s`` below `MIN_BLOB_GRACE_S`
            (6 h 10 min); without it they are refused, since turns still running would lose their checkpoints or
            blobs. Use it only when no turn can be running. A dry run needs no ``force``.

    Returns:
        The report; ``over_quota`` tells whether the quota still is exceeded.

    Raises:
        ConfigError: A negative ttl, grace or quota, a grace below the floor without ``force``, or ``heads``
            without ``key_of``; nothing was deleted.
        InvalidKey: The prefix is malformed.
        StorageError: The store failed; the cleanup may be run again, it resumes where it stopped.
    """
    if ttl_s < 0 or grace_s < 0 or blob_grace_s < 0 or (quota_bytes is not None and quota_bytes < 0):
        raise ConfigError("ttl_s, grace_s, blob_grace_s and quota_bytes must not be negative")
    if not force and not dry_run:
        _check_grace(grace_s, blob_grace_s if blob_refs is not None else None)
    validate_prefix(prefix)
    now = time.time() if now is None else now
    objects = list(store.scan())
    keep_set = set(keep)
    stale_heads: list[tuple[str, str]] = []
    corrupt: list[HeadCorrupt] = []
    if heads is not None:
        if key_of is None:
            raise ConfigError("cleanup(heads=...) needs key_of=, which maps a checkpoint ID to its storage key")
        stale_heads = _collect_heads(
            heads, key_of, {o.key: o for o in objects}, keep_set, now=now, ttl_s=ttl_s, corrupt=corrupt
        )
    scanned_bytes = sum(o.size for o in objects)
    eligible = [o for o in objects if o.key.startswith(prefix) and now - o.created_at >= grace_s]
    expired = [o for o in eligible if now - o.created_at > ttl_s]
    expired_keys = {o.key for o in expired}
    in_use = scanned_bytes - sum(o.size for o in expired)

    over_quota_victims: list[ObjectInfo] = []
    if quota_bytes is not None and in_use > quota_bytes:
        candidates = sorted(
            (o for o in eligible if o.key not in expired_keys and o.key not in keep_set),
            key=lambda o: (o.created_at, o.key),
        )
        for info in candidates:
            if in_use <= quota_bytes:
                break
            over_quota_victims.append(info)
            in_use -= info.size

    victims = expired + over_quota_victims
    orphans: list[ObjectInfo] = []
    if blob_refs is not None:
        victim_set = {o.key for o in victims}
        survivors = [o for o in objects if o.key.startswith(prefix) and o.key not in victim_set]
        orphans = _orphan_blobs(store, objects, survivors, blob_refs, blob_prefix, now - blob_grace_s)
        in_use -= sum(o.size for o in orphans)
    deleted_heads = len(stale_heads)
    if not dry_run:
        _delete_all(store, [o.key for o in victims], progress)
        orphans = _delete_orphans(store, orphans, now - blob_grace_s)
        deleted_heads = sum(heads.delete(c, expected_version=v) for c, v in stale_heads) if heads is not None else 0

    temp_files = 0
    if isinstance(store, LocalStore):
        temp_files = store.reclaim_temp_files(_TEMP_FILE_AGE_S, now=now, dry_run=dry_run)

    victim_keys = expired_keys | {o.key for o in over_quota_victims}
    protected = sum(
        1
        for o in objects
        if o.key.startswith(prefix) and o.key not in victim_keys and (o.key in keep_set or now - o.created_at < grace_s)
    )
    return CleanupReport(
        store_url=store.url,
        prefix=prefix,
        dry_run=dry_run,
        scanned_objects=len(objects),
        scanned_bytes=scanned_bytes,
        deleted_expired_objects=len(expired),
        deleted_expired_bytes=sum(o.size for o in expired),
        deleted_quota_objects=len(over_quota_victims),
        deleted_quota_bytes=sum(o.size for o in over_quota_victims),
        kept_objects=len(objects) - len(victims),
        protected_objects=protected,
        bytes_in_use_after=in_use,
        quota_bytes=quota_bytes,
        over_quota=quota_bytes is not None and in_use > quota_bytes,
        deleted_keys=tuple(o.key for o in victims) + tuple(o.key for o in orphans),
        deleted_heads=deleted_heads,
        deleted_blob_objects=len(orphans),
        deleted_blob_bytes=sum(o.size for o in orphans),
        deleted_temp_files=temp_files,
        skipped_heads=tuple(str(exc) for exc in corrupt),
    )


def _check_grace(grace_s: float, blob_grace_s: float | None) -> None:
    """Refuse graces short enough to race turns still running (unless forced).

    Raises:
        ConfigError: Say which grace, its floor and why.
    """
    if grace_s < MIN_GRACE_S:
        raise ConfigError(
            f"a grace of {grace_s:g} s is below the {MIN_GRACE_S:g} s floor: a turn still running writes its "
            "checkpoint before its conversation's head points to it, so a shorter grace can delete it and lose the "
            "turn; use force (--force) only when no turn can be running"
        )
    if blob_grace_s is not None and blob_grace_s < MIN_BLOB_GRACE_S:
        raise ConfigError(
            f"a blob grace of {blob_grace_s:g} s is below the {MIN_BLOB_GRACE_S:g} s floor: a dump reuses stored blobs "
            "for hours without refreshing them and writes its new ones before its checkpoint, so a shorter grace "
            "can delete blobs a running or recent turn needs; use force (--force) only when no turn can be running"
        )


def _collect_heads(
    heads: HeadStore,
    key_of: Callable[[bytes], str],
    objects: dict[str, ObjectInfo],
    keep: set[str],
    *,
    now: float,
    ttl_s: float,
    corrupt: list[HeadCorrupt],
) -> list[tuple[str, str]]:
    """Add every head's checkpoints to ``keep``; return (conversation, version) of the heads that expired.

    Heads that cannot be decoded are appended to ``corrupt`` and skipped.
    """

    def key(checkpoint_id: bytes) -> str | None:
        try:
            return key_of(checkpoint_id)
        except SnapcellError:
            return None

    stale = []
    for conversation_id, head in heads.scan(corrupt=corrupt):
        current = key(head.checkpoint_id) if head.checkpoint_id is not None else None
        info = objects.get(current) if current is not None else None
        gone = current is not None and (info is None or now - info.created_at > ttl_s)
        if gone and now - head.updated_at > ttl_s:
            stale.append((conversation_id, head.version))
            continue
        for checkpoint_id in (head.checkpoint_id, *head.history):
            found = key(checkpoint_id) if checkpoint_id is not None else None
            if found is not None:
                keep.add(found)
    return stale


def _orphan_blobs(
    store: Store,
    objects: list[ObjectInfo],
    survivors: list[ObjectInfo],
    blob_refs: Callable[[bytes], Collection[str]],
    blob_prefix: str,
    cutoff: float,
) -> list[ObjectInfo]:
    """Blobs no surviving checkpoint refers to, last written before ``cutoff``.

    The blob listing comes from the same scan as the checkpoints; a blob written after it is not a candidate.
    A blob is matched by its name (the content hash, the last part of its key), whatever its namespace.

    Raises:
        StorageError: A checkpoint could not be read (other than gone): nothing is deleted, so a flaky store
            never makes live blobs look unreferenced.
    """
    validate_prefix(blob_prefix)
    candidates = [o for o in objects if o.key.startswith(blob_prefix) and o.created_at < cutoff]
    if not candidates:
        return []
    referenced: set[str] = set()
    for info in survivors:
        try:
            data = store.get(info.key)
        except CheckpointNotFound:
            continue  # deleted meanwhile (another cleanup): it protects nothing any more
        try:
            referenced.update(blob_refs(data))
        except CheckpointVersionError:
            return []  # written by another snapcell release: its blobs cannot be told apart, so keep them all
        except CheckpointCorrupt:
            continue  # not a loadable checkpoint: it protects nothing
    return [o for o in candidates if o.key.rsplit("/", 1)[-1] not in referenced]


def _delete_orphans(store: Store, orphans: list[ObjectInfo], cutoff: float) -> list[ObjectInfo]:
    """Delete orphan blobs, each looked at again first: a dump may have refreshed it since the listing."""
    deleted = []
    for info in orphans:
        current = next(iter(store.scan(info.key)), None)
        if current is None or current.key != info.key:
            continue
        if current.created_at >= cutoff:
            continue  # refreshed by a dump that reuses it
        store.delete(info.key)
        deleted.append(info)
    return deleted


def _delete_all(store: Store, keys: list[str], progress: Callable[[int, int], None] | None) -> None:
    if progress is not None and keys:
        progress(0, len(keys))
    step = _BULK_BATCH if isinstance(store, BulkDelete) else 1
    for start in range(0, len(keys), step):
        batch = keys[start : start + step]
        if isinstance(store, BulkDelete):
            store.delete_many(batch)
        else:
            store.delete(batch[0])
        if progress is not None:
            progress(start + len(batch), len(keys))


@dataclass(frozen=True, slots=True)
class DayUsage:
    """Objects and bytes written on one UTC day.

    Attributes:
        date: The day, ``YYYY-MM-DD`` (UTC).
        objects: Objects written that day.
        bytes: Their total size.
    """

    date: str
    objects: int
    bytes: int


@dataclass(frozen=True, kw_only=True, slots=True)
class UsageReport:
    """How much a store holds, per day, and what expires soon.

    Attributes:
        store_url: The store.
        prefix: The prefix the per-day figures cover.
        ttl_s: The ttl used for the expiry figures.
        days: Per-day figures under ``prefix``, oldest day first.
        total_objects: Objects under ``prefix``.
        total_bytes: Their total size.
        store_objects: Objects in the whole store (what a quota counts).
        store_bytes: Their total size.
        expired_objects: Objects under ``prefix`` already past the ttl (waiting for cleanup).
        expired_bytes: Their total size.
        expiring_24h_objects: Objects that will pass the ttl within the next 24 hours.
        expiring_24h_bytes: Their total size.
    """

    store_url: str
    prefix: str
    ttl_s: float
    days: tuple[DayUsage, ...]
    total_objects: int
    total_bytes: int
    store_objects: int
    store_bytes: int
    expired_objects: int
    expired_bytes: int
    expiring_24h_objects: int
    expiring_24h_bytes: int
    blob_objects: int = 0
    blob_bytes: int = 0

    def to_json(self) -> str:
        """Return the report as one JSON object."""
        return json.dumps(asdict(self), sort_keys=True)

    def summary(self) -> str:
        """Return the report as a small table for people."""
        lines = [f"store {self.store_url}, prefix {self.prefix!r}", f"{'day (UTC)':<12} {'objects':>9} {'bytes':>12}"]
        lines += [f"{d.date:<12} {d.objects:>9} {format_bytes(d.bytes):>12}" for d in self.days]
        lines.append(f"{'total':<12} {self.total_objects:>9} {format_bytes(self.total_bytes):>12}")
        if self.blob_objects:
            lines.append(f"blobs (large data, shared): {self.blob_objects} objects, {format_bytes(self.blob_bytes)}")
        if self.store_objects != self.total_objects:
            lines.append(f"whole store: {self.store_objects} objects, {format_bytes(self.store_bytes)}")
        lines.append(f"expired, awaiting cleanup: {self.expired_objects} objects, {format_bytes(self.expired_bytes)}")
        lines.append(
            f"expiring in the next 24 h: {self.expiring_24h_objects} objects, {format_bytes(self.expiring_24h_bytes)}"
        )
        return "\n".join(lines)


def usage(
    store: Store,
    *,
    now: float | None = None,
    ttl_s: float = DEFAULT_TTL_S,
    prefix: str = "checkpoints/",
    blob_prefix: str = "blobs/",
) -> UsageReport:
    """Count objects and bytes per UTC day of creation, in total, and expiring within 24 hours.

    Args:
        store: The store to inspect.
        now: Current time in seconds since the epoch (default: the clock).
        ttl_s: Age in seconds past which an object has expired.
        prefix: The prefix the per-day figures cover; ``""`` for everything.
        blob_prefix: Where blobs live; they are counted on a line of their own (they count toward the quota).

    Returns:
        The report.

    Raises:
        InvalidKey: The prefix is malformed.
        StorageError: The store failed; the call may be retried.
    """
    validate_prefix(prefix)
    now = time.time() if now is None else now
    per_day: dict[str, list[int]] = {}
    total = [0, 0]
    whole = [0, 0]
    expired = [0, 0]
    soon = [0, 0]
    blobs = [0, 0]
    for info in store.scan():
        whole[0] += 1
        whole[1] += info.size
        if info.key.startswith(blob_prefix):
            blobs[0] += 1
            blobs[1] += info.size
        if not info.key.startswith(prefix):
            continue
        day = datetime.fromtimestamp(info.created_at, UTC).date().isoformat()
        counts = per_day.setdefault(day, [0, 0])
        for bucket in (counts, total):
            bucket[0] += 1
            bucket[1] += info.size
        expires_at = info.created_at + ttl_s
        target = expired if expires_at < now else soon if expires_at <= now + _DAY_S else None
        if target is not None:
            target[0] += 1
            target[1] += info.size
    return UsageReport(
        store_url=store.url,
        prefix=prefix,
        ttl_s=ttl_s,
        days=tuple(DayUsage(day, n, b) for day, (n, b) in sorted(per_day.items())),
        total_objects=total[0],
        total_bytes=total[1],
        store_objects=whole[0],
        store_bytes=whole[1],
        expired_objects=expired[0],
        expired_bytes=expired[1],
        blob_objects=blobs[0],
        blob_bytes=blobs[1],
        expiring_24h_objects=soon[0],
        expiring_24h_bytes=soon[1],
    )
