"""The ``snapcell`` command: the demo, the REPL, checkpoint inspection, and the storage tools (cleanup, usage, S3).

The handlers are named ``_run_*``: the package's submodules (``_demo``, ``_inspect``, ``_repl``, ``_mcp``) become
attributes of this module when imported, and would replace same-named functions.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from snapcell.cli._storage import add_commands
from snapcell.errors import ConfigError, SnapcellError

__all__ = ["main"]

DEFAULT_DEMO_STORE = "file://.snapcell"
_EXIT_BROKEN_PIPE = 141  # what a shell reports for a command ended by SIGPIPE


def _run_demo(args: argparse.Namespace) -> int:
    from snapcell.cli._demo import run_demo, run_second_turn

    if args.turn_2:
        return run_second_turn(args.store, args.turn_2)
    try:
        return run_demo(args.store)
    except ConfigError as exc:
        print(f"snapcell demo: {exc}", file=sys.stderr)
        return 2


def _run_inspect(args: argparse.Namespace) -> int:
    from snapcell.checkpoint import ID_BYTES
    from snapcell.ops import inspect_checkpoint

    is_file = os.path.exists(args.target) and not os.path.isdir(args.target)
    if not is_file and args.id:
        print(f"snapcell: {args.target} is not a file; --id goes with a checkpoint file", file=sys.stderr)
        return 2
    if not is_file and not _looks_like_id(args.target, ID_BYTES):
        print(
            f"snapcell inspect: {args.target!r} is not a checkpoint ID (an ID is {2 * ID_BYTES} hex digits, as "
            "dump() and `snapcell head` print it) and not a checkpoint file",
            file=sys.stderr,
        )
        return 2
    report = inspect_checkpoint(
        args.id if is_file else args.target,
        store=args.store,
        path=args.target if is_file else None,
        signing_keys=args.signing_key or None,
        ttl_s=args.ttl,
        verify=not args.no_verify,
    )
    print(report.to_json() if args.json else report.render())
    return 0 if report.problem is None else 1


def _looks_like_id(text: str, id_bytes: int) -> bool:
    """True when ``text`` has the shape of a checkpoint ID in hex (whether it verifies is another matter)."""
    try:
        return len(bytes.fromhex(text)) == id_bytes
    except ValueError:
        return False


def _run_repl(args: argparse.Namespace) -> int:
    from snapcell.cli._repl import run_repl

    allow = [m.strip() for m in (args.allow or "").split(",") if m.strip()]
    create = args.create or args.store == DEFAULT_DEMO_STORE  # the default cannot be a mistyped path
    return run_repl(
        store=args.store, conversation=args.conversation, isolation=args.isolation, allow=allow, create_store=create
    )


def _run_mcp(args: argparse.Namespace) -> int:
    from snapcell.cli._mcp import run_command

    return run_command(args)


def _head(args: argparse.Namespace) -> int:
    import json

    from snapcell.heads import default_heads, validate_conversation_id
    from snapcell.storage import open_store

    validate_conversation_id(args.conversation)
    store = open_store(args.store)
    try:
        heads = default_heads(store)
        try:
            head = heads.get(args.conversation)
        finally:
            heads.close()
    finally:
        store.close()
    if args.json:
        record = {
            "conversation": args.conversation,
            "checkpoint_id": head.checkpoint_id.hex() if head is not None and head.checkpoint_id else None,
            "history": [h.hex() for h in head.history] if head is not None else [],
        }
        print(json.dumps(record, indent=2))
        return 0 if head is not None else 1
    if head is None:
        print(f"snapcell head: conversation {args.conversation!r} has no turns in {store.url}", file=sys.stderr)
        return 1
    print(
        head.checkpoint_id.hex()
        if head.checkpoint_id is not None
        else "(empty: the conversation was rewound to before its first turn)"
    )
    if args.history:
        for earlier in head.history:
            print(earlier.hex())
    return 0


def _keygen(args: argparse.Namespace) -> int:
    import secrets

    # URL-safe base64 of 32 random bytes: 43 characters, no comma (the separator of several keys), no space.
    print(secrets.token_urlsafe(32))
    return 0


def _add_inspect_and_repl(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from snapcell.cli._storage import parse_duration

    inspect = commands.add_parser(
        "inspect",
        help="verify a checkpoint and show its manifest without unpickling anything",
        description="Verify a checkpoint (its ID's signature and the HMAC over its bytes), then show what it holds: "
        "creation and expiry, versions, variables with types and sizes, dropped variables, setup cells and "
        "sections. Nothing is unpickled. Exits 1 when the checkpoint fails verification or is unreadable.",
    )
    inspect.add_argument("target", metavar="ID_HEX|FILE", help="a checkpoint ID in hex, or a checkpoint file")
    inspect.add_argument(
        "--store", default=None, help=f"store URL or directory holding the checkpoint (default {DEFAULT_DEMO_STORE})"
    )
    inspect.add_argument("--id", metavar="HEX", help="the ID of a checkpoint FILE, to verify it")
    inspect.add_argument("--json", action="store_true", help="print the report as JSON")
    inspect.add_argument(
        "--signing-key",
        action="append",
        metavar="KEY",
        help="key to verify with (repeatable); default $SNAPCELL_SIGNING_KEY, then the local store's key",
    )
    inspect.add_argument(
        "--ttl", type=_duration(parse_duration), default=7 * 86400.0, help="checkpoint lifetime for the expiry (7d)"
    )
    inspect.add_argument(
        "--no-verify", action="store_true", help="read the bytes without checking signatures (nothing is unpickled)"
    )
    inspect.set_defaults(func=_run_inspect)

    repl = commands.add_parser(
        "repl",
        help="an interactive Python prompt whose variables persist across runs",
        description="Every input is a turn of a persistent conversation: quit and start again later (with the same "
        "--conversation and --store) and the variables are still there. Inside, %help lists the commands.",
    )
    repl.add_argument("--conversation", default="repl", help="conversation ID (default repl)")
    repl.add_argument(
        "--store", default=DEFAULT_DEMO_STORE, help=f"store URL or directory (default {DEFAULT_DEMO_STORE})"
    )
    repl.add_argument(
        "--isolation",
        choices=("process", "inline"),
        default="process",
        help="process (default): a sandboxed worker; inline: this process, no protection",
    )
    repl.add_argument(
        "--allow", metavar="MODULES", help="modules to allow besides the safe standard library: numpy,pandas"
    )
    repl.add_argument("--create", action="store_true", help="make the store's directory if it does not exist")
    repl.set_defaults(func=_run_repl)

    head = commands.add_parser(
        "head",
        help="print a conversation's current checkpoint ID",
        description="Print the current checkpoint ID (hex) of a run_code conversation, as kept in the store's head "
        "store; exits 1 when the conversation has no turns. Feed it to `snapcell inspect`.",
    )
    head.add_argument("conversation", metavar="CONVERSATION", help="the conversation ID")
    head.add_argument(
        "--store", default=DEFAULT_DEMO_STORE, help=f"store URL or directory (default {DEFAULT_DEMO_STORE})"
    )
    head.add_argument("--history", action="store_true", help="also print the earlier checkpoint IDs, newest first")
    head.add_argument("--json", action="store_true", help="print the head and its history as JSON")
    head.set_defaults(func=_head)

    keygen = commands.add_parser(
        "keygen",
        help="print a new signing key for $SNAPCELL_SIGNING_KEY",
        description="Print a new random signing key (32 random bytes as 43 URL-safe characters) to put in "
        "$SNAPCELL_SIGNING_KEY. To rotate, put the new key first and keep the old one after a comma.",
    )
    keygen.set_defaults(func=_keygen)


def _duration(parse: Any) -> Any:
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except SnapcellError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    return convert


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``snapcell`` command."""
    from snapcell import __version__
    from snapcell.cli._mcp import add_command as add_mcp_command

    parser = argparse.ArgumentParser(prog="snapcell", description="A snapshotting Python interpreter for AI agents.")
    parser.add_argument("--version", action="version", version=f"snapcell {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser("demo", help="run the two-turn churn example across two processes")
    demo.add_argument(
        "--store", default=DEFAULT_DEMO_STORE, help=f"store URL or directory (default {DEFAULT_DEMO_STORE})"
    )
    demo.add_argument("--turn-2", metavar="CHECKPOINT_HEX", help=argparse.SUPPRESS)
    demo.set_defaults(func=_run_demo)
    _add_inspect_and_repl(commands)
    add_commands(commands)
    add_mcp_command(commands, _run_mcp)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    try:
        args = build_parser().parse_args(argv)
        try:
            code: int = args.func(args)
        except SnapcellError as exc:
            print(f"snapcell: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`snapcell inspect ... | head`): stop quietly, like other command-line tools. Point
        # stdout at /dev/null so the interpreter's own flush at exit does not complain again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return _EXIT_BROKEN_PIPE
    return code


if __name__ == "__main__":
    sys.exit(main())
