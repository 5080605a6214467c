"""Command-line subcommands for storage: ``cleanup``, ``usage`` and ``s3 setup``."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from snapcell.errors import ConfigError, StorageError
from snapcell.heads import HeadStore, open_heads
from snapcell.ops import DEFAULT_BLOB_GRACE_S, DEFAULT_GRACE_S, MIN_BLOB_GRACE_S, MIN_GRACE_S, cleanup, usage
from snapcell.sandbox import reclaim_scratch_dirs
from snapcell.storage import DEFAULT_TTL_S, LocalStore, Store, open_store

__all__ = [
    "EXIT_CONFIG",
    "EXIT_HEADS_SKIPPED",
    "EXIT_OK",
    "EXIT_OVER_QUOTA",
    "EXIT_STORAGE",
    "add_commands",
    "format_duration",
    "parse_duration",
    "parse_size",
]

EXIT_OK = 0
EXIT_OVER_QUOTA = 1
EXIT_CONFIG = 2
EXIT_STORAGE = 3
DEFAULT_STORE_URL = "file://.snapcell"  # the other commands' default store
EXIT_HEADS_SKIPPED = 4

_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*\Z", re.IGNORECASE)
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """Parse ``90s``, ``30m``, ``12h``, ``7d``, ``2w`` or plain seconds into seconds.

    Raises:
        ConfigError: The text is not a duration.
    """
    match = _DURATION.match(text)
    if not match:
        raise ConfigError(f"invalid duration {text!r}: use a number with s, m, h, d or w, like 90s, 12h or 7d")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2).lower()]


def format_duration(seconds: float) -> str:
    """Write a duration as people type one: ``6h10m``, ``10m``, ``7d``, ``90s`` (whole seconds)."""
    rest = round(seconds)
    parts: list[str] = []
    for unit in ("d", "h", "m", "s"):
        size = _DURATION_UNITS[unit]
        if rest >= size or (unit == "s" and not parts):
            parts.append(f"{rest // size}{unit}")
            rest %= size
    return "".join(parts)


def parse_size(text: str) -> int:
    """Parse ``10GiB`` (powers of 1024), ``500MB`` (powers of 1000) or plain bytes into bytes.

    Every unit of pydantic's ``ByteSize`` is understood (B, KB to EB, KiB to EiB, their first letters, bits), and
    ``2Gi`` (as Kubernetes writes it) as ``2GiB``. A fraction of a byte is dropped.

    Raises:
        ConfigError: The text is not a size, or has more after it (``5MB of RAM``).
    """
    from pydantic import ByteSize, TypeAdapter, ValidationError

    # ByteSize reads a size at the start of its text and ignores what follows: here the text is the size.
    match = re.fullmatch(rf"{ByteSize.byte_string_pattern}\s*", text, re.IGNORECASE)
    try:
        if match is None:
            raise ValueError(text)
        number, unit = match.groups()
        return int(TypeAdapter(ByteSize).validate_python(f"{number}{unit}B" if unit and unit[-1] in "iI" else text))
    except (ValueError, ValidationError) as exc:
        raise ConfigError(
            f"invalid size {text!r}: use bytes or a number with KB, MB, GB, TB, KiB, MiB, GiB or TiB"
        ) from exc


def _arg(parse: Any) -> Any:
    """Wrap a parser so argparse shows its message (a plain ValueError would become "invalid value")."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    convert.__name__ = parse.__name__.removeprefix("parse_")
    return convert


class _Progress:
    """Report ``done/total`` on a stream: one rewritten line on a terminal, a line every few seconds otherwise."""

    def __init__(self, stream: TextIO, label: str, *, interval_s: float | None = None) -> None:
        self._stream = stream
        self._label = label
        self._tty = stream.isatty()
        self._interval_s = interval_s if interval_s is not None else (0.1 if self._tty else 5.0)
        self._last = 0.0
        self._open = False

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self._last < self._interval_s:
            return
        self._last = now
        percent = 100 * done // total if total else 100
        if self._tty:
            self._stream.write(f"\r{self._label}: {done}/{total} ({percent}%)")
            self._open = done < total
            if not self._open:
                self._stream.write("\n")
        else:
            self._stream.write(f"{self._label}: {done}/{total} ({percent}%)\n")
        self._stream.flush()

    def finish(self) -> None:
        if self._open:
            self._stream.write("\n")
            self._open = False


def add_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``cleanup``, ``usage`` and ``s3 setup`` on a CLI's subparsers.

    Each parser sets ``func``, which takes the parsed arguments and returns the exit code: 0 on success, 1 when
    cleanup leaves the store over its quota, 2 for a bad URL or option, 3 when the store fails, 4 when cleanup
    finished but skipped conversation heads it could not read.

    Args:
        subparsers: What ``ArgumentParser.add_subparsers()`` returned.
    """
    p = subparsers.add_parser(
        "cleanup",
        help="delete expired checkpoints and keep a store under its quota",
        description="Delete checkpoints older than the ttl, then the oldest unneeded ones while over the quota.",
    )
    _store_args(p)
    p.add_argument(
        "--ttl",
        type=_arg(parse_duration),
        default=DEFAULT_TTL_S,
        help=f"checkpoint lifetime ({format_duration(DEFAULT_TTL_S)})",
    )
    p.add_argument("--quota", type=_arg(parse_size), default=None, help="byte budget for the store (10GiB, 500MB)")
    # One key per flag: several after one flag would take the store URL that follows as a key too.
    p.add_argument("--keep", action="append", default=[], metavar="KEY", help="a key never deleted (repeatable)")
    p.add_argument(
        "--grace",
        type=_arg(parse_duration),
        default=DEFAULT_GRACE_S,
        help=f"minimum age to delete ({format_duration(DEFAULT_GRACE_S)})",
    )
    p.add_argument(
        "--blob-grace",
        type=_arg(parse_duration),
        default=DEFAULT_BLOB_GRACE_S,
        help=f"minimum age of an unreferenced blob to delete ({format_duration(DEFAULT_BLOB_GRACE_S)})",
    )
    p.add_argument("--dry-run", action="store_true", help="report what would be deleted, delete nothing")
    p.add_argument(
        "--force",
        action="store_true",
        help=f"accept --grace below {format_duration(MIN_GRACE_S)} and --blob-grace below "
        f"{format_duration(MIN_BLOB_GRACE_S)} "
        "(only when no turn can be running: a running turn's checkpoint or blobs could be deleted)",
    )
    p.add_argument(
        "--heads",
        default=None,
        metavar="URL",
        help="head store whose conversations are kept (sqlite:///path, s3://bucket/prefix, "
        "postgresql://user@host/dbname); needs the signing key",
    )
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(func=_run_cleanup)

    p = subparsers.add_parser("usage", help="objects and bytes per day, and what expires soon")
    _store_args(p, default=DEFAULT_STORE_URL)
    p.add_argument(
        "--ttl",
        type=_arg(parse_duration),
        default=DEFAULT_TTL_S,
        help=f"checkpoint lifetime ({format_duration(DEFAULT_TTL_S)})",
    )
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(func=_run_usage)

    s3 = subparsers.add_parser("s3", help="S3 administration")
    s3_commands = s3.add_subparsers(dest="s3_command", required=True, metavar="COMMAND")
    p = s3_commands.add_parser("setup", help="install the bucket lifecycle rule that expires checkpoints")
    p.add_argument("store_url", metavar="STORE_URL", help="s3://bucket/prefix")
    p.add_argument(
        "--ttl",
        type=_arg(parse_duration),
        default=DEFAULT_TTL_S,
        help=f"checkpoint lifetime ({format_duration(DEFAULT_TTL_S)})",
    )
    p.add_argument("--endpoint-url", default=None, help="S3 API endpoint (default $SNAPCELL_S3_ENDPOINT_URL)")
    p.set_defaults(func=_run_s3_setup)


def _store_args(p: argparse.ArgumentParser, default: str | None = None) -> None:
    if default is None:
        p.add_argument("store_url", metavar="STORE_URL", help="file:///path, s3://bucket/prefix or a directory")
    else:
        p.add_argument(
            "store_url",
            metavar="STORE_URL",
            nargs="?",
            default=default,
            help=f"file:///path, s3://bucket/prefix or a directory (default {default})",
        )
    p.add_argument("--prefix", default="checkpoints/", help="prefix of the checkpoints (checkpoints/)")
    p.add_argument("--endpoint-url", default=None, help="S3 API endpoint (default $SNAPCELL_S3_ENDPOINT_URL)")


def _open(args: argparse.Namespace) -> Store:
    if args.endpoint_url is not None:
        return open_store(args.store_url, endpoint_url=args.endpoint_url)
    return open_store(args.store_url)


def _open_existing(args: argparse.Namespace) -> Store:
    """Open the store for cleanup or usage: a local store must already exist (a typo must not report 0 objects).

    Raises:
        ConfigError: The URL is invalid, or names a local directory that does not exist.
    """
    store = _open(args)
    if isinstance(store, LocalStore) and not store.root.is_dir():
        store.close()
        raise ConfigError(f"no store at {store.url}: the directory {store.root} does not exist; check the path")
    return store


def _fail(command: str, exc: Exception) -> int:
    print(f"snapcell {command}: error: {exc}", file=sys.stderr)
    return EXIT_CONFIG if isinstance(exc, ConfigError) else EXIT_STORAGE


def _run_cleanup(args: argparse.Namespace) -> int:
    progress = _Progress(sys.stderr, "deleting")
    try:
        store = _open_existing(args)
        heads: HeadStore | None = None
        try:
            heads, key_of = _open_heads(args, store)
            report = cleanup(
                store,
                ttl_s=args.ttl,
                quota_bytes=args.quota,
                keep=args.keep,
                grace_s=args.grace,
                dry_run=args.dry_run,
                prefix=args.prefix,
                progress=progress,
                heads=heads,
                key_of=key_of,
                blob_refs=_blob_refs(),
                blob_grace_s=args.blob_grace,
                force=args.force,
            )
        finally:
            progress.finish()
            if heads is not None:
                heads.close()
            store.close()
    except (ConfigError, StorageError) as exc:
        return _fail("cleanup", exc)
    print(report.to_json() if args.json else report.summary())
    # Worker scratch directories of snapcell hosts on this machine that were killed before closing their pool.
    reclaimed = reclaim_scratch_dirs(dry_run=args.dry_run)
    if reclaimed and not args.json:
        verb = "would remove" if args.dry_run else "removed"
        print(
            f"{verb:<8} {len(reclaimed)} worker scratch director{'y' if len(reclaimed) == 1 else 'ies'} of dead hosts"
        )
    if report.skipped_heads:
        for problem in report.skipped_heads:
            print(f"snapcell cleanup: skipped a head: {problem}", file=sys.stderr)
        return EXIT_HEADS_SKIPPED
    return EXIT_OVER_QUOTA if report.over_quota else EXIT_OK


def _blob_refs() -> Callable[[bytes], list[str]]:
    """How cleanup reads which blobs a checkpoint refers to (the checkpoint format is not storage's business)."""
    from snapcell.checkpoint import blob_keys_of

    return blob_keys_of


_DEFAULT_HEADS = ".heads.sqlite3"


def _open_heads(args: argparse.Namespace, store: Store) -> tuple[HeadStore | None, Callable[[bytes], str] | None]:
    """The ``--heads`` store, and how to map its IDs to keys (with the pool's signing key: env, or the local secret)."""
    if args.heads is None and isinstance(store, LocalStore) and (store.root / _DEFAULT_HEADS).exists():
        # The run_code tool keeps heads here by default: without them, --quota would delete the checkpoints
        # conversations point to right now.
        args.heads = f"sqlite://{store.root / _DEFAULT_HEADS}"
        print(f"snapcell cleanup: keeping conversation heads from {args.heads}", file=sys.stderr)
    if args.heads is None:
        return None, None
    from snapcell.checkpoint import ENV_SIGNING_KEY
    from snapcell.pool import resolve_keyring

    if isinstance(store, LocalStore) and not os.environ.get(ENV_SIGNING_KEY):
        if not (store.root / ".snapcell-signing-key").exists():
            # A key generated now would match no head: every head would protect nothing from --quota.
            raise ConfigError(
                f"--heads needs the signing key the sessions used, and {store.url} has none; set {ENV_SIGNING_KEY}"
            )
    try:
        keyring = resolve_keyring(store, None)
    except ConfigError as exc:  # its text speaks to a program creating a pool, not to a command-line user
        raise ConfigError(
            f"--heads needs the signing key the sessions used, and none is set for {store.url}: run it as "
            f"{ENV_SIGNING_KEY}=KEY snapcell cleanup ... (comma-separate several keys after a rotation)"
        ) from exc
    options = {"endpoint_url": args.endpoint_url} if args.endpoint_url and args.heads.startswith("s3://") else {}
    # must_exist: a mistyped path would otherwise be a new, empty head store that protects nothing from --quota.
    return open_heads(
        args.heads, must_exist=True, **options
    ), lambda checkpoint_id: keyring.parse_id(checkpoint_id).storage_key


def _run_usage(args: argparse.Namespace) -> int:
    try:
        store = _open_existing(args)
        try:
            report = usage(store, ttl_s=args.ttl, prefix=args.prefix)
        finally:
            store.close()
    except (ConfigError, StorageError) as exc:
        return _fail("usage", exc)
    print(report.to_json() if args.json else report.summary())
    return EXIT_OK


def _run_s3_setup(args: argparse.Namespace) -> int:
    from snapcell.storage import S3Store, install_lifecycle

    try:
        if not args.store_url.startswith("s3://"):
            raise ConfigError(f"s3 setup needs an s3://bucket/prefix URL, not {args.store_url!r}")
        store = _open(args)
        try:
            if not isinstance(store, S3Store):  # pragma: no cover - open_store maps s3:// to S3Store
                raise ConfigError(f"{args.store_url!r} is not an S3 store")
            rules = install_lifecycle(store, ttl_days=max(1, math.ceil(args.ttl / 86400)))
        finally:
            store.close()
    except (ConfigError, StorageError) as exc:
        return _fail("s3 setup", exc)
    for rule in rules:
        days = rule["Expiration"]["Days"]
        print(
            f"installed lifecycle rule {rule['ID']!r} on bucket {store.bucket!r}: "
            f"objects under {rule['Filter']['Prefix']!r} expire after {days} days"
        )
    print(json.dumps(rules, indent=2, sort_keys=True))
    return EXIT_OK
