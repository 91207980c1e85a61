"""The tar shard inspector: index a shard by scanning its headers (never extracting) and report on it."""

from __future__ import annotations

from collections import Counter

from fastdata.core.errors import SourceNotFound
from fastdata.inspection._report import FileReport, _sha256


def inspect_tar(url: str, checksum: bool = False) -> FileReport:
    """Index a tar shard by scanning its headers (never extracting anything) and report on it.

    A compressed shard (gzip, xz, bzip2, zstd: told by its first bytes) is decompressed in memory and scanned; its
    sidecar index, if any, is checked against the shard's headers as readers check it.
    """
    from fastdata.formats.tar import UNDO, CompressedShard, ShardIndex, check_index, compression_of, index_url, scan
    from fastdata.storage import open_reader

    reader = open_reader(url)
    tar = reader
    try:
        notes = []
        packed = compression_of(reader)
        if packed is not None:
            tar = CompressedShard(reader, packed)
            notes.append(
                f"{packed}-compressed ({tar.size} bytes of tar): TarShardDataset reads it (decompressed in memory); "
                f"IndexedTarDataset needs it decompressed ('{UNDO[packed]}')"
            )
        index = scan(tar)
        report = FileReport(url, "tar", len(index), reader.size, notes=notes)
        report.extensions = dict(sorted(Counter(m[0] for ms in index.members for m in ms).items()))
        report.bad = [str(index.bad[i]) for i in sorted(index.bad)]
        report.complete = index.complete
        if index.tail_error is not None and str(index.tail_error) not in report.bad:
            report.bad.append(str(index.tail_error))
        if index.split:
            from fastdata.formats.tar import SPLIT_KEYS_FIX

            report.details["split_keys"] = index.split
            named = ", ".join(repr(k) for k in index.split_examples)
            report.notes.append(
                f"keys split across the shard: {index.split} key(s) ({named}, ...) have members that are not "
                "next to each other (tar of a folder stores directory order); fastdata reads each as one "
                f"sample, webdataset and other readers return them as partial samples: {SPLIT_KEYS_FIX}"
            )
        if index.ignored:
            report.notes.append(
                f"{index.ignored} member(s) without an extension (a README?) belong to no sample: readers "
                "leave them out (WebDataset names are KEY.EXT)"
            )
        try:
            side = open_reader(index_url(url))
        except (SourceNotFound, PermissionError):
            report.notes.append("no sidecar index (.idx): readers scan the shard when they open it")
        else:
            try:
                problem = check_index(ShardIndex.from_bytes(url, side.read(0, side.size)), tar)
                if problem is not None:
                    report.notes.append(
                        f"sidecar index (.idx) does not match the shard ({problem}): readers scan the shard "
                        "instead; rewrite it with 'fastdata inspect --write-manifest'"
                    )
            except Exception as e:  # noqa: BLE001 - any damage means the sidecar is not used
                report.notes.append(f"sidecar index (.idx) is unreadable ({type(e).__name__}); readers rescan")
            finally:
                side.close()
        if checksum:
            report.sha256 = _sha256(reader)
    finally:
        tar.close()
        reader.close()
    return report
