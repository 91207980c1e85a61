"""Placeholder: this command is being built."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("convert", help="(not built yet)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    raise SystemExit("not built yet")
