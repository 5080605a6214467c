"""The ``snapcell`` command: the demo, and the storage tools (cleanup, usage, S3 setup)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from snapcell.errors import SnapcellError
from snapcell.storage import add_commands

__all__ = ["main"]

DEFAULT_DEMO_STORE = "file://.snapcell"


def _demo(args: argparse.Namespace) -> int:
    from snapcell._demo import run_demo, run_second_turn

    if args.turn_2:
        return run_second_turn(args.store, args.turn_2)
    return run_demo(args.store)


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
