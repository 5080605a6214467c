"""What a turn's checkout may ask for: the heavy modules (numpy, pandas) its code and its checkpoint name.

A worker forked from a zygote that imported numpy and pandas costs more CPU to fork and to end than one from a zygote
that did not (a larger address space to copy and to unmap), and most namespaces need neither. The pool picks the
zygote before the checkout, so before the checkpoint is read: the tool remembers, for the checkpoints its turns
loaded or wrote, which heavy modules their manifests name, and adds those the turn's code names. A checkpoint it has
not seen (another process wrote it) gets the pool's default worker. It is a guess for speed only: a session that
imports a module anyway gets it on demand.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import TYPE_CHECKING

from snapcell.wire import heavy_modules_named

if TYPE_CHECKING:
    from snapcell.checkpoint import Manifest
    from snapcell.session import AsyncSession

__all__ = ["ModuleHints"]

# Checkpoints remembered (about 100 bytes each): a server's recent conversations.
MAX_KEPT = 4096


class ModuleHints:
    """The heavy modules each recently loaded or written checkpoint's manifest names, newest last.

    Args:
        max_kept: Checkpoints remembered; the least recently used are forgotten first.
    """

    def __init__(self, max_kept: int = MAX_KEPT) -> None:
        self._kept: OrderedDict[bytes, frozenset[str]] = OrderedDict()
        self._max_kept = max_kept

    def hint(self, checkpoint_id: bytes | None, code: str) -> frozenset[str] | None:
        """The heavy modules a turn from ``checkpoint_id`` (None: an empty session) running ``code`` may need.

        None when the checkpoint is unknown here: the checkout takes the pool's default worker.
        """
        named: frozenset[str] = frozenset()
        if checkpoint_id is not None:
            kept = self._kept.get(checkpoint_id)
            if kept is None:
                return None
            self._kept.move_to_end(checkpoint_id)
            named = kept
        return named | heavy_modules_named([code])

    def learn(self, session: AsyncSession) -> None:
        """Remember what the manifest of ``session``'s checkpoint (the one it loaded or wrote last) names."""
        checkpoint_id, manifest = session.checkpoint_id, session.manifest
        if checkpoint_id is None or manifest is None:
            return
        self._kept[checkpoint_id] = heavy_modules_named(_texts(manifest))
        self._kept.move_to_end(checkpoint_id)
        while len(self._kept) > self._max_kept:
            self._kept.popitem(last=False)


def _texts(manifest: Manifest) -> Iterator[str]:
    """The parts of a manifest that name the modules a namespace uses: its variables' types, its definitions
    (imports among them), its recent and setup cells, a paused run's cell."""
    for variable in manifest.variables:
        yield variable.type_name
    for dropped in manifest.dropped:
        yield dropped.type_name
    yield from manifest.definitions
    yield from manifest.setup_cells
    yield from manifest.cells
    if manifest.paused is not None:
        yield manifest.paused.cell
