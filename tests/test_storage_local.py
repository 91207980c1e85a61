"""Local storage (fastdata.storage): URL expansion (brace ranges, globs) and the local reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastdata.core.errors import ConfigError, SourceNotFound, SourceUnreadable
from fastdata.storage import expand_urls, open_reader


def test_expand_urls_braces_and_globs(tmp_path: Path) -> None:
    for i in range(3):
        (tmp_path / f"a-{i:02d}.tar").write_bytes(b"")
    assert expand_urls(str(tmp_path / "a-{00..02}.tar")) == [str(tmp_path / f"a-{i:02d}.tar") for i in range(3)]
    assert expand_urls(str(tmp_path / "a-*.tar")) == [str(tmp_path / f"a-{i:02d}.tar") for i in range(3)]
    assert expand_urls(["s3://b/x-{1..2}.tar"]) == ["s3://b/x-1.tar", "s3://b/x-2.tar"]
    with pytest.raises(SourceNotFound, match="matches no file"):
        expand_urls(str(tmp_path / "b-*.tar"))


def test_local_reader_reads_ranges_and_names_missing_files(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(100)))
    with open_reader(str(path)) as reader:
        assert reader.size == 100 and reader.read(98, 10) == b"\x62\x63"
        assert reader.read_ranges([(0, 2), (50, 1)]) == [b"\x00\x01", b"\x32"]
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    assert open_reader(str(empty)).read(0, 10) == b""
    with pytest.raises(SourceNotFound, match=r"missing\.bin: no such file"):
        open_reader(str(tmp_path / "missing.bin"))
    with pytest.raises(SourceUnreadable, match="is a folder"):
        open_reader(str(tmp_path))
    with pytest.raises(ConfigError, match="unknown scheme 'gs'"):
        open_reader("gs://bucket/key")
