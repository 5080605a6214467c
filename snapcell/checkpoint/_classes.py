"""Which class a checkpoint's class tracker id stands for: one load's own classes, never another session's.

cloudpickle restores a class (an enum, a TypeVar) under the tracker id its pickle carries, and keeps one table of
ids for the whole process: a second pickle naming the same id gets the class the first one made, and then sets its
state. In a host that runs several sessions inline, that is another conversation's live class, and a checkpoint
that names its id (a leaked checkpoint, the same checkpoint loaded twice) would replace its methods. So a load
resolves ids only among the classes it made itself (across all its frames, so identity holds within a namespace),
and never through cloudpickle's table of ids. It only tells cloudpickle which id a class it made had, so that a
later dump writes the same id (a frame's bytes stay the same from turn to turn and are stored once); two sessions
may then dump one id for their own classes, which is harmless, since no load looks the id up in the process.
"""

from __future__ import annotations

from typing import Any

import cloudpickle

__all__ = ["LoadClasses", "make_skeleton_class", "make_skeleton_enum", "make_typevar"]

_CP = cloudpickle.cloudpickle


class LoadClasses:
    """The classes one load made, by tracker id: what the load's helpers resolve ids against.

    Args:
        register: Tell cloudpickle each new class's id for later dumps (a load into a session); False for a dump's
            check that its frames restore, whose classes are thrown away.
    """

    def __init__(self, *, register: bool = True) -> None:
        self._by_id: dict[str, Any] = {}
        self._register = register

    def made(self, tracker_id: str | None, made: Any) -> Any:
        """The class (enum, TypeVar) this load already made under ``tracker_id``, else ``made``."""
        if tracker_id is None:
            return made
        known = self._by_id.setdefault(tracker_id, made)
        if known is made and self._register:
            with _CP._DYNAMIC_CLASS_TRACKER_LOCK:
                _CP._DYNAMIC_CLASS_TRACKER_BY_CLASS.setdefault(made, tracker_id)
        return known

    def lookup(self, tracker_id: str | None, class_def: Any) -> Any:
        """cloudpickle's ``_lookup_class_or_track`` named by a stream: only this load's classes, nothing tracked."""
        if tracker_id is None:
            return class_def
        return self._by_id.get(tracker_id, class_def)


def make_skeleton_class(
    classes: LoadClasses,
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
    classes: LoadClasses,
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
    classes: LoadClasses,
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
