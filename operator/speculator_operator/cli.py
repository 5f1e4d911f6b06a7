"""The `speculator-operator` command line.

Exit codes: 0 success; 1 the command ran and found a problem; 2 bad usage or unreadable input.
"""

from __future__ import annotations

import argparse
import sys

from speculator_operator import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="speculator-operator",
        description="Train, audit, publish and serve speculative-decoding draft models for vLLM.",
    )
    parser.add_argument("--version", action="version", version=f"speculator-operator {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("version", help="print the version")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "version":
        print(__version__)
        return 0
    parser.print_help(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
