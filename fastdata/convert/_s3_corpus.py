"""A corpus in object storage: ``fastdata convert s3://bucket/prefix/ OUT``.

The prefix is listed once (paginated, with a progress bar once it needs more than one page; the
process's pooled client, botocore's retries; :func:`fastdata.storage.s3.list_prefix`), into the
same :class:`~fastdata.convert.Corpus` a local folder gives: keys below the prefix play the
relative paths, so ``s3://b/train/cat/1.jpg`` under ``s3://b/train/`` is class ``cat``. The layout rules
are the local ones: every key under a "folder" is an ImageFolder tree (the first part of the key is the
class), no key under one is a flat corpus, a mix is refused. Keys with a part starting with ``.`` are
left out, like hidden files. Objects carry no file mtime worth keeping (only the upload's time), so
members get mtime 0: the shards depend on the objects' bytes and names only.

The shard tasks then read the objects themselves (``TarTask``), each
GET checked against the listed size (an object replaced since the listing is an error, or a skip).
"""

from __future__ import annotations

from typing import Any

from fastdata.convert._corpus import Corpus, Item
from fastdata.core.errors import ConfigError


def scan_s3(
    url: str, storage_options: dict[str, Any] | None = None, *, page_size: int = 1000, progress: bool | None = None
) -> Corpus:
    """List the corpus under ``s3://bucket/prefix/``.

    Args:
        url (str): the prefix (a trailing ``/`` is implied: ``s3://b/train`` does not take ``train2/``).
        storage_options (dict | None): :class:`~fastdata.storage.s3.S3Config` fields (endpoint,
            credentials, retries ...). Defaults to the standard AWS chain.
        page_size (int): keys per LIST request (S3 returns at most 1000). Defaults to 1000.
        progress (bool | None): show the listing's progress; None shows it past the first page.

    Raises:
        SourceNotFound: no such bucket, or nothing under the prefix.
        ConfigError: the prefix mixes objects and "folders" at its top level.
    """
    from fastdata.storage.s3 import S3Config, Stats, list_prefix, parse_url

    bucket, key = parse_url(url)
    key = key.strip("/")
    root = f"s3://{bucket}/{key}/" if key else f"s3://{bucket}/"
    options = dict(storage_options or {})
    config = S3Config.from_options(None, **options)
    urls, sizes = list_prefix(root, config, Stats(), page_size=page_size, progress=progress)
    corpus = Corpus(root, storage_options=options)
    rels: list[tuple[str, str, int]] = []
    for u, size in zip(urls, sizes):
        rel = u[len(root) :]
        if any(part.startswith(".") for part in rel.split("/")):
            corpus.ignored += 1
            continue
        rels.append((u, rel, size))
    nested = [r for r in rels if "/" in r[1]]
    if nested and len(nested) != len(rels):
        flat = next(r[1] for r in rels if "/" not in r[1])
        raise ConfigError(
            f"{root}: holds both objects ({flat}, ...) and class 'folders' ({nested[0][1].split('/')[0]}/, ...); "
            "move the objects under a class prefix, or convert a prefix of objects only"
        )
    if nested:
        corpus.classes = sorted({r[1].split("/", 1)[0] for r in rels})
        label = {c: i for i, c in enumerate(corpus.classes)}
        corpus.items = [Item(u, rel, label[rel.split("/", 1)[0]], size, 0) for u, rel, size in rels]
    else:
        corpus.items = [Item(u, rel, -1, size, 0) for u, rel, size in rels]
    if not corpus.items:
        raise ConfigError(f"{root}: holds only hidden objects (names starting with '.'); nothing to convert")
    corpus.items.sort(key=lambda i: i.relpath)
    return corpus
