"""A runner's compiled cells by source text: a cell run again skips the parse, the policy check and the compile.

What compiling a cell gives depends on its text, the runner's policy (fixed for the runner's life, so the cache is
the runner's own) and the ``__future__`` flags in force; nothing else (not the namespace, not the host functions)
goes into the check or the rewrite. The cache is keyed on the text and the flags. Only cells that compiled are kept,
so an error is always reported from a fresh check, and each run still gets its own ``<cell-N>`` filename: the
cached code objects are renamed, which costs a code object per function in the cell, not a parse.
"""

from __future__ import annotations

from collections import OrderedDict
from types import CodeType
from typing import TYPE_CHECKING

from snapcell.interpreter._assigned import bindable_names
from snapcell.interpreter._compile import CompiledCell, compile_cell, parse_cell, register_source
from snapcell.interpreter._definitions import bound_names
from snapcell.policy import Policy

if TYPE_CHECKING:
    from dataclasses import dataclass
else:  # the same classes, made without compiling source text (a zygote's start-up)
    from snapcell._support import dataclass

__all__ = ["CellCache", "PreparedCell"]

# Cells kept per runner, and the longest text kept: repeated cells are small ones (a probe, a loop step); a long
# cell costs little to compile relative to running it, and is not worth holding on to.
MAX_CELLS = 32
MAX_CELL_CHARS = 8192


@dataclass(frozen=True, slots=True)
class PreparedCell:
    """A cell ready to run.

    Attributes:
        cell: The compiled cell, under its own ``<cell-N>`` filename.
        bindable: The names it can bind (`bindable_names`), watched to report what it assigned.
        defines: Whether a top-level statement defines a function or class or imports (see `Definitions.record`).
    """

    cell: CompiledCell
    bindable: tuple[str, ...]
    defines: bool


class CellCache:
    """Compile (parse, check, rewrite, compile) cells for one runner, remembering the recent ones that compiled."""

    def __init__(self, policy: Policy) -> None:
        self._policy = policy
        self._cells: OrderedDict[tuple[str, int], PreparedCell] = OrderedDict()

    def prepare(self, code: str, filename: str, future_flags: int) -> PreparedCell:
        """The cell compiled under ``filename``, the names it can bind and whether it defines anything.

        Raises:
            ScriptSyntaxError: The cell does not parse or compile; nothing ran.
            PolicyError: The policy blocks something in it; nothing ran.
        """
        key = (code, future_flags)
        known = self._cells.get(key)
        if known is not None:
            self._cells.move_to_end(key)
            register_source(filename, code)
            old = known.cell
            # Built directly: dataclasses.replace costs more than the rest of a cache hit.
            cell = CompiledCell(_renamed(old.code, filename), old.is_async, old.has_value, old.future_flags, filename)
            return PreparedCell(cell, known.bindable, known.defines)
        tree = parse_cell(code, filename)
        defines = any(bound_names(node) for node in tree.body)
        self._policy.check(tree, code, filename)
        self._policy.transform(tree)
        cell = compile_cell(tree, code, filename, future_flags)
        prepared = PreparedCell(cell, tuple(bindable_names(tree)), defines)
        if len(code) <= MAX_CELL_CHARS:
            self._cells[key] = prepared
            if len(self._cells) > MAX_CELLS:
                self._cells.popitem(last=False)
        return prepared


def _renamed(code: CodeType, filename: str) -> CodeType:
    """``code`` and the code objects nested in it, with ``filename`` as their file."""
    consts = code.co_consts
    if any(type(const) is CodeType for const in consts):
        consts = tuple(_renamed(const, filename) if type(const) is CodeType else const for const in consts)
        return code.replace(co_filename=filename, co_consts=consts)
    return code.replace(co_filename=filename)
