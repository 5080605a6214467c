"""`Session`: the synchronous twin of `AsyncSession`, a thin wrapper running it on one event loop."""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Literal

from snapcell.checkpoint import Manifest
from snapcell.interpreter import PausedCall, RunResult
from snapcell.limits import Limits
from snapcell.workspace import FileInfo

if TYPE_CHECKING:
    from snapcell.session._session import AsyncSession

__all__ = ["Session"]

HostFunctions = Mapping[str, Callable[..., Any]]


class Session:
    """The synchronous twin of `AsyncSession`; see its methods for details.

    Create sessions with `Pool.checkout`.
    """

    def __init__(self, inner: AsyncSession, call: Callable[[Coroutine[Any, Any, Any]], Any]) -> None:
        self._inner = inner
        self._call = call

    @property
    def checkpoint_id(self) -> bytes | None:
        """ID of the checkpoint last loaded or dumped, if any."""
        return self._inner.checkpoint_id

    @property
    def checkpoint_bytes(self) -> int | None:
        """Size in bytes of the checkpoint last loaded or dumped, if any."""
        return self._inner.checkpoint_bytes

    @property
    def manifest(self) -> Manifest | None:
        """Manifest of the checkpoint last loaded or dumped, if any."""
        return self._inner.manifest

    def load_session(self, checkpoint_id: bytes | bytearray | str) -> None:
        """See `AsyncSession.load_session`."""
        self._call(self._inner.load_session(checkpoint_id))

    def run(
        self,
        code: str,
        *,
        external_lookup: HostFunctions | None = None,
        setup: bool = False,
        skip_type_check: bool = False,
        limits: Limits | None = None,
        then_dump: bool = False,
        pausing: Collection[str] | None = None,
        dump_first: bool = False,
        raise_on_lost: bool = False,
    ) -> RunResult:
        """See `AsyncSession.run`."""
        result: RunResult = self._call(
            self._inner.run(
                code,
                external_lookup=external_lookup,
                setup=setup,
                skip_type_check=skip_type_check,
                limits=limits,
                then_dump=then_dump,
                pausing=pausing,
                dump_first=dump_first,
                raise_on_lost=raise_on_lost,
            )
        )
        return result

    def resume(
        self,
        value: Any = None,
        *,
        error: BaseException | None = None,
        external_lookup: HostFunctions | None = None,
        skip_type_check: bool = False,
        limits: Limits | None = None,
    ) -> RunResult:
        """See `AsyncSession.resume`."""
        result: RunResult = self._call(
            self._inner.resume(
                value, error=error, external_lookup=external_lookup, skip_type_check=skip_type_check, limits=limits
            )
        )
        return result

    @property
    def paused(self) -> PausedCall | None:
        """See `AsyncSession.paused`."""
        return self._inner.paused

    def feed_run(
        self,
        code: str,
        *,
        external_lookup: HostFunctions | None = None,
        setup: bool = False,
        skip_type_check: bool = False,
        limits: Limits | None = None,
        dump_first: bool = False,
    ) -> Any:
        """See `AsyncSession.feed_run`."""
        return self._call(
            self._inner.feed_run(
                code,
                external_lookup=external_lookup,
                setup=setup,
                skip_type_check=skip_type_check,
                limits=limits,
                dump_first=dump_first,
            )
        )

    def dump(self, *, on_unpicklable: Literal["skip", "fail"] = "skip") -> bytes:
        """See `AsyncSession.dump`."""
        checkpoint_id: bytes = self._call(self._inner.dump(on_unpicklable=on_unpicklable))
        return checkpoint_id

    def reset(self) -> None:
        """See `AsyncSession.reset`."""
        self._call(self._inner.reset())

    def ping(self) -> bool:
        """See `AsyncSession.ping`."""
        alive: bool = self._call(self._inner.ping())
        return alive

    def write_file(self, path: str | os.PathLike[str], data: bytes | bytearray | memoryview) -> None:
        """See `AsyncSession.write_file`."""
        self._call(self._inner.write_file(path, data))

    def read_file(self, path: str | os.PathLike[str]) -> bytes:
        """See `AsyncSession.read_file`."""
        data: bytes = self._call(self._inner.read_file(path))
        return data

    def list_files(self) -> list[FileInfo]:
        """See `AsyncSession.list_files`."""
        listing: list[FileInfo] = self._call(self._inner.list_files())
        return listing
