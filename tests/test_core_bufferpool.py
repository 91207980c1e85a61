"""BufferPool (the HDF5 reader's batch buffers): reused only once nothing can read them any more."""

from __future__ import annotations

import gc
import pickle

import numpy as np
import torch

from fastdata.core.process._bufferpool import MIN_BYTES, BufferPool

SHAPE = (64, 64, 64, 3)  # 768 KiB: pooled


def test_buffer_comes_back_only_after_every_view_is_gone() -> None:
    assert np.prod(SHAPE) >= MIN_BYTES
    pool = BufferPool()
    a = pool.empty(SHAPE, np.uint8)
    a[:] = 7
    row, tensor = a[5], torch.from_numpy(a)
    address = a.__array_interface__["data"][0]
    del a
    gc.collect()
    b = pool.empty(SHAPE, np.uint8)  # a row and a tensor still use the first buffer
    assert b.__array_interface__["data"][0] != address and pool.reused == 0
    b[:] = 1
    assert (row == 7).all() and bool((tensor == 7).all())
    del row
    gc.collect()
    assert pool.empty(SHAPE, np.uint8).__array_interface__["data"][0] != address  # the tensor remains
    del tensor
    gc.collect()
    c = pool.empty(SHAPE, np.uint8)
    assert c.__array_interface__["data"][0] == address and pool.reused == 1


def test_small_and_object_arrays_are_not_pooled() -> None:
    pool = BufferPool()
    small = pool.empty((4, 4), np.float32)
    objects = pool.empty((MIN_BYTES,), object)
    assert small.flags.owndata and objects.flags.owndata


def test_pickled_pool_starts_empty() -> None:
    pool = BufferPool(keep=2)
    a = pool.empty(SHAPE, np.uint8)
    del a
    gc.collect()
    copy = pickle.loads(pickle.dumps(pool))
    assert copy.keep == 2 and copy._idle == {}
