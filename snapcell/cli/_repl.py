"""``snapcell repl``: a Python prompt where every input is a turn of a persistent conversation.

Built on `SyncCodeTool`: each complete input runs as one ``run_code`` turn (load the conversation's head, run, dump,
move the head), so quitting loses nothing and the next ``snapcell repl`` with the same ``--conversation`` and
``--store`` continues where this one stopped, in another process or days later. The head lives in the store's
default head store (`SQLiteHeads` in ``<store>/.heads.sqlite3`` for a local store).

Input is read like Python's own console (`code.InteractiveConsole`): a block waits for its closing blank line and
top-level ``await`` is accepted. Lines starting with ``%`` are REPL commands: ``%vars``, ``%history [N]``,
``%rewind [N]``, ``%id`` and ``%help``.
"""

from __future__ import annotations

import ast
import code
import sys
from collections.abc import Sequence
from typing import IO, Any

from snapcell.checkpoint import Manifest
from snapcell.errors import CheckpointCorrupt, CheckpointError, ConfigError, Conflict, SnapcellError
from snapcell.ops import format_bytes, inspect_checkpoint
from snapcell.policy import Policy
from snapcell.pool import Pool
from snapcell.storage import MemoryStore
from snapcell.telemetry import conversation_context
from snapcell.tool import SyncCodeTool

__all__ = ["DEFAULT_CONVERSATION", "Repl", "run_repl"]

DEFAULT_CONVERSATION = "repl"
_EXIT_WORDS = frozenset({"exit", "exit()", "quit", "quit()"})
_NO_OUTPUT = "(no output)"
_NOT_STARTED = object()  # a turn interrupted before it read the head
_HELP = """\
Every input is a turn of the conversation; its variables are saved after each turn.
  %vars          variables of the current checkpoint: types and pickled sizes, largest first
  %history [N]   the last N checkpoints of the conversation (default 10), newest first
  %rewind [N]    go back N turns (default 1): the variables are as they were then
  %id            the current checkpoint ID (for `snapcell inspect`)
  %help          this text
Ctrl-D, exit or quit leaves; start `snapcell repl` again with the same --conversation and --store to continue."""


class Repl(code.InteractiveConsole):
    """The console: Python's input handling, with each complete input sent to the conversation as a turn.

    Args:
        tool: The tool that runs turns and keeps the conversation's head.
        pool: The pool behind ``tool`` (for reading manifests of checkpoints).
        conversation: The conversation ID.
        out: Where answers go (default standard output).
    """

    def __init__(self, tool: SyncCodeTool, pool: Pool, conversation: str, *, out: IO[str] | None = None) -> None:
        super().__init__(filename="<snapcell>")
        # Accept `await` at top level when deciding whether an input is complete, as `python -m asyncio` does.
        self.compile.compiler.flags |= ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        self.tool = tool
        self.pool = pool
        self.conversation = conversation
        self.out = out or sys.stdout
        self.unrestored = ""  # what the banner found could not be restored; turns are refused while it is set

    # ------------------------------------------------------------------ input

    def runsource(self, source: str, filename: str = "<input>", symbol: str = "single") -> bool:
        """Run ``source`` as a turn once it is complete; True while more lines are needed."""
        try:
            if self.compile(source, filename, symbol) is None:
                return True
        except (OverflowError, SyntaxError, ValueError):
            pass  # complete but invalid: snapcell reports the error as the run's
        self.turn(source)
        return False

    def turn(self, source: str) -> None:
        """Run one input as a turn of the conversation and print the answer; errors are printed, never raised."""
        if self.unrestored:
            # A turn would save a namespace without the variables that failed to load, over the checkpoint that has
            # them: refuse until the user restarts with the right --allow or rewinds on purpose.
            self.say(f"not run: {_REFUSED}")
            return
        before: str | None | object = _NOT_STARTED
        try:
            before = self._head_version()
            with conversation_context(self.conversation):
                answer = self.tool.run_code(self.conversation, source)
        except KeyboardInterrupt:
            self.say(self._interrupted(before))
            return
        except Conflict as exc:
            self.say(f"not saved: {exc}")
            return
        except SnapcellError as exc:
            self.say(_one_line(exc))
            return
        if answer != _NO_OUTPUT:
            self.say(answer)

    def _head_version(self) -> str | None:
        head = self.tool.head(self.conversation)
        return head.version if head is not None else None

    def _interrupted(self, before: str | None | object) -> str:
        """What a Ctrl-C during a turn left behind: the head may have moved just before the interrupt landed."""
        if before is _NOT_STARTED:
            return "KeyboardInterrupt: this input did not run"
        try:
            after = self._head_version()
        except (SnapcellError, KeyboardInterrupt) as exc:
            return f"KeyboardInterrupt: this input was stopped; whether it was saved is unknown ({_one_line(exc)})"
        if after != before:
            return "KeyboardInterrupt: this input had already been saved; its changes are kept"
        return "KeyboardInterrupt: this input was stopped and its changes are lost"

    def interact(self, banner: str | None = None, exitmsg: str | None = None) -> None:
        """Read inputs until Ctrl-D, ``exit`` or ``quit``."""
        for name, prompt in (("ps1", ">>> "), ("ps2", "... ")):
            if not hasattr(sys, name):
                setattr(sys, name, prompt)
        self.say(self.banner() if banner is None else banner)
        more = False
        while True:
            try:
                line = self.raw_input(str(sys.ps2 if more else sys.ps1))
            except EOFError:
                self.say("")
                break
            except KeyboardInterrupt:
                self.say("\nKeyboardInterrupt")
                self.resetbuffer()
                more = False
                continue
            if not more and line.strip() in _EXIT_WORDS:
                break
            if not more and line.lstrip().startswith("%"):
                self.command(line.strip())
                continue
            more = self.push(line)
        if exitmsg:
            self.say(exitmsg)

    def say(self, text: str) -> None:
        """Print a line of the REPL's own output."""
        print(text, file=self.out, flush=True)

    # --------------------------------------------------------------- commands

    def command(self, line: str) -> None:
        """Run a ``%`` command; errors are printed, never raised."""
        name, _, argument = line[1:].partition(" ")
        handlers = {"vars": self.show_vars, "history": self.show_history, "rewind": self.rewind, "id": self.show_id}
        if name == "help":
            self.say(_HELP)
            return
        handler = handlers.get(name)
        if handler is None:
            self.say(f"unknown command %{name}; try %help")
            return
        try:
            handler(argument.strip())
        except SnapcellError as exc:
            self.say(f"%{name}: {exc}")

    def _count(self, argument: str, default: int, command: str) -> int:
        # isascii: str.isdigit() also accepts '²' or '٣', which int() then refuses.
        if not argument:
            return default
        if not (argument.isascii() and argument.isdigit()) or int(argument) < 1:
            raise ConfigError(f"expected a positive number, not {argument!r}; usage: %{command} [N]")
        return int(argument)

    def _manifest(self, checkpoint_id: bytes) -> Manifest:
        report = inspect_checkpoint(checkpoint_id, store=self.pool.store, keyring=self.pool.aio.keyring)
        if not report.verified:
            raise CheckpointCorrupt(report.verification.removeprefix("FAILED: "), checkpoint_id=checkpoint_id)
        if report.manifest is None:
            raise CheckpointError(report.problem or "the checkpoint could not be parsed")
        return report.manifest

    def _current(self) -> bytes | None:
        head = self.tool.head(self.conversation)
        return head.checkpoint_id if head is not None else None

    def show_vars(self, argument: str = "") -> None:
        """``%vars``: the current checkpoint's variables, largest first."""
        current = self._current()
        if current is None:
            self.say("no variables yet")
            return
        self.say("\n".join(describe_variables(self._manifest(current))))

    def show_history(self, argument: str = "") -> None:
        """``%history [N]``: the conversation's last checkpoints, newest first."""
        limit = self._count(argument, 10, "history")
        head = self.tool.head(self.conversation)
        if head is None or head.checkpoint_id is None:
            self.say("no turns yet")
            return
        ids = [head.checkpoint_id, *head.history][:limit]
        self.say(f"{'':2}{'back':>4}  {'turn':>4}  {'vars':>4}  last input")
        for back, checkpoint_id in enumerate(ids):
            try:
                manifest = self._manifest(checkpoint_id)
            except SnapcellError as exc:
                self.say(f"{'*' if back == 0 else '':2}{back:>4}  (unreadable: {exc})")
                continue
            last = (manifest.cells[-1].strip().splitlines() or [""])[0] if manifest.cells else ""
            marker = "*" if back == 0 else ""
            self.say(f"{marker:2}{back:>4}  {manifest.cell_count:>4}  {len(manifest.variables):>4}  {last[:60]}")
        more = 1 + len(head.history) - len(ids)
        if more > 0:
            self.say(f"  ... {more} older (%history {len(ids) + more})")

    def rewind(self, argument: str = "") -> None:
        """``%rewind [N]``: move the conversation back N turns."""
        turns = self._count(argument, 1, "rewind")
        target = self.tool.rewind(self.conversation, turns)
        self.unrestored = self._unrestored(target) if target is not None else ""
        if target is None:
            self.say(f"rewound {_plural(turns, 'turn')}: the namespace is empty")
            return
        manifest = self._manifest(target)
        names = ", ".join(v.name for v in manifest.variables) or "none"
        self.say(f"rewound {_plural(turns, 'turn')} to turn {manifest.cell_count}; variables: {names}")
        if self.unrestored:
            self.say(f"NOT restored: {self.unrestored}\n{_REFUSED}")

    def show_id(self, argument: str = "") -> None:
        """``%id``: the current checkpoint ID in hex."""
        current = self._current()
        self.say(current.hex() if current is not None else "no checkpoint yet")

    def _unrestored(self, checkpoint_id: bytes) -> str:
        """Load the checkpoint as a turn would; what could not be restored (empty when everything was)."""
        try:
            with self.pool.checkout() as session:
                session.load_session(checkpoint_id)
                notes = session.run("None").notes
        except SnapcellError:
            return ""  # the turn itself reports it (an expired state starts afresh; a bad checkpoint moves nothing)
        return "; ".join(note for note in notes if note.startswith("could not be restored"))

    def banner(self) -> str:
        """The first lines: where the conversation lives and what it holds."""
        store = self.pool.store
        lines = [f"snapcell REPL: conversation {self.conversation!r} in {store.url}"]
        if isinstance(store, MemoryStore):
            lines.append("(a memory store: nothing survives this process; use --store file://DIR to keep it)")
        current = self._current()
        if current is None:
            lines.append("a new conversation; %help lists the commands, Ctrl-D leaves")
        else:
            try:
                manifest = self._manifest(current)
            except SnapcellError as exc:
                lines.append(f"current checkpoint unreadable: {_one_line(exc)}; %rewind or start over")
                lines.append("%help lists the commands, Ctrl-D leaves")
                return "\n".join(lines)
            self.unrestored = self._unrestored(current)
            if self.unrestored:
                lines.append(f"NOT restored: {self.unrestored}")
                lines.append(_REFUSED)
                return "\n".join(lines)
            names = ", ".join(v.name for v in manifest.variables[:12]) + (
                ", ..." if len(manifest.variables) > 12 else ""
            )
            lines.append(
                f"restored after turn {manifest.cell_count}: {_plural(len(manifest.variables), 'variable')}"
                + (f" ({names})" if names else "")
            )
            if manifest.dropped:
                dropped = ", ".join(f"{d.name} ({d.type_name})" for d in manifest.dropped)
                lines.append(f"not saved, so not restored: {dropped}")
            lines.append("%help lists the commands, Ctrl-D leaves")
        return "\n".join(lines)


_REFUSED = (
    "inputs are not run, so the saved variables are not overwritten: start the REPL again with the modules it "
    "needs (--allow numpy,pandas), or %rewind to an earlier turn"
)


def _plural(count: int, word: str) -> str:
    """``1 variable``, ``2 variables``."""
    return f"{count} {word}{'' if count == 1 else 's'}"


def _one_line(exc: BaseException) -> str:
    """The error's type and message on one line."""
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def describe_variables(manifest: Manifest) -> list[str]:
    """Lines for ``%vars``: each variable's name, type and pickled size, largest first; then dropped ones."""
    variables = sorted(manifest.variables, key=lambda v: (-v.size_bytes, v.name))
    if not variables and not manifest.dropped:
        return ["no variables"]
    lines = []
    if variables:
        width = min(max(len(v.name) for v in variables), 32)
        type_width = min(max(len(v.type_name) for v in variables), 28)
        total = sum(v.size_bytes for v in variables)
        for v in variables:
            size = format_bytes(v.size_bytes)
            lines.append(f"{v.name[:32]:<{width}}  {v.type_name[:28]:<{type_width}}  {size:>10}")
        lines.append(f"{_plural(len(variables), 'variable')}, {format_bytes(total)} pickled")
    for d in manifest.dropped:
        lines.append(f"{d.name}  {d.type_name}  not saved: {d.reason}")
    return lines


def run_repl(
    *,
    store: str,
    conversation: str = DEFAULT_CONVERSATION,
    isolation: Any = "process",
    stdin_is_tty: bool | None = None,
    allow: Sequence[str] = (),
    create_store: bool = False,
) -> int:
    """Run the REPL until the user leaves; returns the exit code.

    Args:
        store: Store URL or directory of the conversation.
        conversation: The conversation ID.
        isolation: The pool's isolation (``"process"`` by default, as for `Pool`).
        stdin_is_tty: Whether to set up line editing (default: when standard input is a terminal).
        allow: Modules scripts may import besides the safe standard library (``numpy``, ``pandas``).
        create_store: Make the local store's directory when it does not exist.

    Raises:
        ConfigError: A bad store URL (or a local store that does not exist, without ``create_store``), conversation
            ID or isolation; nothing ran.
        StorageError: The store or head store could not be read.
    """
    from snapcell.heads import validate_conversation_id

    validate_conversation_id(conversation)
    if stdin_is_tty if stdin_is_tty is not None else sys.stdin.isatty():
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:  # pragma: no cover - not on every platform
            pass
    policy = Policy().with_modules(allow) if allow else None
    with Pool(store, isolation=isolation, policy=policy, create_store=create_store) as pool:
        tool = SyncCodeTool(pool)
        try:
            Repl(tool, pool, conversation).interact()
        finally:
            tool.heads.close()
    return 0
