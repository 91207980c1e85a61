"""``fastdata convert SRC OUT --format tar|hdf5 ...``: a thin layer over :func:`fastdata.convert.convert`."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from fastdata.core.errors import ConfigError


def _hw(text: str) -> tuple[int, int]:
    try:
        h, w = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not HxW, like 224x224") from None
    return h, w


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``fastdata convert`` (shared with ``tools/make_shards.py``)."""
    p.add_argument(
        "src",
        help="an ImageFolder tree (one folder per class) or a flat folder of files, local or "
        "s3://bucket/prefix/ laid out the same way",
    )
    p.add_argument(
        "out",
        help="output folder (new or empty, or holding an interrupted run to resume), or "
        "s3://bucket/prefix (tar: shards are uploaded as they are finished)",
    )
    p.add_argument("--format", choices=["tar", "hdf5"], default="tar", help="output format (default: tar)")
    size = p.add_mutually_exclusive_group()
    size.add_argument(
        "--shard-size",
        default="256MB",
        metavar="SIZE",
        help="most bytes per shard, like 256MB, 1GB or 64MiB (default: 256MB)",
    )
    size.add_argument("--shard-count", type=int, metavar="N", help="exactly N shards of equal sample counts")
    p.add_argument("--workers", type=int, default=1, metavar="N", help="processes writing shards (default: 1)")
    p.add_argument("--shuffle", action="store_true", help="tar: shuffle files across shards (seeded by --seed)")
    p.add_argument("--seed", type=int, default=0, help="seed of --shuffle, and of HDF5's row order (default: 0)")
    p.add_argument("--prefix", default="shard", help="shard names are PREFIX-000000.tar (or .h5) ... (default: shard)")
    p.add_argument(
        "--engine",
        choices=["local", "ray"],
        default="local",
        help="where shards are written: this machine (--workers processes) or a Ray cluster (tar; "
        "pip install 'fastdata[ray]'; default: local)",
    )
    p.add_argument(
        "--address",
        metavar="ADDR",
        help="--engine ray: the cluster, like 10.0.0.5:6379 or ray://head:10001 (default: $RAY_ADDRESS, "
        "else a cluster on this machine, else a new local one)",
    )
    p.add_argument(
        "--skip-bad",
        action="store_true",
        help="convert the files that can be read and list the others in the manifest "
        "(default: stop before writing anything and list the problems)",
    )
    p.add_argument(
        "--restart", action="store_true", help="discard an interrupted conversion in OUT made with other options"
    )
    p.add_argument(
        "--no-fsync",
        dest="fsync",
        action="store_false",
        help="do not flush shards to disk before recording them (faster; a killed run still "
        "resumes correctly, a power loss may not)",
    )
    p.add_argument("--decode", action="store_true", help="hdf5: store decoded pixels")
    p.add_argument("--size", type=_hw, metavar="HxW", help="hdf5 with --decode: resize images to HxW")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    s3 = p.add_argument_group("s3:// source or output")
    s3.add_argument(
        "--staging",
        metavar="DIR",
        help="s3:// output: local folder to stage shards in before their upload (deleted when complete; "
        "default: $FASTDATA_CACHE_DIR or ~/.cache/fastdata, under convert-staging/)",
    )
    s3.add_argument(
        "--endpoint-url",
        metavar="URL",
        help="S3 endpoint, like http://127.0.0.1:9000 (default: the AWS chain: AWS_ENDPOINT_URL ...)",
    )
    s3.add_argument("--profile", metavar="NAME", help="AWS profile for the credentials (default: the AWS chain)")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "convert",
        help="convert a folder of small files into tar shards or HDF5",
        description="Convert an ImageFolder tree or a flat folder into WebDataset tar shards "
        "(or HDF5). Rerun the same command to resume an interrupted conversion.",
    )
    add_arguments(p)
    # what the CLI says after Ctrl-C: finished shards are kept (see Resuming in docs/tar.md)
    p.set_defaults(run=run, interrupted="rerun the same command to resume (finished shards are kept)")


def run(args: argparse.Namespace) -> int:
    from fastdata.convert import convert

    if args.format == "tar" and (args.decode or args.size):
        raise ConfigError("--decode and --size apply to --format hdf5 only")
    options = {k: v for k, v in (("endpoint_url", args.endpoint_url), ("profile_name", args.profile)) if v}
    remote_src, remote_out = args.src.startswith("s3://"), args.out.startswith("s3://")
    if args.staging and not remote_out:
        raise ConfigError("--staging applies to an s3:// output only")
    if options and not (remote_src or remote_out):
        raise ConfigError("--endpoint-url and --profile apply to an s3:// source or output only")
    if args.address and args.engine != "ray":
        raise ConfigError("--address applies to --engine ray only")
    common: dict[str, Any] = dict(
        shard_size=args.shard_size if args.shard_count is None else None,
        shard_count=args.shard_count,
        workers=args.workers,
        seed=args.seed,
        prefix=args.prefix,
        skip_bad=args.skip_bad,
        restart=args.restart,
        fsync=args.fsync,
        progress=not args.quiet,
        source_options=options if remote_src else None,
    )
    if args.format == "tar":
        manifest = convert(
            args.src,
            args.out,
            format="tar",
            shuffle=args.shuffle,
            staging=args.staging,
            storage_options=options if remote_out else None,
            engine=args.engine,
            address=args.address,
            **common,
        )
    else:
        if args.shuffle:
            raise ConfigError("--shuffle applies to --format tar: HDF5 rows are always shuffled (by --seed)")
        manifest = convert(
            args.src, args.out, format="hdf5", decode=args.decode, size=args.size, engine=args.engine, **common
        )
    summary(manifest, args.out)
    return 0


def summary(manifest: dict[str, Any], out: str) -> None:
    """Print what was written and how to read it."""
    shards = manifest.get("shards", [])
    line = f"fastdata convert: {manifest.get('samples', '?')} samples"
    if manifest.get("fields"):  # members per sample, by extension: a caption cut from its image shows here
        line += " (" + ", ".join(f"{n} {ext}" for ext, n in manifest["fields"].items()) + ")"
    if shards:
        line += f" in {len(shards)} shard(s), {manifest.get('bytes', 0) / 1e6:.1f} MB"
    if manifest.get("skipped"):
        line += f"; {manifest['skipped']} file(s) skipped (listed in manifest.json 'problems')"
    print(line, file=sys.stderr)
    if manifest.get("pattern"):
        reader = "HDF5Dataset" if manifest.get("format") == "hdf5" else "TarShardDataset"
        where = (
            out.rstrip("/") + "/" + manifest["pattern"]
            if out.startswith("s3://")
            else os.path.join(out, manifest["pattern"])
        )
        print(f"read them with fastdata.{reader}({where!r})", file=sys.stderr)
        if manifest.get("format") != "hdf5" and _holds_videos(manifest.get("fields") or {}) and "://" not in out:
            print(f"or their clips with fastdata.VideoClipDataset({where!r}, clip_len=16)", file=sys.stderr)


def _holds_videos(fields: dict[str, Any]) -> bool:
    """Whether the samples' members include videos (a video folder was converted)."""
    from fastdata.formats import VIDEO_EXTENSIONS

    return any(f".{ext}" in VIDEO_EXTENSIONS for ext in fields)
