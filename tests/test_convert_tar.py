"""``fastdata convert --format tar``: round trip, keys, parallel = serial, corpus problems, resume."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash
from torch.utils.data import DataLoader

import fastdata as fd
from fastdata.convert import CorpusProblems, convert
from fastdata.convert._corpus import sample_names
from fastdata.convert._resume import STATE_DIR
from fastdata.core.errors import ConfigError
from fastdata.formats.tar._index import ShardIndex
from fastdata.formats.tar._reader import scan
from fastdata.storage._local import LocalReader
from tests.convert_driver import kill, start_paused
from tests.datagen import jpeg_bytes, make_image_folder

ROOT = Path(__file__).resolve().parents[1]

# names that trip up WebDataset keys: dots in the stem, one stem with two extensions, long paths
TRICKY = [
    "class_1/a.v2.jpg",
    "class_1/a_v2.jpg",
    "class_1/a.jpg",
    "class_1/a.png",
    "class_1/UPPER.JPG",
    "class_2/nested/deeper/x.jpg",
    "class_0/" + "n" * 120 + ".jpg",  # one component over 100 bytes: a PAX path record
    "class_2/" + "d" * 90 + "/" + "e" * 60 + ".jpg",  # over 100 bytes: the ustar prefix field
    "class_0/noext",
]


def tricky_corpus(root: Path, per_class: int = 12) -> dict[str, tuple[bytes, int]]:
    """An ImageFolder tree; returns relative path -> (bytes, label) for every file."""
    files = {}
    for rel, label in make_image_folder(root, classes=3, per_class=per_class, seed=0):
        files[rel] = ((root / rel).read_bytes(), label)
    rng = np.random.default_rng(99)
    for rel in TRICKY:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(jpeg_bytes(rng))
        files[rel] = (path.read_bytes(), int(rel.split("/")[0][-1]))
    return files


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, tuple[bytes, int]]]:
    root = tmp_path_factory.mktemp("corpus")
    return root, tricky_corpus(root)


@pytest.fixture(scope="module")
def converted(corpus, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("out") / "shards"
    manifest = convert(corpus[0], out, shard_size="12KB", progress=False, fsync=False)
    return out, manifest


def read_all(urls: list[str], num_workers: int) -> list[dict]:
    ds = fd.IndexedTarDataset(urls)
    loader = DataLoader(
        ds,
        batch_size=8,
        num_workers=num_workers,
        collate_fn=list,
        multiprocessing_context="fork" if num_workers else None,
    )
    return [s for batch in loader for s in batch]


def test_round_trip_every_file_once_labels_right_bytes_equal(corpus, converted) -> None:
    _, files = corpus
    out, manifest = converted
    assert len(manifest["shards"]) > 3  # small shards: several shards, samples split across them
    urls = [str(out / s["name"]) for s in manifest["shards"]]
    samples = read_all(urls, num_workers=2)
    assert len(samples) == len(files) == manifest["samples"]
    keys = [s["__key__"] for s in samples]
    assert len(set(keys)) == len(keys), "two files got one key"
    skip = ("__key__", "__url__", "cls")
    got = sorted((data, int(s["cls"])) for s in samples for ext, data in s.items() if ext not in skip)
    assert got == sorted(files.values())
    counts = {f"class_{c}": sum(1 for _, label in files.values() if label == c) for c in range(3)}
    assert manifest["classes"] == ["class_0", "class_1", "class_2"] and manifest["class_counts"] == counts


def test_keys_are_one_per_file_and_keep_extensions(corpus, converted) -> None:
    out, manifest = converted
    members = {}
    for shard in manifest["shards"]:
        index = scan(LocalReader(str(out / shard["name"])))
        for key, ms in zip(index.keys, index.members):
            members[key] = sorted(m[0] for m in ms)
    # a.v2.jpg and a_v2.jpg would both be 'a_v2': each gets its extension appended (then a number)
    assert members["class_1/a_v2_jpg"] == ["cls", "jpg"] and members["class_1/a_v2_jpg_1"] == ["cls", "jpg"]
    # a.png keeps its own key, but is stored under the corpus's one image extension (mixed ones do not batch)
    assert members["class_1/a_jpg"] == ["cls", "jpg"] and members["class_1/a_png"] == ["cls", "jpg"]
    assert manifest["image_ext"] == "jpg" and manifest["image_exts"] == {"jpg": 43, "png": 1}
    renamed = {k: v for s in manifest["shards"] for k, v in s.get("renamed", {}).items()}
    assert renamed == {"class_1/a_png": "png"}
    assert members["class_1/UPPER"] == ["cls", "jpg"]  # extensions lower-cased, as readers expect
    assert members["class_0/noext"] == ["bin", "cls"]
    assert members["class_0/" + "n" * 120] == ["cls", "jpg"]
    assert sample_names([]) == []


def test_manifest_digest_bytes_and_sidecar_index_match_the_files(converted) -> None:
    out, manifest = converted
    for shard in manifest["shards"]:
        path = out / shard["name"]
        data = path.read_bytes()
        # a local output's digest is the fast one, named by its key (SHA-256 is for stores and users)
        assert "sha256" not in shard and xxhash.xxh3_128(data).hexdigest() == shard["xxh3_128"]
        assert len(data) == shard["bytes"]
        side = ShardIndex.from_bytes(str(path), (out / (shard["name"] + ".idx")).read_bytes())
        fresh = scan(LocalReader(str(path)))
        assert (side.keys, side.members, side.spans, side.size) == (fresh.keys, fresh.members, fresh.spans, fresh.size)
        assert fresh.complete and not fresh.bad and len(fresh) == shard["samples"]
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_parallel_conversion_equals_serial(corpus, converted, tmp_path) -> None:
    out, manifest = converted
    par = convert(corpus[0], tmp_path / "par", shard_size="12KB", workers=2, progress=False, fsync=False)
    assert par["shards"] == manifest["shards"]  # names, counts, bytes and sha256
    for shard in par["shards"]:
        assert (tmp_path / "par" / shard["name"]).read_bytes() == (out / shard["name"]).read_bytes()


def test_shard_count_and_shuffle(corpus, tmp_path) -> None:
    root, files = corpus
    a = convert(root, tmp_path / "a", shard_count=4, shuffle=True, seed=5, progress=False, fsync=False)
    b = convert(root, tmp_path / "b", shard_count=4, shuffle=True, seed=5, progress=False, fsync=False)
    convert(root, tmp_path / "c", shard_count=4, progress=False, fsync=False)
    assert len(a["shards"]) == 4 and sum(s["samples"] for s in a["shards"]) == len(files)
    assert max(s["samples"] for s in a["shards"]) - min(s["samples"] for s in a["shards"]) <= 1
    assert a["shards"] == b["shards"]  # same seed, same bytes
    order = [scan(LocalReader(str(tmp_path / d / "shard-000000.tar"))).keys for d in ("a", "c")]
    assert order[0] != order[1] and order[1] == sorted(order[1])


def test_corpus_problems_stop_before_writing_unless_skip_bad(tmp_path) -> None:
    root = tmp_path / "src"
    make_image_folder(root, classes=2, per_class=3)
    (root / "class_0" / "broken.jpg").symlink_to(root / "nowhere.jpg")
    (root / "class_1" / "loop").symlink_to(root / "class_1")
    (root / "empty").mkdir()
    out = tmp_path / "out"
    with pytest.raises(CorpusProblems) as e:
        convert(root, out, progress=False)
    text = str(e.value)
    assert "broken.jpg" in text and "broken link" in text
    assert "symlink loop" in text and "loop" in text
    assert "empty" in text and "nothing was written" in text and "--skip-bad" in text
    assert not out.exists()
    manifest = convert(root, out, skip_bad=True, progress=False, fsync=False)
    assert manifest["samples"] == 6 and manifest["skipped"] == 2 and len(manifest["problems"]) == 3
    assert manifest["class_counts"] == {"class_0": 3, "class_1": 3, "empty": 0}


def test_refuses_other_options_or_a_foreign_folder_and_restart_discards(corpus, tmp_path) -> None:
    root, _ = corpus
    out = tmp_path / "out"
    convert(root, out, shard_size="12KB", progress=False, fsync=False)
    again = convert(root, out, shard_size="12KB", progress=False, fsync=False)  # complete: nothing to redo
    assert again["samples"] > 0
    with pytest.raises(ConfigError, match=r"--shard-size was 12000, now 20000.*--restart"):
        convert(root, out, shard_size="20KB", progress=False)
    manifest = convert(root, out, shard_size="20KB", restart=True, progress=False, fsync=False)
    # the discarded run's shards are gone: only the new plan's are left
    assert sorted(p.name for p in out.glob("*.tar")) == [s["name"] for s in manifest["shards"]]
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not empty"):
        convert(root, foreign, progress=False)
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    with pytest.raises(ConfigError, match="inside the corpus"):
        convert(root, root / "class_0" / "shards", progress=False)
    with pytest.raises(ConfigError, match="format='hdf5'"):
        convert(root, tmp_path / "x", decode=True)
    with pytest.raises(ConfigError, match="is not one of"):
        convert(root, tmp_path / "x", format="zip")  # type: ignore[arg-type]


def make_shards_main(argv: list[str]) -> int:
    """``tools/make_shards.py``'s main, loaded from the checkout (in this process: torch is imported already)."""
    spec = importlib.util.spec_from_file_location("make_shards", ROOT / "tools" / "make_shards.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return int(module.main(argv))


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "fastdata", "convert", *args]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.mark.slow
def test_resume_after_sigkill_loses_and_duplicates_nothing(tmp_path) -> None:
    root = tmp_path / "src"
    make_image_folder(root, classes=4, per_class=40, seed=3)
    out = tmp_path / "killed"
    options = {"shard_count": 80, "workers": 2, "shuffle": True, "seed": 1}
    # paused (in its on_shard hook) once 3 shards are finished: killed mid-way, every time
    kill(start_paused(str(root), str(out), 3, options))
    done = out / STATE_DIR / "done"
    assert not (out / "manifest.json").exists()
    recorded = [p.name[: -len(".json")] for p in done.glob("*.json")]
    before = {n: (out / n).stat().st_mtime_ns for n in recorded}
    assert 3 <= len(recorded) < 80
    args = [str(root), str(out), "--shard-count", "80", "--workers", "2", "--shuffle", "--seed", "1", "--quiet"]
    resumed = subprocess.run(_cli(*args), env=_env(), cwd=ROOT, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    # the same conversion, never interrupted, through the script users run from a checkout
    clean = tmp_path / "clean"
    assert make_shards_main([str(root), str(clean), *args[2:]]) == 0
    a = json.loads((out / "manifest.json").read_text())
    b = json.loads((clean / "manifest.json").read_text())
    assert a["shards"] == b["shards"] and a["samples"] == 160
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in clean.iterdir())  # no leftovers
    assert {n: (out / n).stat().st_mtime_ns for n in recorded} == before, "finished shards were written again"
    keys = [k for s in a["shards"] for k in scan(LocalReader(str(out / s["name"]))).keys]
    assert len(keys) == len(set(keys)) == 160


@pytest.mark.parametrize("workers", [1, 2])
def test_a_file_that_vanishes_mid_run_is_named_or_skipped(tmp_path, workers: int) -> None:
    from fastdata.convert._corpus import scan_corpus
    from tests.convert_driver import convert_listed

    root = tmp_path / "src"
    make_image_folder(root, classes=2, per_class=6)
    corpus = scan_corpus(root)
    (root / "class_1" / "img_0003.jpg").unlink()  # listed, then gone before it is written
    with pytest.raises(fd.SourceNotFound, match=r"img_0003\.jpg: no such file"):
        convert_listed(corpus, str(tmp_path / "out"), shard_count=3, workers=workers, progress=False, fsync=False)
    assert not (tmp_path / "out" / "manifest.json").exists()
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.endswith(".tmp")]
    manifest = convert_listed(
        corpus,
        str(tmp_path / "out"),
        shard_count=3,
        workers=workers,
        skip_bad=True,
        restart=True,
        progress=False,
        fsync=False,
    )
    assert manifest["samples"] == 11 and manifest["skipped"] == 1 and "img_0003.jpg" in manifest["problems"][0]
    assert manifest["class_counts"] == {"class_0": 6, "class_1": 5}


def test_symlinks_each_real_file_once_whichever_way_a_link_points(tmp_path) -> None:
    root = tmp_path / "src"
    make_image_folder(root, classes=3, per_class=2, seed=5)
    (root / "class_0" / "to_later").symlink_to(root / "class_2")  # to a later sibling
    (root / "class_2" / "to_earlier").symlink_to(root / "class_0")  # to an earlier one
    (root / "class_1" / "twin.jpg").symlink_to(root / "class_1" / "img_0000.jpg")  # a file inside
    outside = tmp_path / "elsewhere"
    make_image_folder(outside, classes=1, per_class=2, seed=6)
    (root / "class_1" / "more").symlink_to(outside / "class_0")  # a folder outside: followed
    (root / "class_2" / "again").symlink_to(outside / "class_0")  # ... a second link to it: once
    with pytest.raises(CorpusProblems) as e:
        convert(root, tmp_path / "out", progress=False)
    text = str(e.value)
    # the links into the corpus are refused alike, the earlier one and the later one
    assert "class_0/to_later: symlink to 'class_2' inside the corpus" in text
    assert "class_2/to_earlier: symlink to 'class_0' inside the corpus" in text
    assert "class_1/twin.jpg: symlink to 'class_1/img_0000.jpg'" in text
    assert "class_2/again: leads to the same file or folder as" in text
    manifest = convert(root, tmp_path / "out", skip_bad=True, progress=False, fsync=False)
    assert manifest["class_counts"] == {"class_0": 2, "class_1": 4, "class_2": 2} and manifest["skipped"] == 4
    samples = read_all([str(tmp_path / "out" / s["name"]) for s in manifest["shards"]], num_workers=0)
    keys = sorted(s["__key__"] for s in samples)
    assert keys == sorted(
        [f"class_{c}/img_{i:04d}" for c in range(3) for i in range(2)] + [f"class_1/more/img_{i:04d}" for i in range(2)]
    )
    assert all(int(s["cls"]) == 1 for s in samples if s["__key__"].startswith("class_1/more/"))


def test_an_output_that_is_a_file_is_refused_before_any_work(corpus, tmp_path, capsys) -> None:
    from fastdata.cli import main

    target = tmp_path / "shards.tar"
    target.write_bytes(b"mine")
    for fmt in ("tar", "hdf5"):
        with pytest.raises(ConfigError, match=r"shards\.tar: is a file, not a folder"):
            convert(corpus[0], target, format=fmt, progress=False)  # type: ignore[arg-type]
    assert main(["convert", str(corpus[0]), str(target), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "is a file, not a folder" in err and "Traceback" not in err
    assert target.read_bytes() == b"mine" and sorted(os.listdir(tmp_path)) == ["shards.tar"]


def test_not_enough_free_space_is_refused_before_anything_is_written(tmp_path) -> None:
    from fastdata.convert._space import DiskFull, free_bytes

    root = tmp_path / "src"
    make_image_folder(root, classes=1, per_class=2)
    with open(root / "class_0" / "huge.bin", "wb") as f:  # sparse: planned bytes, no disk used
        f.truncate(free_bytes(str(tmp_path)) + (1 << 30))
    for fmt in ("tar", "hdf5"):
        out = tmp_path / f"out-{fmt}"
        with pytest.raises(DiskFull, match=r"needs about [\d,.]+ MB more, but only [\d,.]+ MB are free there"):
            convert(root, out, format=fmt, progress=False)  # type: ignore[arg-type]
        assert not out.exists(), "a refused conversion left its folder behind"


FILL_DRIVER = """
import json, os, sys
from fastdata.convert import convert
from fastdata.convert._space import DiskFull
src, out, filler = sys.argv[1:4]
def fill(record):  # after the first shard, something else fills the disk
    if not os.path.exists(filler):
        with open(filler, "wb") as f:
            try:
                while True:
                    f.write(bytes(1 << 16))
                    f.flush()
            except OSError:
                pass
result = {}
try:
    convert(src, out, shard_count=6, progress=False, on_shard=fill)
except DiskFull as e:
    result["error"] = str(e)
result["left"] = sorted(os.listdir(out))
os.unlink(filler)
result["manifest"] = convert(src, out, shard_count=6, progress=False)
print(json.dumps(result))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs in a private mount namespace (needs root)")
def test_a_disk_that_fills_up_mid_run_is_a_clear_error_leaving_nothing_behind(tmp_path) -> None:
    root = tmp_path / "src"
    make_image_folder(root, classes=2, per_class=30, seed=2)
    disk = tmp_path / "disk"
    disk.mkdir()
    script = tmp_path / "fill.py"
    script.write_text(FILL_DRIVER)
    command = (
        f"mount -t tmpfs -o size=40m tmpfs {disk} && {sys.executable} {script} {root} {disk / 'out'} {disk / 'filler'}"
    )
    run = subprocess.run(["unshare", "-m", "sh", "-c", command], env=_env(), capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.splitlines()[-1])
    assert "the disk filled up while writing" in result["error"] and "rerun the same command" in result["error"]
    assert "Traceback" not in run.stderr
    left = result["left"]
    assert not [n for n in left if n.endswith(".tmp")], left
    assert "manifest.json" not in left and "shard-000000.tar" in left  # the finished shard is kept
    assert result["manifest"]["samples"] == 60 and len(result["manifest"]["shards"]) == 6


def test_mixed_image_extensions_batch_under_one_key(tmp_path) -> None:
    from PIL import Image

    root = tmp_path / "src"
    make_image_folder(root, classes=2, per_class=6, seed=8)
    for i, rel in enumerate(sorted(root.rglob("*.jpg"))[::3]):
        with Image.open(rel) as img:
            img.save(rel.with_suffix(".png" if i % 2 else ".jpeg"), format="PNG" if i % 2 else "JPEG")
        rel.unlink()
    manifest = convert(root, tmp_path / "out", shard_count=2, progress=False, fsync=False)
    assert manifest["image_ext"] == "jpg" and manifest["image_exts"] == {"jpeg": 2, "jpg": 8, "png": 2}
    urls = [str(tmp_path / "out" / s["name"]) for s in manifest["shards"]]
    loader = DataLoader(fd.IndexedTarDataset(urls, decode="torch"), batch_size=4, num_workers=0)
    batches = list(loader)
    assert sum(len(b["jpg"]) for b in batches) == 12  # every sample has 'jpg': default collate batches them
    assert all(b["jpg"].shape[1:] == (3, 24, 32) for b in batches)
    renamed = {k: v for s in manifest["shards"] for k, v in s.get("renamed", {}).items()}
    assert sorted(renamed.values()) == ["jpeg", "jpeg", "png", "png"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"format": "zip"}, "format='zip' is not one of 'tar', 'hdf5'"),
        ({"workers": 0}, "workers=0 must be >= 1"),
        ({"shard_count": 0}, "shard_count=0 must be >= 1"),
        ({"shard_size": "12 parsecs"}, "shard size '12 parsecs' is not a size"),
        ({"prefix": "a/b"}, "prefix='a/b' must be a plain file name start"),
        ({"staging": "stage"}, "staging and storage_options apply to s3:// outputs only"),
        ({"format": "hdf5", "size": (8, 8)}, "size=(H, W) resizes decoded images: pass decode=True"),
    ],
)
def test_a_bad_option_fails_before_the_corpus_is_listed(tmp_path, options: dict[str, Any], message: str) -> None:
    # the corpus does not exist: listing it would raise SourceNotFound; the options are checked first, all at once
    with pytest.raises(ConfigError, match=re.escape(message)):
        convert(tmp_path / "no-such-corpus", tmp_path / "out", progress=False, **options)
    assert not (tmp_path / "out").exists()
