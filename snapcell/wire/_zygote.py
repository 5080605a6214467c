"""What the host and a zygote agree on before it starts: its thread limits and the heavy modules it may preload.

The host starts the zygote with this environment and asks it to preload `preload_modules` (argv); the zygote keeps
to the same list. Neither side imports the other's code for it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

__all__ = ["HEAVY_MODULES", "THREAD_ENV", "heavy_modules_named", "preload_modules"]

# Thread pools of numerical libraries are started at import: with one thread each, nothing runs in the
# zygote but its main thread, and a fork copies no lock held by another thread.
THREAD_ENV = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "NUMEXPR_NUM_THREADS": "1",
    "VECLIB_MAXIMUM_THREADS": "1",
}
# Modules worth importing in the zygote when the policy allows them (costly to import on every checkout).
HEAVY_MODULES = ("numpy", "pandas")
_HEAVY_NAME = re.compile(r"\b(?:" + "|".join(HEAVY_MODULES) + r")\b")


@functools.lru_cache(maxsize=64)
def preload_modules(allowed: frozenset[str]) -> tuple[str, ...]:
    """The heavy modules a zygote for a policy allowing ``allowed`` imports (those installed).

    Asked on every checkout: the answer is kept (finding the modules costs ~0.1 ms), so a module installed while the
    host runs is preloaded from the host's next start.
    """
    import importlib.util

    return tuple(name for name in HEAVY_MODULES if name in allowed and importlib.util.find_spec(name) is not None)


def heavy_modules_named(texts: Iterable[str]) -> frozenset[str]:
    """The heavy modules whose names appear, as words, in any of ``texts`` (code, a manifest's cells and types).

    A session whose code and checkpoint name none of them is served from a zygote that did not import them (see
    `snapcell.backends.WorkerPool.acquire`): a guess, never a rule, since a session that imports one anyway gets it
    on demand.
    """
    found: set[str] = set()
    for text in texts:
        # A substring test first, done in C: most texts (every cell of a long conversation, each turn) name none.
        if any(name in text for name in HEAVY_MODULES):
            found.update(_HEAVY_NAME.findall(text))
    return frozenset(found)
