"""What tests run inside DataLoader workers (transforms, collate functions), kept light (random, numpy,
torch only), so that a ``spawn`` worker unpickling them imports little besides what the dataset needs; and
a way to see the warnings those workers raise."""

from __future__ import annotations

import contextlib
import random
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

Draws = tuple[float, float, float]


def draw(sample: Any) -> Draws:
    """A transform: what an augmentation would draw for this sample, from ``random``, ``numpy`` and ``torch``."""
    return (random.random(), float(np.random.rand()), float(torch.rand(1)))


def as_list(batch: Any) -> list[Any]:
    """A collate function keeping the batch's samples as a list."""
    return list(batch)


def tag_worker(sample: dict[str, Any]) -> tuple[str, str, int]:
    """A transform: the sample's key and shard, and the worker that read it (-1: the main process)."""
    info = get_worker_info()
    return sample["__key__"], sample["__url__"], info.id if info is not None else -1


@contextlib.contextmanager
def printing() -> Iterator[None]:
    """Warnings printed to stderr, in this process and in the workers it forks (inside a test, pytest
    records them instead, and a forked worker's records never come back): read them with ``capfd``."""
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = _print
        yield


def _print(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))
    sys.stderr.flush()
