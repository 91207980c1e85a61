"""What the seeding tests run inside DataLoader workers, kept light (random, numpy, torch only), so that a
``spawn`` worker unpickling it imports little besides what the dataset needs."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

Draws = tuple[float, float, float]


def draw(sample: Any) -> Draws:
    """A transform: what an augmentation would draw for this sample, from ``random``, ``numpy`` and ``torch``."""
    return (random.random(), float(np.random.rand()), float(torch.rand(1)))


def as_list(batch: Any) -> list[Any]:
    """A collate function keeping the batch's samples as a list."""
    return list(batch)
