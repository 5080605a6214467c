"""Opening stores by URL: the one module that knows every store backend.

`open_store` lives here, above the backends, so no backend module imports the module that imports it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, unquote, urlsplit

from snapcell.errors import ConfigError

from ._config import S3Config
from ._protocol import check_timeout_s

if TYPE_CHECKING:
    from ._protocol import Store

__all__ = ["open_store"]

_SCHEMES = "file:///absolute/path, file://relative/path, s3://bucket/prefix, memory:// or a plain directory path"


def open_store(
    url: str,
    *,
    endpoint_url: str | None = None,
    region_name: str | None = None,
    s3: S3Config | None = None,
    client: object | None = None,
    now: Callable[[], float] | None = None,
    storage_timeout_s: float | None = None,
    create: bool = False,
) -> Store:
    """Open the store a URL names.

    ``file:///abs/path`` and ``file://rel/path`` (relative to the working directory) and plain paths open a
    `LocalStore`; ``s3://bucket/prefix`` an `S3Store`; ``memory://`` or ``memory://name`` a new, empty
    `MemoryStore`. An S3 URL may carry the deadline as a query: ``s3://bucket/prefix?storage_timeout_s=5``.

    A local store's directory must exist unless ``create`` is True, so a mistyped path (``"memory"`` without
    ``://``, ``".snapcel"``) is an error rather than a new, empty store. ``~`` is not expanded (a URL is not a
    shell): a path starting with it is refused.

    Args:
        url: Where the store lives.
        endpoint_url: S3 only: the S3 API endpoint (default ``$SNAPCELL_S3_ENDPOINT_URL``, then AWS).
        region_name: S3 only: the bucket's region.
        s3: S3 only: full connection settings.
        client: S3 only: a ready boto3 S3 client.
        now: Memory only: the clock stamping ``created_at``.
        storage_timeout_s: Deadline of each store call in seconds (S3: default 10, enforced by the store itself;
            local: none by default, enforced for async callers by `AsyncStore`). Overrides the URL's and ``s3``'s.
        create: Local only: make the directory (and its parents) when it does not exist, for a new store.

    Returns:
        The store; close it with ``close()`` when done.

    Raises:
        ConfigError: Unknown scheme, malformed URL, an option the backend does not take, an invalid timeout,
            boto3 missing for S3, a local directory that does not exist (without ``create``) or is a file, or a
            local path starting with ``~``.
    """
    check_timeout_s(storage_timeout_s)
    if not isinstance(url, str) or not url:
        raise ConfigError(f"store URL must be a non-empty string; valid forms: {_SCHEMES}")
    scheme, sep, rest = url.partition("://")
    plain = not sep
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
        path = unquote(rest)
        if path.startswith("~"):
            raise ConfigError(
                f"the store path {path!r} starts with '~', which is not expanded in a store URL; "
                "write the absolute path instead (file:///home/me/store)"
            )
        store = LocalStore(Path(path), timeout_s=storage_timeout_s)
        _check_directory(url, store.root, create=create, plain=plain)
        return store
    if scheme == "memory":
        _refuse(url, s3_options=s3_options, storage_timeout_s=storage_timeout_s is not None)
        from ._memory import MemoryStore

        return MemoryStore(rest, now=now or time.time)
    raise ConfigError(f"unknown store scheme {scheme!r} in {url!r}; valid forms: {_SCHEMES}")


def _check_directory(url: str, root: Path, *, create: bool, plain: bool) -> None:
    """Refuse a local store whose directory does not exist (unless ``create``: make it) or is not a directory."""
    if root.is_dir():
        return
    if root.exists() or root.is_symlink():
        raise ConfigError(f"the store {url!r} is not a directory: {root} is a file or a broken link")
    if create:
        from snapcell._support import make_dirs

        try:
            make_dirs(root)
        except OSError as exc:
            raise ConfigError(f"cannot create the store {url!r} at {root}: {exc.strerror or exc}") from exc
        return
    hint = f" (did you mean {url}:// ?)" if plain and url.lower() in ("memory", "s3") else ""
    raise ConfigError(
        f"no store at file://{root}{hint}: the directory {root} does not exist, so it is not a snapcell store; "
        "check the path, or make a new store there with create=True (on the command line: --create)"
    )


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
