"""Checking a remote shard's sidecar index member by member, as the members are read.

Checking every header of a remote shard when its sidecar is loaded costs what reading the shard costs:
the headers lie between the members, and a store's reader fetches nearby ranges together, so for a
shard under a few MiB the check fetches all of it, in every DataLoader worker, where each worker
otherwise reads only its own part. So the sidecar's layout is checked when it is loaded (no bytes
read; see :func:`fastdata.formats.tar.check_on_read`), and the rest as the shard is read
(:class:`Unchecked`, the :attr:`~fastdata.formats.tar.ShardIndex.pending` of such an index):

- a member, the first time it is read: the headers before it (from the end of the member listed before
  it) are read with its data, adjacent bytes and so the same ranged GET (512 bytes more per member, or
  a few blocks where PAX headers come first), and walked as the check of a whole shard walks them
  (valid headers, only what a scan leaves out of every sample, then a regular file with the member's
  name and size, see :mod:`fastdata.formats.tar`);
- what follows a sample read, up to the header of the next member listed (again adjacent bytes): so a
  sample is returned whole, with nothing a scan would make part of it after its last member;
- the end, when the last sample is read: the first ``END_FIRST`` bytes after it come with it, and must
  hold nothing a scan would make part of a sample before the end-of-archive marker or the end of the
  file (a sidecar listing fewer samples than the shard fails here).

A member that fails is never returned: :class:`~fastdata.formats.tar.SidecarMismatch` is raised
and the reader scans the shard and reads again. A sidecar copied from another shard fails at the first
member read, one for an older version of the shard at the first member that moved, one that leaves
samples out at the sample before or after them, or at the end. Each stretch of headers is checked from
where the member listed before it ends, as the sidecar says (that member is checked when it is read, by
this process or by the worker that reads it): a sidecar that leaves out a sample in the middle is
caught by the worker that reads a sample next to the gap, and only there. A global PAX header that
renames the members after it is seen only in the stretch where it lies (one is refused where it is
met: such shards are scanned).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fastdata.formats.tar._headers import BLOCK, Chain, header_problem
from fastdata.formats.tar._index import SidecarMismatch
from fastdata.formats.tar._walk import Cut, Mismatch, compare, walk
from fastdata.storage import Reader

END_FIRST = 4 << 10  # bytes after the last member read with it (the end-of-archive marker is 1 KiB)
END_MOST = 64 << 10  # bytes after the last member read when the first ones are not enough
MAX_GAP = 1 << 20  # the most bytes between two members checked as they are read
CHUNK = 64 << 20  # bytes of shard whose headers :meth:`Unchecked.check_all` reads at once


class Unchecked:
    """What a remote shard's sidecar says and no read has checked yet.

    Args:
        url (str): the shard. size (int): its bytes.
        keys (list[str]): each sample's key. counts (np.ndarray): members per sample.
        exts (list[str]), offs, sizes, starts (np.ndarray): every member in file order: its extension,
            data offset and size, and where the headers before it begin (where the member before it
            ends, padding included).
        tail (int): where the last member ends (its padding included).
    """

    def __init__(
        self,
        url: str,
        size: int,
        keys: list[str],
        counts: np.ndarray,
        exts: list[str],
        offs: np.ndarray,
        sizes: np.ndarray,
        starts: np.ndarray,
        tail: int,
    ) -> None:
        self.url, self.size, self.keys, self.exts, self.tail = url, size, keys, exts, tail
        self.offs, self.sizes, self.starts = offs.tolist(), sizes.tolist(), starts.tolist()
        self.owner = np.repeat(np.arange(len(counts)), counts).tolist()
        self.first = np.concatenate(([0], np.cumsum(counts))).astype(np.int64).tolist()
        self.checked = bytearray(len(self.offs))  # 1 for each member checked
        self.left = len(self.offs)
        self.end_checked = False

    @property
    def done(self) -> bool:
        """Every member and the end checked: the index can be trusted whole."""
        return self.left == 0 and self.end_checked

    def read(self, reader: Reader, which: Sequence[int]) -> list[bytes]:
        """The bytes of every member of samples ``which`` (in order), each checked first, and each sample
        found whole: the headers up to the next member listed (or the end of the archive) are checked
        too, so that nothing a scan would make part of the sample lies after it.

        Raises:
            SidecarMismatch: a member read, the one after a sample, or the end of the archive is not what
                the sidecar says.
        """
        first, checked, offs, sizes, starts = self.first, self.checked, self.offs, self.sizes, self.starts
        m = len(offs)
        ranges: list[tuple[int, int]] = []
        heads: dict[int, int] = {}  # member -> where in ranges the headers before it are (to check it)
        keep: list[int] = []  # where in ranges the members' bytes are
        end = False

        def head(j: int) -> None:
            if not checked[j] and j not in heads:
                if offs[j] - starts[j] > MAX_GAP:
                    problem = f"has more than {MAX_GAP} bytes before the member at byte {offs[j]}"
                    raise SidecarMismatch(self.url, problem)
                heads[j] = len(ranges)
                ranges.append((starts[j], offs[j] - starts[j]))

        for i in which:
            for j in range(first[i], first[i + 1]):
                head(j)
                keep.append(len(ranges))
                ranges.append((offs[j], sizes[j]))
            if first[i + 1] < m:
                head(first[i + 1])  # the next sample starts there: nothing of this one between
            else:
                end = not self.end_checked
        if end:
            ranges.append((self.tail, min(END_FIRST, self.size - self.tail)))
        data = reader.read_ranges(ranges)
        try:
            for j, at in heads.items():
                self._check_member(j, data[at])
            if end:
                self._check_end(reader, data[-1])
        except Mismatch as e:
            raise SidecarMismatch(self.url, str(e)) from None
        for j in heads:
            checked[j] = 1
        self.left -= len(heads)
        self.end_checked = self.end_checked or end
        return [data[k] for k in keep]

    def check_all(self, reader: Reader) -> None:
        """Check every member and the end now: the headers of ``CHUNK`` bytes of shard at a time.

        Raises:
            Mismatch: the sidecar does not describe the shard.
        """
        offs, starts = self.offs, self.starts
        j = 0
        while j < len(offs):
            k = j + 1
            while k < len(offs) and offs[k] - starts[j] < CHUNK:
                k += 1
            for x in range(j, k):
                if offs[x] - starts[x] > MAX_GAP:
                    raise Mismatch(f"has more than {MAX_GAP} bytes before the member at byte {offs[x]}")
            regions = reader.read_ranges([(starts[x], offs[x] - starts[x]) for x in range(j, k)])
            for x, region in zip(range(j, k), regions):
                self._check_member(x, region)
            j = k
        self._check_end(reader, reader.read_ranges([(self.tail, min(END_FIRST, self.size - self.tail))])[0])
        self.checked[:] = b"\1" * len(offs)
        self.left, self.end_checked = 0, True

    def check_end(self, reader: Reader) -> None:
        """Check the end of the archive now (a few KiB after the last member; one request at most).

        Raises:
            Mismatch: something a scan would make part of a sample follows the last member listed.
        """
        if not self.end_checked:
            self._check_end(reader, reader.read_ranges([(self.tail, min(END_FIRST, self.size - self.tail))])[0])
            self.end_checked = True

    def _check_member(self, j: int, region: bytes) -> None:
        """``region``, the bytes from ``starts[j]`` to member ``j``'s data, holds only what a scan leaves out
        of samples, then member ``j``'s own valid header."""
        start, off = self.starts[j], self.offs[j]
        region = bytes(region)
        if len(region) != off - start:
            raise Mismatch(f"lists a member at byte {off}, past the end of the shard")
        chain, walked = Chain(), list[int]()
        got, _ = walk(region, start, chain, walked, member=True)
        if chain.glob:
            raise Mismatch(f"is for a shard with a global PAX header before byte {off}, which only a scan reads")
        compare(got, self.keys[self.owner[j]], self.exts[j], self.sizes[j], off)
        for at in walked:
            problem = header_problem(region[at - start : at - start + BLOCK])
            if problem is not None:
                raise Mismatch(f"does not match the shard: {problem} in the header at byte {at}")

    def _check_end(self, reader: Reader, data: bytes) -> None:
        """``data``, the first bytes after the last member, reach the end of the archive through only what
        a scan leaves out of samples (more is read, once, when they do not reach it)."""
        tail, size = self.tail, self.size
        walked: list[int] = []
        try:
            walk(bytes(data), tail, Chain(), walked, member=False, cut=tail + len(data) < size)
        except Cut:
            if len(data) >= min(END_MOST, size - tail):
                raise Mismatch(
                    f"lists its last member ending at byte {tail}, and more than {END_MOST} bytes of headers and "
                    "members of no sample follow it"
                ) from None
            data = reader.read_ranges([(tail, min(END_MOST, size - tail))])[0]
            self._check_end(reader, data)
            return
        for at in walked:
            problem = header_problem(data[at - tail : at - tail + BLOCK])
            if problem is not None:
                raise Mismatch(f"does not match the shard: {problem} in the header at byte {at}")


__all__ = ["END_FIRST", "END_MOST", "MAX_GAP", "Unchecked"]
