"""The ``snapcell`` command: the demo, the REPL, checkpoint inspection, and the storage tools (cleanup, usage, S3)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from snapcell.errors import SnapcellError
from snapcell.storage import add_commands

__all__ = ["main"]

DEFAULT_DEMO_STORE = "file://.snapcell"


def _demo(args: argparse.Namespace) -> int:
    from snapcell._demo import run_demo, run_second_turn

    if args.turn_2:
        return run_second_turn(args.store, args.turn_2)
    return run_demo(args.store)


def _inspect(args: argparse.Namespace) -> int:
    import os

    from snapcell._inspect import inspect_checkpoint

    is_file = os.path.exists(args.target) and not os.path.isdir(args.target)
    if not is_file and args.id:
        print(f"snapcell: {args.target} is not a file; --id goes with a checkpoint file", file=sys.stderr)
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


def _repl(args: argparse.Namespace) -> int:
    from snapcell._repl import run_repl

    return run_repl(store=args.store, conversation=args.conversation, isolation=args.isolation)


def _add_inspect_and_repl(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from snapcell.storage import parse_duration

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
        help="key to verify with (repeatable); default SNAPCELL_SIGNING_KEY, then the local store's key",
    )
    inspect.add_argument(
        "--ttl", type=_duration(parse_duration), default=7 * 86400.0, help="checkpoint lifetime for the expiry (7d)"
    )
    inspect.add_argument(
        "--no-verify", action="store_true", help="read the bytes without checking signatures (nothing is unpickled)"
    )
    inspect.set_defaults(func=_inspect)

    repl = commands.add_parser(
        "repl",
        help="an interactive Python prompt whose variables persist across runs",
        description="Every input is a turn of a persistent conversation: quit and start again later (with the same "
        "--conversation and --store) and the variables are still there. %%help lists the commands.",
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
    repl.set_defaults(func=_repl)


def _duration(parse: Any) -> Any:
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except SnapcellError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    return convert


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``snapcell`` command."""
    parser = argparse.ArgumentParser(prog="snapcell", description="A snapshotting Python interpreter for AI agents.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser("demo", help="run the two-turn churn example across two processes")
    demo.add_argument(
        "--store", default=DEFAULT_DEMO_STORE, help=f"store URL or directory (default {DEFAULT_DEMO_STORE})"
    )
    demo.add_argument("--turn-2", metavar="CHECKPOINT_HEX", help=argparse.SUPPRESS)
    demo.set_defaults(func=_demo)
    _add_inspect_and_repl(commands)
    add_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except SnapcellError as exc:
        print(f"snapcell: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
