"""The folder ``fastdata convert`` wrote is a dataset's input: ``TarShardDataset(folder)``,
``IndexedTarDataset(folder)`` and ``HDF5Dataset(folder)`` read the shards its ``manifest.json`` lists
(an ``s3://`` prefix too), and the CLI says "no such file or folder" and "holds no shards" where that is
the case, instead of "is a folder" or "cannot inspect this kind of file"."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

import fastdata as fd
from fastdata.cli import main
from fastdata.convert import convert
from tests.datagen import make_image_folder, make_shards
from tests.s3_server import MotoServer, upload_files


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("folders")
    make_image_folder(root / "photos", classes=2, per_class=6)
    convert(str(root / "photos"), str(root / "tar"), shard_count=3, progress=False, fsync=False)
    convert(str(root / "photos"), str(root / "h5"), format="hdf5", shard_count=2, progress=False, fsync=False)
    return root


def _keys(ds: fd.TarShardDataset) -> list[str]:
    return [s["__key__"] for s in ds]


def test_a_converted_folder_reads_as_its_shards(corpus: Path) -> None:
    folder = corpus / "tar"
    pattern = str(folder / "shard-{000000..000002}.tar")
    assert _keys(fd.TarShardDataset(folder)) == _keys(fd.TarShardDataset(pattern))
    assert fd.TarShardDataset(str(folder) + "/").urls == fd.TarShardDataset(pattern).urls
    indexed = fd.IndexedTarDataset(folder)
    assert len(indexed) == 12 and indexed.urls == fd.TarShardDataset(pattern).urls
    h5 = fd.HDF5Dataset(corpus / "h5", ("image", "label"))
    assert len(h5) == 12 and [Path(p).name for p in h5.paths] == ["shard-000000.h5", "shard-000001.h5"]


def test_the_manifest_decides_what_a_folder_holds(corpus: Path, tmp_path: Path) -> None:
    folder = tmp_path / "tar"
    shutil.copytree(corpus / "tar", folder)
    shutil.copy(folder / "shard-000000.tar", folder / "stray.tar")  # not listed: not read
    assert len(fd.IndexedTarDataset(folder)) == 12
    with pytest.raises(fd.ConfigError, match=r"holds HDF5 parts .* fastdata\.HDF5Dataset"):
        fd.TarShardDataset(corpus / "h5")
    with pytest.raises(fd.ConfigError, match=r"holds tar shards .* fastdata\.TarShardDataset"):
        fd.HDF5Dataset(corpus / "tar", ("image",))


def test_a_folder_without_a_manifest_reads_its_tar_files(tmp_path: Path) -> None:
    make_shards(tmp_path / "other", shards=3, per_shard=4)  # written by another tool: no manifest
    assert len(fd.IndexedTarDataset(tmp_path / "other")) == 12


def test_folders_that_hold_no_shards_say_so(corpus: Path, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(fd.SourceNotFound, match=r"empty: holds no shards"):
        fd.TarShardDataset(tmp_path / "empty")
    with pytest.raises(fd.SourceNotFound, match=r"holds no shards.*converted folders in it: .*tar"):
        fd.TarShardDataset(corpus)  # the parent of the converted folders
    unfinished = tmp_path / "cut"
    shutil.copytree(corpus / "tar", unfinished)
    (unfinished / "manifest.json").unlink()  # written last: a killed conversion has none
    with pytest.raises(fd.SourceNotFound, match=r"unfinished conversion.*rerun the same 'fastdata convert'"):
        fd.TarShardDataset(unfinished)


def test_an_s3_prefix_reads_through_its_manifest(
    corpus: Path, s3_server: MotoServer, s3_bucket: str, s3_options: dict[str, Any]
) -> None:
    files = {f"train/{p.name}": p for p in (corpus / "tar").iterdir() if p.is_file()}
    upload_files(s3_server.client(), s3_bucket, files)
    options = s3_options
    remote = fd.TarShardDataset(f"s3://{s3_bucket}/train/", storage_options=options)
    assert [u.rsplit("/", 1)[1] for u in remote.urls] == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    assert sorted(_keys(remote)) == sorted(_keys(fd.TarShardDataset(corpus / "tar")))
    with pytest.raises(fd.SourceNotFound, match=r"holds no manifest\.json"):
        fd.TarShardDataset(f"s3://{s3_bucket}/nothing/", storage_options=options)


def test_the_cli_names_a_missing_path_and_an_empty_folder(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    typo = str(corpus / "trr")
    assert main(["inspect", typo]) == 2
    err = capsys.readouterr().err
    assert f"{typo}: no such file or folder; did you mean {corpus / 'tar'}?" in err
    assert main(["bench", typo, "--quick"]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    assert main(["bench", str(corpus / "tar" / "shard-{000007..000009}.tar"), "--quick"]) == 2
    assert "no such file or folder (none of the 3 paths" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["inspect", str(tmp_path / "empty")]) == 2
    assert "holds no shards, HDF5 files or videos" in capsys.readouterr().err
    assert main(["bench", str(tmp_path / "empty"), "--quick"]) == 2
    assert "holds no shards, HDF5 files or videos" in capsys.readouterr().err
