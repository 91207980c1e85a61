"""HDF5Dataset passes the shared conformance suite, over files in three layouts."""

from __future__ import annotations

import pytest

import fastdata as fd
from tests.conformance import Backend, Conformance
from tests.hdf5_datagen import make_files


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    # 33 samples in 3 files (chunked, contiguous, gzip): counts that do not divide by 2 or 3 workers
    paths, _ = make_files(tmp_path_factory.mktemp("h5"), (11, 13, 9))
    return paths


def keys_of(batch: dict) -> list[int]:
    return batch["key"].tolist()


class TestHDF5Dataset(Conformance):
    @pytest.fixture
    def backend(self, files: list[str]) -> Backend:
        def make(seed: int, shuffle: bool) -> fd.HDF5Dataset:
            return fd.HDF5Dataset(files, ("image", "label", "key", "blob"), seed=seed)

        return Backend(make, list(range(33)), keys_of, iterable=False)
