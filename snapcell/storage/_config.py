"""Backend settings and `open_store`, which picks a backend from a URL."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, unquote, urlsplit

from snapcell.errors import ConfigError

from ._protocol import check_timeout_s

if TYPE_CHECKING:
    from ._protocol import Store

__all__ = ["DEFAULT_STORAGE_TIMEOUT_S", "ENDPOINT_ENV", "S3Config", "open_store"]

DEFAULT_STORAGE_TIMEOUT_S = 10.0

ENDPOINT_ENV = "SNAPCELL_S3_ENDPOINT_URL"
_SCHEMES = "file:///absolute/path, file://relative/path, s3://bucket/prefix, memory:// or a plain directory path"
_MiB = 1024 * 1024


@dataclass(frozen=True, kw_only=True, slots=True)
class S3Config:
    """Connection settings for `S3Store`; ``None`` means boto3's usual chain (environment, profile, instance role).

    Attributes:
        endpoint_url: S3 API endpoint for S3-compatible services (MinIO, R2, moto...); ``None`` is AWS, or
            ``$SNAPCELL_S3_ENDPOINT_URL`` when set.
        region_name: Region of the bucket.
        aws_access_key_id: Explicit access key id, instead of the credential chain.
        aws_secret_access_key: Explicit secret key, with ``aws_access_key_id``.
        aws_session_token: Session token for temporary credentials.
        connect_timeout_s: Most seconds one attempt waits for a TCP connection.
        read_timeout_s: Most seconds one attempt waits for data on an open connection.
        max_attempts: Attempts per call, first try included; retries back off and cover throttling, 5xx, timeouts
            and dropped connections.
        storage_timeout_s: Deadline of each store call in seconds, connection, reads, retries and backoff included
            (default 10); a call that cannot finish by then fails with `StorageTimeout`. Each attempt's connect and
            read timeouts are cut to a third and two thirds of ``storage_timeout_s / max_attempts``, so that every
            attempt fits, and a retry starts only if the deadline leaves room for its backoff and a whole attempt.
            ``None`` means no deadline.
        multipart_threshold_bytes: Objects larger than this go up as multipart uploads.
        multipart_part_bytes: Size of each part of a multipart upload (S3 requires at least 5 MiB).
        addressing_style: ``"auto"``, ``"path"`` or ``"virtual"`` bucket addressing.
    """

    endpoint_url: str | None = None
    region_name: str | None = None
    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = None
    aws_session_token: str | None = None
    connect_timeout_s: float = 2.0
    read_timeout_s: float = 10.0
    max_attempts: int = 3
    storage_timeout_s: float | None = DEFAULT_STORAGE_TIMEOUT_S
    multipart_threshold_bytes: int = 8 * _MiB
    multipart_part_bytes: int = 8 * _MiB
    addressing_style: str = "auto"

    def __post_init__(self) -> None:
        if self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise ConfigError("S3 timeouts must be positive numbers of seconds")
        check_timeout_s(self.storage_timeout_s)
        if not 1 <= self.max_attempts <= 10:
            raise ConfigError(f"max_attempts must be between 1 and 10, not {self.max_attempts}")
        if self.multipart_part_bytes < 5 * _MiB:
            raise ConfigError(f"multipart_part_bytes must be at least 5 MiB, not {self.multipart_part_bytes}")
        if self.multipart_threshold_bytes < self.multipart_part_bytes:
            raise ConfigError("multipart_threshold_bytes must be at least multipart_part_bytes")
        if self.addressing_style not in ("auto", "path", "virtual"):
            raise ConfigError(f"addressing_style must be 'auto', 'path' or 'virtual', not {self.addressing_style!r}")
        if (self.aws_access_key_id is None) != (self.aws_secret_access_key is None):
            raise ConfigError("give both aws_access_key_id and aws_secret_access_key, or neither")


def open_store(
    url: str,
    *,
    endpoint_url: str | None = None,
    region_name: str | None = None,
    s3: S3Config | None = None,
    client: object | None = None,
    now: Callable[[], float] | None = None,
    storage_timeout_s: float | None = None,
) -> Store:
    """Open the store a URL names.

    ``file:///abs/path`` and ``file://rel/path`` (relative to the working directory) and plain paths open a
    `LocalStore`; ``s3://bucket/prefix`` an `S3Store`; ``memory://`` or ``memory://name`` a new, empty
    `MemoryStore`. An S3 URL may carry the deadline as a query: ``s3://bucket/prefix?storage_timeout_s=5``.

    Args:
        url: Where the store lives.
        endpoint_url: S3 only: the S3 API endpoint (default ``$SNAPCELL_S3_ENDPOINT_URL``, then AWS).
        region_name: S3 only: the bucket's region.
        s3: S3 only: full connection settings.
        client: S3 only: a ready boto3 S3 client.
        now: Memory only: the clock stamping ``created_at``.
        storage_timeout_s: Deadline of each store call in seconds (S3: default 10, enforced by the store itself;
            local: none by default, enforced for async callers by `AsyncStore`). Overrides the URL's and ``s3``'s.

    Returns:
        The store; close it with ``close()`` when done.

    Raises:
        ConfigError: Unknown scheme, malformed URL, an option the backend does not take, an invalid timeout, or
            boto3 missing for S3.
    """
    check_timeout_s(storage_timeout_s)
    if not isinstance(url, str) or not url:
        raise ConfigError(f"store URL must be a non-empty string; valid forms: {_SCHEMES}")
    scheme, sep, rest = url.partition("://")
    if not sep:
        if url.startswith(("s3:", "file:", "memory:")):
            raise ConfigError(f"malformed store URL {url!r}; valid forms: {_SCHEMES}")
        scheme, rest = "file", url
    scheme = scheme.lower()
    s3_options = endpoint_url is not None or region_name is not None or s3 is not None or client is not None
    if scheme == "s3":
        _refuse(url, now=now is not None)
        from ._s3 import S3Store

        parts = urlsplit(url)
        if parts.fragment or not parts.netloc:
            raise ConfigError(f"malformed S3 URL {url!r}; expected s3://bucket/prefix")
        if storage_timeout_s is None and parts.query:
            storage_timeout_s = _query_timeout(url, parts.query)
        return S3Store(
            parts.netloc,
            unquote(parts.path).strip("/"),
            endpoint_url=endpoint_url,
            region_name=region_name,
            client=client,
            config=s3,
            storage_timeout_s=storage_timeout_s,
        )
    if scheme == "file":
        _refuse(url, s3_options=s3_options, now=now is not None)
        from ._local import LocalStore

        if not rest:
            raise ConfigError(f"file store URL {url!r} has no path")
        return LocalStore(Path(unquote(rest)), timeout_s=storage_timeout_s)
    if scheme == "memory":
        _refuse(url, s3_options=s3_options, storage_timeout_s=storage_timeout_s is not None)
        from ._memory import MemoryStore

        return MemoryStore(rest, now=now or time.time)
    raise ConfigError(f"unknown store scheme {scheme!r} in {url!r}; valid forms: {_SCHEMES}")


def _query_timeout(url: str, query: str) -> float:
    """The ``storage_timeout_s`` of an S3 URL's query, the only parameter it may have."""
    try:
        params = dict(parse_qsl(query, keep_blank_values=True, strict_parsing=True))
        if set(params) != {"storage_timeout_s"}:
            raise ValueError(f"unknown parameters {sorted(set(params) - {'storage_timeout_s'})}")
        seconds = float(params["storage_timeout_s"])
        check_timeout_s(seconds)
    except (ValueError, ConfigError) as exc:
        raise ConfigError(
            f"malformed S3 URL {url!r}: the only query parameter is storage_timeout_s=<seconds> ({exc})"
        ) from exc
    return seconds


def _refuse(url: str, **given: bool) -> None:
    names = {"s3_options": "endpoint_url/region_name/s3/client", "now": "now", "storage_timeout_s": "storage_timeout_s"}
    for option, present in given.items():
        if present:
            raise ConfigError(f"option {names[option]} does not apply to the store {url!r}")
