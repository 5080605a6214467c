"""How the host tells an async host function from a sync one."""

from __future__ import annotations

from typing import Any

__all__ = ["is_async_callable"]


def is_async_callable(func: Any) -> bool:
    """Whether calling ``func`` makes a coroutine: an ``async def`` function or method, a `functools.partial` of
    one, or an object whose class defines ``async def __call__``."""
    import inspect  # on a first call: a worker's zygote says ready without inspect

    if inspect.iscoroutinefunction(func):
        return True
    if inspect.isroutine(func):  # a plain function or method (the usual host function): its class's __call__ is not it
        return False
    return inspect.iscoroutinefunction(inspect.getattr_static(type(func), "__call__", None))
