"""Samples grouped by key wherever their members sit in the shard.

``tar cf shard.tar -C folder .`` stores a folder in directory order (on ext4 a hash order), so the
``KEY.jpg``, ``KEY.cls`` and ``KEY.json`` of one sample are rarely next to each other. A reader that cuts
samples where the key changes (webdataset's ``group_by_keys``) returns each key as several partial
samples. The scan sees the whole shard, so it puts every member of a key into one sample instead
(:func:`group_keys`), in the order the keys first appear, and records the keys it had to gather
(:attr:`~fastdata.formats.tar.ShardIndex.split`) so that readers and ``fastdata inspect`` can say
so: other readers still split such a shard, and ``tar --sort=name`` or ``fastdata convert`` rebuild it
with each sample's members together.

A sidecar index (``.idx``) lists members in file order, which a gathered sample breaks: no sidecar is
written for such a shard, and one that lists a key twice is refused (readers scan the shard instead).
"""

from __future__ import annotations

from fastdata.core.errors import BadSample, CorruptShard
from fastdata.formats.tar._index import Member, ShardIndex

SPLIT_KEYS_FIX = (
    "rebuild it with each sample's members together ('tar --sort=name', or 'fastdata convert' of the files)"
)


def has_split_keys(keys: list[str]) -> bool:
    """Some key names two samples (it came back after another key)."""
    return len(set(keys)) != len(keys)


def group_keys(index: ShardIndex) -> None:
    """Merge every sample of ``index`` that shares its key with an earlier one into that one, in place.

    The merged sample keeps the place of the key's first member; its members stay in file order, its
    span runs from its first member to its last. A key with two members of one extension is a bad
    sample (as when they are adjacent). On a damaged shard the last sample stands for the loss
    (:attr:`ShardIndex.tail_error`): it stays last, and takes in the earlier members of its key, which
    may have lost members past the damage.
    """
    keys, members, spans, bad = index.keys, index.members, index.spans, index.bad
    n = len(keys) if index.complete else len(keys) - 1
    at: dict[str, int] = {}  # key -> its sample in the grouped index
    new_keys: list[str] = []
    new_members: list[list[Member]] = []
    new_spans: list[tuple[int, int]] = []
    new_bad: dict[int, BadSample] = {}
    split: dict[str, None] = {}  # the keys gathered, in order
    for i in range(n):
        key = keys[i]
        j = at.get(key)
        if j is None:
            j = at[key] = len(new_keys)
            new_keys.append(key)
            new_members.append(list(members[i]))
            new_spans.append(spans[i])
        else:
            split[key] = None
            have = new_members[j]
            for m in members[i]:
                if any(h[0] == m[0] for h in have):
                    two = CorruptShard(f"{index.url}: sample {key!r} has two '.{m[0]}' members", index.url)
                    new_bad.setdefault(j, two)
                else:
                    have.append(m)
            new_spans[j] = (new_spans[j][0], spans[i][1])
        if i in bad:
            new_bad.setdefault(j, bad[i])
    if not index.complete:
        key = keys[-1]
        j = at.pop(key, None) if key else None
        if j is not None:  # the damage hit a key seen before: its earlier members go with the lost sample
            split[key] = None
            del new_keys[j], new_members[j], new_spans[j]
            new_bad = {(k - (k > j)): e for k, e in new_bad.items() if k != j}
        new_bad[len(new_keys)] = bad[n]
        new_keys.append(key)
        new_members.append(list(members[n]))
        new_spans.append(spans[n])
    index.keys, index.spans, index.bad = new_keys, new_spans, new_bad
    index.members = [tuple(m) for m in new_members]
    index.split = len(split)
    index.split_examples = list(split)[:3]


__all__ = ["SPLIT_KEYS_FIX", "group_keys", "has_split_keys"]
