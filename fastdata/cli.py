"""``fastdata convert | bench | inspect``: a thin layer over the library.

Each command lives beside the code it drives and registers itself here through a ``register``
function, so that ``fastdata --help`` stays fast (heavy imports happen inside the command).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from fastdata.core.errors import FastdataError

COMMANDS = ("fastdata.convert._command", "fastdata.bench._command", "fastdata.inspection._command")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastdata",
        description="Fast, worker-safe PyTorch data loading: convert corpora, benchmark loaders, inspect data.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        importlib.import_module(module).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except FastdataError as e:
        print(f"fastdata {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        hint = getattr(args, "interrupted", None)  # a command's word on what to do next (convert: resume)
        print(f"fastdata {args.command}: interrupted" + (f"; {hint}" if hint else ""), file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
