"""The tar shard inspector: index a shard by scanning its headers (never extracting) and report on it."""

from __future__ import annotations

from collections import Counter

from fastdata.core.errors import SourceNotFound
from fastdata.inspection.report import FileReport, _sha256


def inspect_tar(url: str, checksum: bool = False) -> FileReport:
    """Index a tar shard by scanning its headers (never extracting anything) and report on it."""
    from fastdata.formats.tar import ShardIndex, index_url, scan
    from fastdata.storage import open_reader

    reader = open_reader(url)
    try:
        index = scan(reader)
        report = FileReport(url, "tar", len(index), reader.size)
        report.extensions = dict(sorted(Counter(m[0] for ms in index.members for m in ms).items()))
        report.bad = [str(index.bad[i]) for i in sorted(index.bad)]
        report.complete = index.complete
        if index.tail_error is not None and str(index.tail_error) not in report.bad:
            report.bad.append(str(index.tail_error))
        try:
            side = open_reader(index_url(url))
        except (SourceNotFound, PermissionError):
            report.notes.append("no sidecar index (.idx): readers scan the shard when they open it")
        else:
            try:
                stored = ShardIndex.from_bytes(url, side.read(0, side.size))
                if stored.size != reader.size or stored.keys != index.keys or stored.members != index.members:
                    report.notes.append(
                        "sidecar index (.idx) does not match the shard: readers rescan it; "
                        "rewrite it with 'fastdata inspect --write-manifest'"
                    )
            except Exception as e:  # noqa: BLE001 - any damage means the sidecar is not used
                report.notes.append(f"sidecar index (.idx) is unreadable ({type(e).__name__}); readers rescan")
            finally:
                side.close()
        if checksum:
            report.sha256 = _sha256(reader)
    finally:
        reader.close()
    return report
