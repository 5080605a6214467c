"""Backend settings and `open_store`, which picks a backend from a URL."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from snapcell.errors import ConfigError

if TYPE_CHECKING:
    from ._protocol import Store

__all__ = ["ENDPOINT_ENV", "S3Config", "open_store"]

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
        connect_timeout_s: Seconds to wait for a TCP connection.
        read_timeout_s: Seconds to wait for data on an open connection.
        max_attempts: Attempts per call, first try included; retries back off and cover throttling, 5xx and dropped
            connections.
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
    multipart_threshold_bytes: int = 8 * _MiB
    multipart_part_bytes: int = 8 * _MiB
    addressing_style: str = "auto"

    def __post_init__(self) -> None:
        if self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise ConfigError("S3 timeouts must be positive numbers of seconds")
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
) -> Store:
    """Open the store a URL names.

    ``file:///abs/path`` and ``file://rel/path`` (relative to the working directory) and plain paths open a
    `LocalStore`; ``s3://bucket/prefix`` an `S3Store`; ``memory://`` or ``memory://name`` a new, empty
    `MemoryStore`.

    Args:
        url: Where the store lives.
        endpoint_url: S3 only: the S3 API endpoint (default ``$SNAPCELL_S3_ENDPOINT_URL``, then AWS).
        region_name: S3 only: the bucket's region.
        s3: S3 only: full connection settings.
        client: S3 only: a ready boto3 S3 client.
        now: Memory only: the clock stamping ``created_at``.

    Returns:
        The store; close it with ``close()`` when done.

    Raises:
        ConfigError: Unknown scheme, malformed URL, an option the backend does not take, or boto3 missing for S3.
    """
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
        if parts.query or parts.fragment or not parts.netloc:
            raise ConfigError(f"malformed S3 URL {url!r}; expected s3://bucket/prefix")
        return S3Store(
            parts.netloc,
            unquote(parts.path).strip("/"),
            endpoint_url=endpoint_url,
            region_name=region_name,
            client=client,
            config=s3,
        )
    if scheme == "file":
        _refuse(url, s3_options=s3_options, now=now is not None)
        from ._local import LocalStore

        if not rest:
            raise ConfigError(f"file store URL {url!r} has no path")
        return LocalStore(Path(unquote(rest)))
    if scheme == "memory":
        _refuse(url, s3_options=s3_options)
        from ._memory import MemoryStore

        return MemoryStore(rest, now=now or time.time)
    raise ConfigError(f"unknown store scheme {scheme!r} in {url!r}; valid forms: {_SCHEMES}")


def _refuse(url: str, **given: bool) -> None:
    names = {"s3_options": "endpoint_url/region_name/s3/client", "now": "now"}
    for option, present in given.items():
        if present:
            raise ConfigError(f"option {names[option]} does not apply to the store {url!r}")
