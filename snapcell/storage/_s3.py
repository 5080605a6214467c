"""`S3Store`: objects in an S3 bucket (AWS or any S3-compatible service), and its lifecycle rule."""

from __future__ import annotations

import dataclasses
import importlib
import os
import random
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from snapcell.errors import (
    CheckpointNotFound,
    ConfigError,
    ObjectExists,
    StorageError,
    StorageTimeout,
    StorageUnavailable,
    map_exceptions,
)

from ._config import ENDPOINT_ENV, S3Config
from ._protocol import _DEADLINE, ObjectInfo, call_deadline, too_large, validate_key, validate_prefix

__all__ = ["S3Store", "install_lifecycle"]

_DELETE_BATCH = 1000
# What botocore's "standard" retry mode retries besides dropped connections: throttling and transient codes.
_RETRIED_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestThrottled",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
        "InternalError",
        "ServiceUnavailable",
    }
)
_DEADLINE_KEY = "snapcell_deadline"
# boto3 sessions by explicit credentials and region: a new session reads botocore's service data again (about 60 ms
# of CPU), a client from a kept one takes a few. Sessions from the default credential chain are not kept, so a
# store made later sees credentials changed meanwhile (the environment, a profile). Sessions are not thread-safe:
# clients are made under the lock.
_SESSIONS: dict[tuple[str | None, ...], Any] = {}
_SESSIONS_LOCK = threading.Lock()
_MAX_SESSIONS = 16
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


class _GiveUp(Exception):
    """Raised inside botocore by the retry hook when the call's deadline leaves no time for another attempt."""

    def __init__(self, attempts: int, cause: str) -> None:
        super().__init__(cause)
        self.attempts = attempts
        self.cause = cause


def _attempt_timeouts(cfg: S3Config) -> tuple[float, float]:
    """Connect and read timeouts of one attempt: the configured ones, cut so that the attempts fit the deadline."""
    if cfg.storage_timeout_s is None:
        return cfg.connect_timeout_s, cfg.read_timeout_s
    share = cfg.storage_timeout_s / cfg.max_attempts
    return min(cfg.connect_timeout_s, share / 3), min(cfg.read_timeout_s, share * 2 / 3)


def _backoff_s(attempts: int, throttled: bool) -> float:
    base = 0.5 if throttled else 0.1
    return min(5.0, base * 2.0 ** (attempts - 1)) * (0.5 + random.random() / 2)


class S3Store:
    """Store objects under ``s3://bucket/prefix``; writes are create-only with ``If-None-Match: *``.

    Objects larger than `S3Config.multipart_threshold_bytes` go up in parts. Listings use the
    ``list_objects_v2`` paginator. Transient errors (throttling, 5xx, dropped connections, timeouts) are retried
    with backoff, at most `S3Config.max_attempts` times and only while the call's deadline
    (`S3Config.storage_timeout_s`, or an enclosing `storage_deadline`) leaves room for a whole attempt: an
    unreachable or hanging endpoint fails with `StorageUnavailable` (`StorageTimeout` when time ran out) within the
    deadline, naming the operation, the key and the last error. A get or put of one object, a touch and a delete
    each get one deadline; a multipart upload and a listing get one per request (part, page).

    Args:
        bucket: The bucket name.
        prefix: Key prefix inside the bucket (no leading or trailing slash); the store's keys live under it.
        endpoint_url: S3 API endpoint for S3-compatible services; defaults to ``$SNAPCELL_S3_ENDPOINT_URL``, then
            to AWS.
        region_name: Region; defaults to boto3's usual chain.
        client: A ready boto3 S3 client to use instead of building one (the other connection settings are then
            ignored, except the deadline and the number of attempts, which this store enforces on the client while
            it is open). The caller keeps owning it: `close` leaves it open.
        max_attempts: Attempts per call, first try included; overrides ``config``.
        config: Connection settings; see `S3Config`.
        storage_timeout_s: Deadline of each call in seconds; overrides ``config``.

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
        storage_timeout_s: float | None = None,
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
        if storage_timeout_s is not None:
            changes["storage_timeout_s"] = storage_timeout_s
        if cfg.endpoint_url is None and "endpoint_url" not in changes and os.environ.get(ENDPOINT_ENV):
            changes["endpoint_url"] = os.environ[ENDPOINT_ENV]
        self.config = dataclasses.replace(cfg, **changes) if changes else cfg
        self.bucket = bucket
        self.prefix = prefix
        self._exceptions: Any = _import("botocore.exceptions")
        self._owns_client = client is None
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
            ((exc.ReadTimeoutError, exc.HTTPClientError, exc.IncompleteReadError), StorageUnavailable),
            (exc.BotoCoreError, StorageError),
        ]
        self._retryable = (exc.ConnectionError, exc.HTTPClientError)
        self._hint = f"check the endpoint URL ({where}), the network and the credentials"
        connect_s, read_s = _attempt_timeouts(self.config)
        self._attempt_s = connect_s + read_s
        events: Any = self.client.meta.events
        events.register_first("before-call.s3", self._stamp_deadline, unique_id=f"snapcell-deadline-{id(self)}")
        events.register_first("needs-retry.s3", self._retry_or_not, unique_id=f"snapcell-retry-{id(self)}")

    def _make_client(self) -> Any:
        boto3 = _import("boto3")
        botocore_config = _import("botocore.config")
        cfg = self.config
        connect_s, read_s = _attempt_timeouts(cfg)
        client_config = botocore_config.Config(
            connect_timeout=connect_s,
            read_timeout=read_s,
            # Retrying is this store's own hook (see _retry_or_not), which knows the call's deadline.
            retries={"mode": "standard", "total_max_attempts": 1},
            s3={"addressing_style": cfg.addressing_style},
        )
        key = (cfg.aws_access_key_id, cfg.aws_secret_access_key, cfg.aws_session_token, cfg.region_name)
        with _SESSIONS_LOCK:
            session = _SESSIONS.get(key) if cfg.aws_access_key_id else None
            if session is None:
                session = boto3.session.Session(
                    aws_access_key_id=cfg.aws_access_key_id,
                    aws_secret_access_key=cfg.aws_secret_access_key,
                    aws_session_token=cfg.aws_session_token,
                    region_name=cfg.region_name,
                )
                if cfg.aws_access_key_id:
                    if len(_SESSIONS) >= _MAX_SESSIONS:
                        del _SESSIONS[next(iter(_SESSIONS))]  # the oldest
                    _SESSIONS[key] = session
            # Each client has its own copy of the session's event hooks: this store's hooks stay its own.
            return session.client("s3", endpoint_url=cfg.endpoint_url, config=client_config)

    # ------------------------------------------------------------ deadline and retries

    def _stamp_deadline(self, context: dict[str, Any], **_: Any) -> None:
        """botocore ``before-call`` hook: give the API call its deadline, or fail it at once if none is left."""
        deadline = call_deadline(self.config.storage_timeout_s)
        if deadline is not None and deadline <= time.monotonic():
            raise _GiveUp(0, "its deadline had passed before the request was sent")
        context[_DEADLINE_KEY] = deadline

    def _retry_or_not(
        self,
        attempts: int,
        request_dict: dict[str, Any],
        response: tuple[Any, dict[str, Any]] | None = None,
        caught_exception: BaseException | None = None,
        **_: Any,
    ) -> float | bool | None:
        """botocore ``needs-retry`` hook, run before botocore's own: seconds to sleep before retrying, or False.

        Errors this store does not retry return None, so botocore's other handlers (its S3 region redirector)
        still see them; botocore's own retries are off on a client this store made.

        Raises:
            _GiveUp: The error is worth retrying, but the deadline leaves no room for a backoff and a whole attempt.
        """
        if caught_exception is not None:
            if not isinstance(caught_exception, self._retryable):
                return None
            cause, throttled = f"{type(caught_exception).__name__}: {caught_exception}", False
        elif response is not None:
            status = int(response[0].status_code)
            code = str(response[1].get("Error", {}).get("Code", ""))
            if status < 500 and status != 429 and code not in _RETRIED_CODES:
                return None
            cause, throttled = f"HTTP {status} {code}".rstrip(), status in (429, 503) or "Throttl" in code
        else:  # pragma: no cover - botocore always passes one of them
            return None
        if attempts >= self.config.max_attempts:
            return False
        delay = _backoff_s(attempts, throttled)
        deadline = request_dict.get("context", {}).get(_DEADLINE_KEY)
        if deadline is not None and deadline - time.monotonic() < delay + self._attempt_s:
            raise _GiveUp(attempts, cause)
        return delay

    #: This store enforces `timeout_s` itself, per request; `AsyncStore` adds no deadline of its own by default.
    enforces_deadline = True

    @property
    def timeout_s(self) -> float | None:
        """The deadline of each call in seconds (`S3Config.storage_timeout_s`)."""
        return self.config.storage_timeout_s

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
        """Translate botocore errors raised inside the block into snapcell storage errors, keeping the cause.

        The block gets one deadline (`S3Config.storage_timeout_s`, or an enclosing `storage_deadline` if earlier),
        shared by every request made inside it.
        """
        what = f"S3 {action} of {key!r} in {self.url}" if key else f"S3 {action} on {self.url}"
        limit = self.config.storage_timeout_s
        token = _DEADLINE.set(call_deadline(limit))
        try:
            with map_exceptions(self._transport_errors, f"{what} failed; {self._hint}"):
                try:
                    yield
                except self._exceptions.ClientError as exc:
                    raise self._client_error(exc, action, key) from exc
                except (self._exceptions.ConnectTimeoutError, self._exceptions.ReadTimeoutError) as exc:
                    # Timeouts are always retried: this one ended the last attempt the store allows.
                    raise StorageTimeout(
                        f"{what} timed out on each of its {self.config.max_attempts} attempt(s): {exc}; {self._hint}",
                        operation=action,
                        key=key,
                        timeout_s=limit if limit is not None else 0.0,
                        attempts=self.config.max_attempts,
                    ) from exc
                except _GiveUp as exc:
                    timeout_s = limit if limit is not None else 0.0
                    raise StorageTimeout(
                        f"{what} gave up after {exc.attempts} attempt(s): no time was left for another within its "
                        f"deadline ({timeout_s:g} s or the caller's); last error: {exc.cause}; {self._hint}",
                        operation=action,
                        key=key,
                        timeout_s=timeout_s,
                        attempts=exc.attempts,
                    ) from exc
        finally:
            _DEADLINE.reset(token)

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
        meta = exc.response.get("ResponseMetadata", {})
        status = meta.get("HTTPStatusCode", 0)
        if isinstance(status, int) and (status >= 500 or status == 429):
            attempts = int(meta.get("RetryAttempts", 0)) + 1
            return StorageUnavailable(f"{what} failed after {attempts} attempt(s) with a server error ({code}): {exc}")
        return StorageError(f"{what} failed ({code or status}): {exc}")

    # ------------------------------------------------------------ operations

    def put(
        self, key: str, data: bytes | bytearray, *, expires_at: float | None = None, overwrite: bool = False
    ) -> None:
        """See `Store.put`; ``expires_at`` is kept as object metadata (``snapcell-expires-at``).

        An object appears whole or not at all. When an attempt's answer is lost (the connection dropped after S3
        stored the object) and the retry finds the key taken, the stored bytes are compared with ``data``: the
        put succeeds if they are this put's own.
        """
        full = self._full(validate_key(key))
        metadata = {"snapcell-expires-at": f"{expires_at:.3f}"} if expires_at is not None else {}
        if len(data) > self.config.multipart_threshold_bytes:
            self._put_multipart(key, full, data, metadata, overwrite=overwrite)
            return
        with self._errors("put", key):
            extra = {} if overwrite else {"IfNoneMatch": "*"}
            try:
                self._client.put_object(Bucket=self.bucket, Key=full, Body=data, Metadata=metadata, **extra)
            except self._exceptions.ClientError as exc:
                retried = exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0)
                code = exc.response.get("Error", {}).get("Code")
                if not (retried and code in _EXISTS and self._holds(full, data)):
                    raise

    def _holds(self, full: str, data: bytes | bytearray) -> bool:
        """Whether the object at ``full`` is exactly ``data``."""
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=full)
        except self._exceptions.ClientError:
            return False
        body = response["Body"]
        try:
            return bytes(body.read()) == data
        finally:
            body.close()

    def _put_multipart(
        self, key: str, full: str, data: bytes | bytearray, metadata: dict[str, str], *, overwrite: bool
    ) -> None:
        # The transfer manager does not pass IfNoneMatch through (s3transfer 0.19 rejects it in ExtraArgs), and a
        # head-then-upload check would race. CompleteMultipartUpload accepts If-None-Match itself, so drive the
        # parts directly: the object appears only if the key is still free when the upload completes. Each request
        # gets its own deadline: a large upload may take longer than one.
        with self._errors("put (start multipart upload)", key):
            upload = self._client.create_multipart_upload(Bucket=self.bucket, Key=full, Metadata=metadata)
        upload_id = upload["UploadId"]
        try:
            parts = []
            step = self.config.multipart_part_bytes
            for number, start in enumerate(range(0, len(data), step), start=1):
                with self._errors(f"put (part {number})", key):
                    response = self._client.upload_part(
                        Bucket=self.bucket,
                        Key=full,
                        UploadId=upload_id,
                        PartNumber=number,
                        Body=data[start : start + step],
                    )
                parts.append({"PartNumber": number, "ETag": response["ETag"]})
            extra = {} if overwrite else {"IfNoneMatch": "*"}
            with self._errors("put (complete multipart upload)", key):
                try:
                    self._client.complete_multipart_upload(
                        Bucket=self.bucket, Key=full, UploadId=upload_id, MultipartUpload={"Parts": parts}, **extra
                    )
                except self._exceptions.ClientError as exc:
                    retried = exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0)
                    if not (retried and self._holds(full, data)):
                        raise
        except Exception:
            try:
                self._client.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload_id)
            except (self._exceptions.BotoCoreError, self._exceptions.ClientError, _GiveUp):
                pass  # the original failure matters more; the lifecycle rule reaps abandoned uploads
            raise

    def get(self, key: str) -> bytes:
        """See `Store.get`; a body cut off mid-transfer is fetched again, within the same deadline."""
        full = self._full(validate_key(key))
        with self._errors("get", key):
            attempts = 0
            while True:
                attempts += 1
                response = self._client.get_object(Bucket=self.bucket, Key=full)
                body = response["Body"]
                try:
                    return bytes(body.read())
                except (self._exceptions.HTTPClientError, self._exceptions.IncompleteReadError) as exc:
                    # The request itself was retried by botocore; the body is read after it returned.
                    deadline = _DEADLINE.get()
                    left = None if deadline is None else deadline - time.monotonic()
                    if attempts >= self.config.max_attempts:
                        raise
                    delay = _backoff_s(attempts, False)
                    if left is not None and left < delay + self._attempt_s:
                        raise _GiveUp(attempts, f"{type(exc).__name__}: {exc}") from exc
                    time.sleep(delay)
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
        """See `Store.scan`; pages through ``list_objects_v2`` (1,000 keys a page) lazily, one deadline per page."""
        validate_prefix(prefix)
        return self._scan(prefix)

    def _scan(self, prefix: str) -> Iterator[ObjectInfo]:
        base = f"{self.prefix}/" if self.prefix else ""
        request: dict[str, Any] = {"Bucket": self.bucket, "Prefix": base + prefix}
        while True:
            # Never yield inside _errors: its deadline must not leak into the caller's context between pages.
            with self._errors("scan", prefix or None):
                page = self._client.list_objects_v2(**request)
            for item in page.get("Contents", ()):
                key = item["Key"][len(base) :]
                yield ObjectInfo(key=key, size=int(item["Size"]), created_at=item["LastModified"].timestamp())
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return
            request["ContinuationToken"] = token

    def close(self) -> None:
        """Close the client's connection pool if this store made the client; a client passed in stays open."""
        events: Any = self.client.meta.events
        events.unregister("before-call.s3", unique_id=f"snapcell-deadline-{id(self)}")
        events.unregister("needs-retry.s3", unique_id=f"snapcell-retry-{id(self)}")
        close = getattr(self._client, "close", None)
        if self._owns_client and callable(close):
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
