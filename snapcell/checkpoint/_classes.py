"""Which class a checkpoint's class tracker id stands for: one load's own classes, never another session's.

cloudpickle restores a class (an enum, a TypeVar) under the tracker id its pickle carries, and keeps one table of
ids for the whole process: a second pickle naming the same id gets the class the first one made, and then sets its
state. In a host that runs several sessions inline, that is another conversation's live class, and a checkpoint
that names its id (a leaked checkpoint, the same checkpoint loaded twice) would replace its methods. So a load
resolves ids only among the classes it made itself (across all its frames, so identity holds within a namespace),
and registers each new class with cloudpickle for later dumps under the same id when the id is free in the process,
else under a fresh one.
"""

from __future__ import annotations

import uuid
from typing import Any

import cloudpickle

__all__ = ["LoadClasses", "ProcessClasses"]

_CP = cloudpickle.cloudpickle


class LoadClasses:
    """The classes one load made, by tracker id: what the load's helpers resolve ids against."""

    def __init__(self) -> None:
        self._by_id: dict[str, Any] = {}

    def made(self, tracker_id: str | None, made: Any) -> Any:
        """The class (enum, TypeVar) this load already made under ``tracker_id``, else ``made``, now registered."""
        if tracker_id is None:
            return made
        known = self._by_id.setdefault(tracker_id, made)
        if known is made:
            _register(made, tracker_id)
        return known

    def lookup(self, tracker_id: str | None, class_def: Any) -> Any:
        """cloudpickle's ``_lookup_class_or_track`` named by a stream: only this load's classes, nothing tracked."""
        if tracker_id is None:
            return class_def
        return self._by_id.get(tracker_id, class_def)


class ProcessClasses:
    """cloudpickle's own process-wide resolution, for a dump's check of its own frames against the live classes."""

    def made(self, tracker_id: str | None, made: Any) -> Any:
        return _CP._lookup_class_or_track(tracker_id, made)

    def lookup(self, tracker_id: str | None, class_def: Any) -> Any:
        return _CP._lookup_class_or_track(tracker_id, class_def)


def _register(cls: Any, tracker_id: str) -> None:
    """Let a later dump pickle ``cls`` under ``tracker_id`` (stable bytes across turns) unless another class has it."""
    with _CP._DYNAMIC_CLASS_TRACKER_LOCK:
        if _CP._DYNAMIC_CLASS_TRACKER_BY_ID.get(tracker_id) is not None:
            tracker_id = uuid.uuid4().hex
        _CP._DYNAMIC_CLASS_TRACKER_BY_ID[tracker_id] = cls
        _CP._DYNAMIC_CLASS_TRACKER_BY_CLASS[cls] = tracker_id


def make_skeleton_class(
    classes: LoadClasses | ProcessClasses,
    type_constructor: Any,
    name: str,
    bases: tuple[Any, ...],
    type_kwargs: dict[str, Any],
    class_tracker_id: str | None,
    extra: Any,
) -> Any:
    """cloudpickle's ``_make_skeleton_class``, resolving the tracker id through ``classes``."""
    made = _CP._make_skeleton_class(type_constructor, name, bases, type_kwargs, None, extra)
    return classes.made(class_tracker_id, made)


def make_skeleton_enum(
    classes: LoadClasses | ProcessClasses,
    bases: tuple[Any, ...],
    name: str,
    qualname: str,
    members: dict[str, Any],
    module: str,
    class_tracker_id: str | None,
    extra: Any,
) -> Any:
    """cloudpickle's ``_make_skeleton_enum``, resolving the tracker id through ``classes``."""
    made = _CP._make_skeleton_enum(bases, name, qualname, members, module, None, extra)
    return classes.made(class_tracker_id, made)


def make_typevar(
    classes: LoadClasses | ProcessClasses,
    name: str,
    bound: Any,
    constraints: Any,
    covariant: bool,
    contravariant: bool,
    class_tracker_id: str | None,
) -> Any:
    """cloudpickle's ``_make_typevar``, resolving the tracker id through ``classes``."""
    made = _CP._make_typevar(name, bound, constraints, covariant, contravariant, None)
    return classes.made(class_tracker_id, made)
