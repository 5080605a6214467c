"""`S3Store`: objects in an S3 bucket (AWS or any S3-compatible service), and its lifecycle rule."""

from __future__ import annotations

import dataclasses
import importlib
import io
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from snapcell.errors import (
    CheckpointNotFound,
    ConfigError,
    ObjectExists,
    StorageError,
    StorageUnavailable,
    map_exceptions,
)

from ._config import ENDPOINT_ENV, S3Config
from ._protocol import ObjectInfo, too_large, validate_key, validate_prefix

__all__ = ["S3Store", "install_lifecycle"]

_DELETE_BATCH = 1000
_NOT_FOUND = frozenset({"NoSuchKey", "404", "NotFound"})
_EXISTS = frozenset({"PreconditionFailed", "412", "ConditionalRequestConflict"})
_UNAVAILABLE = {
    "AccessDenied": "check the credentials' permissions on the bucket",
    "403": "check the credentials' permissions on the bucket",
    "Forbidden": "check the credentials' permissions on the bucket",
    "AllAccessDisabled": "check the credentials' permissions on the bucket",
    "InvalidAccessKeyId": "check the AWS access key id (AWS_ACCESS_KEY_ID or the profile)",
    "SignatureDoesNotMatch": "check the AWS secret access key and the region",
    "ExpiredToken": "refresh the session credentials",
    "InvalidToken": "check the session token",
    "NoSuchBucket": "check the bucket name, or create the bucket",
    "PermanentRedirect": "check the region (region_name / AWS_DEFAULT_REGION)",
    "AuthorizationHeaderMalformed": "check the region (region_name / AWS_DEFAULT_REGION)",
}


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"S3 storage needs boto3, which is not installed: pip install 'snapcell[s3]' ({exc})"
        ) from exc


class S3Store:
    """Store objects under ``s3://bucket/prefix``; writes are create-only with ``If-None-Match: *``.

    Objects larger than `S3Config.multipart_threshold_bytes` go up in parts. Listings use the
    ``list_objects_v2`` paginator. Transient errors (throttling, 5xx, dropped connections) are retried by botocore
    in "standard" mode, a bounded number of times with backoff, and every call has bounded timeouts, so an
    unreachable endpoint fails with `StorageUnavailable` in seconds.

    Args:
        bucket: The bucket name.
        prefix: Key prefix inside the bucket (no leading or trailing slash); the store's keys live under it.
        endpoint_url: S3 API endpoint for S3-compatible services; defaults to ``$SNAPCELL_S3_ENDPOINT_URL``, then
            to AWS.
        region_name: Region; defaults to boto3's usual chain.
        client: A ready boto3 S3 client to use instead of building one (the other connection settings are then
            ignored).
        max_attempts: Attempts per call, first try included; overrides ``config``.
        config: Connection settings; see `S3Config`.

    Raises:
        ConfigError: boto3 is missing, or the bucket, prefix or settings are invalid.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        client: object | None = None,
        max_attempts: int | None = None,
        config: S3Config | None = None,
    ) -> None:
        if not bucket or "/" in bucket:
            raise ConfigError(f"invalid S3 bucket name {bucket!r}")
        prefix = prefix.strip("/")
        if prefix:
            validate_key(prefix)
        cfg = config or S3Config()
        changes: dict[str, Any] = {}
        if endpoint_url is not None:
            changes["endpoint_url"] = endpoint_url
        if region_name is not None:
            changes["region_name"] = region_name
        if max_attempts is not None:
            changes["max_attempts"] = max_attempts
        if cfg.endpoint_url is None and "endpoint_url" not in changes and os.environ.get(ENDPOINT_ENV):
            changes["endpoint_url"] = os.environ[ENDPOINT_ENV]
        self.config = dataclasses.replace(cfg, **changes) if changes else cfg
        self.bucket = bucket
        self.prefix = prefix
        self._exceptions: Any = _import("botocore.exceptions")
        self._client: Any = client if client is not None else self._make_client()
        self._transport_errors: list[tuple[type[BaseException] | tuple[type[BaseException], ...], type[StorageError]]]
        exc = self._exceptions
        where = self.config.endpoint_url or "the AWS endpoint"
        self._transport_errors = [
            (
                (exc.NoCredentialsError, exc.PartialCredentialsError, exc.CredentialRetrievalError),
                StorageUnavailable,
            ),
            ((exc.EndpointConnectionError, exc.ConnectTimeoutError, exc.ConnectionError), StorageUnavailable),
            ((exc.ReadTimeoutError, exc.HTTPClientError), StorageUnavailable),
            (exc.BotoCoreError, StorageError),
        ]
        self._hint = f"check the endpoint URL ({where}), the network and the credentials"

    def _make_client(self) -> Any:
        boto3 = _import("boto3")
        botocore_config = _import("botocore.config")
        cfg = self.config
        session = boto3.session.Session(
            aws_access_key_id=cfg.aws_access_key_id,
            aws_secret_access_key=cfg.aws_secret_access_key,
            aws_session_token=cfg.aws_session_token,
            region_name=cfg.region_name,
        )
        client_config = botocore_config.Config(
            connect_timeout=cfg.connect_timeout_s,
            read_timeout=cfg.read_timeout_s,
            retries={"mode": "standard", "max_attempts": cfg.max_attempts},
            s3={"addressing_style": cfg.addressing_style},
        )
        return session.client("s3", endpoint_url=cfg.endpoint_url, config=client_config)

    @property
    def url(self) -> str:
        """``s3://bucket/prefix``."""
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    @property
    def client(self) -> Any:
        """The underlying boto3 S3 client."""
        return self._client

    def _full(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    @contextmanager
    def _errors(self, action: str, key: str | None = None) -> Iterator[None]:
        """Translate botocore errors raised inside the block into snapcell storage errors, keeping the cause."""
        with map_exceptions(self._transport_errors, f"S3 {action} on {self.url} failed; {self._hint}"):
            try:
                yield
            except self._exceptions.ClientError as exc:
                raise self._client_error(exc, action, key) from exc

    def _client_error(self, exc: Any, action: str, key: str | None) -> StorageError:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        what = f"S3 {action} of {key!r} in {self.url}" if key else f"S3 {action} on {self.url}"
        if code in _NOT_FOUND and key is not None:
            return CheckpointNotFound(f"no object {key!r} in {self.url}", key=key)
        if code in _EXISTS and key is not None:
            return ObjectExists(f"object {key!r} already exists in {self.url}; checkpoints are never overwritten")
        if code in _UNAVAILABLE:
            return StorageUnavailable(f"{what} was refused ({code}): {_UNAVAILABLE[code]}; {exc}")
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if isinstance(status, int) and status >= 500:
            return StorageUnavailable(f"{what} failed after retries with a server error ({code}): {exc}")
        return StorageError(f"{what} failed ({code or status}): {exc}")

    # ------------------------------------------------------------ operations

    def put(
        self, key: str, data: bytes | bytearray, *, expires_at: float | None = None, overwrite: bool = False
    ) -> None:
        """See `Store.put`; ``expires_at`` is kept as object metadata (``snapcell-expires-at``)."""
        full = self._full(validate_key(key))
        metadata = {"snapcell-expires-at": f"{expires_at:.3f}"} if expires_at is not None else {}
        with self._errors("put", key):
            if len(data) <= self.config.multipart_threshold_bytes:
                extra = {} if overwrite else {"IfNoneMatch": "*"}
                self._client.put_object(Bucket=self.bucket, Key=full, Body=data, Metadata=metadata, **extra)
            elif overwrite:
                transfer = _import("boto3.s3.transfer")
                part = self.config.multipart_part_bytes
                transfer_config = transfer.TransferConfig(
                    multipart_threshold=self.config.multipart_threshold_bytes, multipart_chunksize=part
                )
                self._client.upload_fileobj(
                    io.BytesIO(data), self.bucket, full, ExtraArgs={"Metadata": metadata}, Config=transfer_config
                )
            else:
                self._put_multipart_create_only(full, data, metadata)

    def _put_multipart_create_only(self, full: str, data: bytes | bytearray, metadata: dict[str, str]) -> None:
        # The transfer manager does not pass IfNoneMatch through (s3transfer 0.19 rejects it in ExtraArgs), and a
        # head-then-upload check would race. CompleteMultipartUpload accepts If-None-Match itself, so drive the
        # parts directly: the object appears only if the key is still free when the upload completes.
        upload = self._client.create_multipart_upload(Bucket=self.bucket, Key=full, Metadata=metadata)
        upload_id = upload["UploadId"]
        try:
            parts = []
            step = self.config.multipart_part_bytes
            for number, start in enumerate(range(0, len(data), step), start=1):
                response = self._client.upload_part(
                    Bucket=self.bucket, Key=full, UploadId=upload_id, PartNumber=number, Body=data[start : start + step]
                )
                parts.append({"PartNumber": number, "ETag": response["ETag"]})
            self._client.complete_multipart_upload(
                Bucket=self.bucket, Key=full, UploadId=upload_id, MultipartUpload={"Parts": parts}, IfNoneMatch="*"
            )
        except Exception:
            try:
                self._client.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload_id)
            except (self._exceptions.BotoCoreError, self._exceptions.ClientError):
                pass  # the original failure matters more; the lifecycle rule reaps abandoned uploads
            raise

    def get(self, key: str) -> bytes:
        """See `Store.get`."""
        full = self._full(validate_key(key))
        with self._errors("get", key):
            response = self._client.get_object(Bucket=self.bucket, Key=full)
            body = response["Body"]
            try:
                return bytes(body.read())
            finally:
                body.close()

    def get_at_most(self, key: str, max_bytes: int) -> bytes:
        """See `BoundedGet.get_at_most`: refused by the response's length, before its body is read."""
        full = self._full(validate_key(key))
        with self._errors("get", key):
            response = self._client.get_object(Bucket=self.bucket, Key=full)
            body = response["Body"]
            try:
                size = int(response.get("ContentLength", 0))
                if size > max_bytes:
                    raise too_large(key, size, max_bytes, self.url)
                data = bytes(body.read())
            finally:
                body.close()
        if len(data) > max_bytes:
            raise too_large(key, len(data), max_bytes, self.url)
        return data

    def touch(self, key: str) -> None:
        """See `Store.touch`: copy the object onto itself, which resets its LastModified (and lifecycle age).

        S3 refuses a copy onto itself that changes nothing, so the copy replaces the metadata: with the object's
        own metadata (``snapcell-expires-at`` and the like) plus a ``snapcell-touched`` marker, read just before.
        """
        full = self._full(validate_key(key))
        with self._errors("touch", key):
            head = self._client.head_object(Bucket=self.bucket, Key=full)
            extra = {"ContentType": head["ContentType"]} if head.get("ContentType") else {}
            self._client.copy_object(
                Bucket=self.bucket,
                Key=full,
                CopySource={"Bucket": self.bucket, "Key": full},
                MetadataDirective="REPLACE",
                Metadata={**head.get("Metadata", {}), "snapcell-touched": "1"},
                **extra,
            )

    def delete(self, key: str) -> None:
        """See `Store.delete`; S3 deletes are idempotent already."""
        full = self._full(validate_key(key))
        with self._errors("delete", key):
            self._client.delete_object(Bucket=self.bucket, Key=full)

    def delete_many(self, keys: Sequence[str]) -> None:
        """Delete several keys with ``DeleteObjects``, 1,000 per request; missing keys are not an error.

        Raises:
            InvalidKey: A key is malformed; nothing was deleted.
            StorageError: S3 refused some deletions (the first error is reported); the call may be retried.
        """
        full = [self._full(validate_key(key)) for key in keys]
        for start in range(0, len(full), _DELETE_BATCH):
            batch = [{"Key": key} for key in full[start : start + _DELETE_BATCH]]
            with self._errors("delete"):
                response = self._client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
            errors = [e for e in response.get("Errors", ()) if e.get("Code") not in _NOT_FOUND]
            if errors:
                first = errors[0]
                raise StorageError(
                    f"S3 refused to delete {len(errors)} objects from {self.url}, "
                    f"first {first.get('Key')!r}: {first.get('Code')} {first.get('Message', '')}"
                )

    def scan(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """See `Store.scan`; pages through ``list_objects_v2`` (1,000 keys a page) lazily."""
        validate_prefix(prefix)
        return self._scan(prefix)

    def _scan(self, prefix: str) -> Iterator[ObjectInfo]:
        base = f"{self.prefix}/" if self.prefix else ""
        paginator = self._client.get_paginator("list_objects_v2")
        with self._errors("list"):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=base + prefix):
                for item in page.get("Contents", ()):
                    key = item["Key"][len(base) :]
                    yield ObjectInfo(key=key, size=int(item["Size"]), created_at=item["LastModified"].timestamp())

    def close(self) -> None:
        """Close the client's connection pool."""
        close = getattr(self._client, "close", None)
        if callable(close):
            close()

    def __repr__(self) -> str:
        return f"S3Store({self.url!r}, endpoint_url={self.config.endpoint_url!r})"


def install_lifecycle(
    store: S3Store, *, ttl_days: int = 7, prefix: str = "checkpoints/", blob_prefix: str | None = "blobs/"
) -> list[dict[str, Any]]:
    """Install bucket lifecycle rules: checkpoints expire ``ttl_days + 1`` days after writing, blobs ``ttl_days + 2``.

    Each rule covers ``<store prefix>/<prefix>``, also aborts multipart uploads left incomplete for a day, and
    replaces any earlier rule with the same ID while keeping rules with other IDs. Lifecycle deletion may be days
    late; snapcell still refuses expired checkpoints at load time from their signed creation time. Blobs get one
    more day: a dump refreshes every blob it reuses once a day, so no blob a live checkpoint needs ever expires.

    Args:
        store: The S3 store whose bucket gets the rules.
        ttl_days: Checkpoint time-to-live in days.
        prefix: Prefix of the checkpoints inside the store.
        blob_prefix: Prefix of the blobs inside the store; None installs no blob rule.

    Returns:
        The rules that were installed (checkpoints first), as S3 returns them.

    Raises:
        ConfigError: ``ttl_days`` or a prefix is invalid.
        StorageUnavailable: The bucket is missing or the credentials may not change its lifecycle.
        StorageError: Any other S3 failure.
    """
    if not isinstance(ttl_days, int) or ttl_days < 1:
        raise ConfigError(f"ttl_days must be a whole number of days >= 1, not {ttl_days!r}")
    wanted = [(prefix, ttl_days + 1)] + ([(blob_prefix, ttl_days + 2)] if blob_prefix is not None else [])
    new_rules = []
    for rule_prefix, days in wanted:
        validate_prefix(rule_prefix)
        full_prefix = (f"{store.prefix}/" if store.prefix else "") + rule_prefix
        new_rules.append(
            {
                "ID": f"snapcell-expire-{full_prefix.rstrip('/') or 'all'}".replace("/", "-")[:255],
                "Filter": {"Prefix": full_prefix},
                "Status": "Enabled",
                "Expiration": {"Days": days},
                "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1},
            }
        )
    client = store.client
    with store._errors("get lifecycle configuration"):
        try:
            existing = client.get_bucket_lifecycle_configuration(Bucket=store.bucket).get("Rules", [])
        except store._exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "NoSuchLifecycleConfiguration":
                raise
            existing = []
    ids = {rule["ID"] for rule in new_rules}
    rules = [r for r in existing if r.get("ID") not in ids] + new_rules
    with store._errors("put lifecycle configuration"):
        client.put_bucket_lifecycle_configuration(Bucket=store.bucket, LifecycleConfiguration={"Rules": rules})
    return new_rules
