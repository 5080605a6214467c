"""Backend settings (`S3Config`); `open_store` in `_open` picks a backend from a URL."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from snapcell.errors import ConfigError

from ._protocol import check_timeout_s

if TYPE_CHECKING:
    pass

__all__ = ["DEFAULT_STORAGE_TIMEOUT_S", "ENDPOINT_ENV", "S3Config"]

DEFAULT_STORAGE_TIMEOUT_S = 10.0

ENDPOINT_ENV = "SNAPCELL_S3_ENDPOINT_URL"
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
