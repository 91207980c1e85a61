#!/usr/bin/env python3
"""Make WebDataset tar shards from a folder of small files: the same as ``fastdata convert``.

python tools/make_shards.py SRC OUT [--shard-size 256MB | --shard-count N] [--workers N] [--shuffle --seed S]
"""

from __future__ import annotations

import argparse
import os
import sys

# run from a checkout without installing: make the package beside this folder importable
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fastdata.convert._command import add_arguments, run
from fastdata.core.errors import FastdataError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make_shards.py", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except FastdataError as e:
        print(f"make_shards.py: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
