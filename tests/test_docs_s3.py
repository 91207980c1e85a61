"""docs/s3.md tells the truth about which datasets take S3 options (its examples run under docs/)."""

from __future__ import annotations

import inspect

import fastdata as fd
from tests.docs_examples import ROOT


def test_the_s3_page_shows_storage_options_for_every_dataset_that_takes_them() -> None:
    page = (ROOT / "docs" / "s3.md").read_text(encoding="utf-8")
    for cls in (fd.TarShardDataset, fd.IndexedTarDataset):
        assert "storage_options" in inspect.signature(cls).parameters
        assert f"fd.{cls.__name__}(" in page and "storage_options=" in page, cls.__name__
    assert "take no S3" not in page and "takes no S3" not in page
