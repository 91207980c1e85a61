"""A resume state is checked against what it resumes (:mod:`fastdata.core.epoch._resume`).

A state saved mid-epoch and loaded under another sample order (another ``shuffle_window``/``shuffle_bytes``,
``shuffle``, ``Loader(shuffle=)``, other shards, a Mix's state into a plain dataset and back) would read
some samples twice and others never: it is refused, naming each setting that differs with both values. What
keeps every sample exactly once (another ``num_workers``, a ``shuffle_bytes`` that leaves the window as it
was, the data moved to another folder) is accepted and read exactly once. Every field is validated: a
garbled state is refused naming the field, never read as an empty or shifted rest of the epoch.
(``test_resume_fuzz.py`` mutates states at random.)
"""

from __future__ import annotations

import shutil
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import fastdata as fd
from fastdata.core.errors import ConfigError
from tests.dist_backends import BACKENDS, BATCH, SEED, batch_keys, make_loader, make_mix_sources
from tests.resume_check import through_json

EPOCH, STOP = 1, 3  # saved after 3 of the 9 batches of epoch 1
NAMES = ("tar_shards", "indexed_tar", "mix")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name in NAMES:
        out[name] = tmp_path_factory.mktemp(name)
        BACKENDS[name].prepare(out[name])
    return out


def urls(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.glob("*.tar"))


def tar_loader(folder: Path, **options: Any) -> fd.Loader:
    kwargs: dict[str, Any] = {"seed": SEED, "shuffle": True, "shuffle_window": 8, "batch_size": BATCH, **options}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a window cut to shuffle_bytes is warned about: not what is tested here
        ds = fd.TarShardDataset(urls(folder), rank=0, world_size=1, **kwargs)
    return fd.Loader(ds, batch_size=BATCH)


def keys(name: str, loader: fd.Loader, limit: int | None = None) -> list[str]:
    return [k for batch in batch_keys(name, loader, limit) for k in batch]


def stopped(name: str, loader: fd.Loader) -> tuple[list[str], dict[str, Any]]:
    """The samples of the first ``STOP`` batches of epoch ``EPOCH``, and the state saved after them."""
    loader.set_epoch(EPOCH)
    head = keys(name, loader, STOP)
    state = through_json(loader.state_dict())
    loader.close()
    return head, state


def refused(loader: fd.Loader, state: dict[str, Any], *needles: str) -> str:
    with pytest.raises(ConfigError) as info:
        loader.load_state_dict(state)
    message = str(info.value)
    for needle in needles:
        assert needle in message, message
    assert f"set_epoch({EPOCH})" in message, message  # the way out: start the epoch again
    return message


def read_exactly_once(name: str, head: list[str], loader: fd.Loader, state: dict[str, Any]) -> None:
    loader.load_state_dict(state)
    rest = keys(name, loader)
    loader.close()
    everything = head + rest
    assert Counter(everything) == Counter(set(everything)), [k for k, n in Counter(everything).items() if n > 1]
    assert len(everything) == (66 if name == "mix" else 33)


# --- D1: another order is refused, naming each setting with both values ---


def test_a_lower_shuffle_window_is_refused_naming_it_with_both_values(data: dict) -> None:
    _, state = stopped("tar_shards", tar_loader(data["tar_shards"]))
    refused(
        tar_loader(data["tar_shards"], shuffle_window=4), state, "shuffle_window", "saved 8, now 4", "shuffle_window=8"
    )


def test_a_shuffle_bytes_that_cuts_the_window_is_refused(data: dict) -> None:
    _, state = stopped("tar_shards", tar_loader(data["tar_shards"]))
    cut = next(
        b for b in (2**k for k in range(10, 20)) if tar_loader(data["tar_shards"], shuffle_bytes=b).dataset.window > 1
    )
    window = tar_loader(data["tar_shards"], shuffle_bytes=cut).dataset.window
    assert window < 8
    refused(tar_loader(data["tar_shards"], shuffle_bytes=cut), state, f"saved 8, now {window}")


def test_a_shuffle_bytes_that_keeps_the_window_reads_the_rest_exactly_once(data: dict) -> None:
    head, state = stopped("tar_shards", tar_loader(data["tar_shards"]))
    read_exactly_once("tar_shards", head, tar_loader(data["tar_shards"], shuffle_bytes=1 << 40), state)


def test_another_shuffle_of_a_tar_dataset_is_refused(data: dict) -> None:
    _, state = stopped("tar_shards", tar_loader(data["tar_shards"]))
    refused(tar_loader(data["tar_shards"], shuffle=False), state, "shuffle: saved True, now False", "shuffle=True")


def test_another_loader_shuffle_of_a_map_style_dataset_is_refused(data: dict) -> None:
    folder = data["indexed_tar"]
    _, state = stopped("indexed_tar", make_loader("indexed_tar", folder, num_workers=0, rank=0, world_size=1))
    loader = make_loader("indexed_tar", folder, num_workers=0, shuffle=False, rank=0, world_size=1)
    refused(loader, state, "shuffle: saved True, now False")


def test_other_shards_are_refused_and_the_same_shards_moved_elsewhere_read_exactly_once(
    data: dict, tmp_path: Path
) -> None:
    head, state = stopped("tar_shards", tar_loader(data["tar_shards"]))
    moved = tmp_path / "moved"
    shutil.copytree(data["tar_shards"], moved)
    read_exactly_once("tar_shards", head, tar_loader(moved), state)
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    for i, url in enumerate(reversed(urls(moved))):  # the same files, listed in another order
        shutil.copy(url, renamed / f"part-{i}.tar")
    refused(tar_loader(renamed), state, "the shards (their names, order and sample counts): saved #")


def one_source_mix(folder: Path) -> fd.Loader:
    """A Mix of the tar source of the ``mix`` data only: as many samples as the plain dataset."""
    tar = make_mix_sources(folder)["tar"]
    return fd.Loader(fd.Mix({"tar": tar}, seed=SEED, rank=0, world_size=1), batch_size=BATCH)


def plain_indexed(folder: Path) -> fd.Loader:
    ds = fd.IndexedTarDataset(urls(folder / "tar"), seed=SEED, rank=0, world_size=1)
    return fd.Loader(ds, batch_size=BATCH)


def test_a_mix_state_into_a_plain_dataset_and_back_is_refused(data: dict) -> None:
    folder = data["mix"]
    _, mixed = stopped("mix", one_source_mix(folder))
    _, plain = stopped("indexed_tar", plain_indexed(folder))
    assert mixed["plan"]["size"] == plain["plan"]["size"] == 33  # the same size: only the plan tells them apart
    refused(plain_indexed(folder), mixed, "the Mix's sources (their names and sizes): saved #", ", now absent")
    refused(one_source_mix(folder), plain, "the Mix's sources (their names and sizes): saved absent, now #")


def test_other_mix_weights_are_refused(data: dict) -> None:
    folder = data["mix"]

    def mix(weights: dict[str, float]) -> fd.Loader:
        ds = fd.Mix(make_mix_sources(folder), weights, seed=SEED, rank=0, world_size=1)
        return fd.Loader(ds, batch_size=BATCH)

    _, state = stopped("mix", mix({"tar": 1, "h5": 1}))
    refused(mix({"tar": 2, "h5": 1}), state, "the samples each Mix source supplies per epoch")


def test_every_difference_is_named_at_once(data: dict) -> None:
    _, state = stopped("tar_shards", tar_loader(data["tar_shards"]))
    message = refused(tar_loader(data["tar_shards"], shuffle=False, seed=SEED + 1), state)
    for needle in ("seed: saved 11, now 12", "shuffle: saved True, now False", "saved 8, now 1"):
        assert needle in message, message


@pytest.mark.parametrize("name", NAMES)
def test_another_num_workers_reads_the_rest_exactly_once(data: dict, name: str) -> None:
    head, state = stopped(name, make_loader(name, data[name], num_workers=0, rank=0, world_size=1))
    read_exactly_once(name, head, make_loader(name, data[name], num_workers=2, rank=0, world_size=1), state)


# --- D3/D11: every field validated ---


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"plan": {"world_size": 0}}, "plan world_size=0"),
        ({"plan": {"world_size": 2**63}}, "a layout of 9223372036854775808 ranks for a dataset of 33 samples"),
        ({"plan": {"batch_size": -8}}, "plan batch_size=-8"),
        ({"plan": {"batch_size": 0}}, "plan batch_size=0"),
        ({"position": 10**6}, "batches=1000000 is outside"),
        ({"position": 2.7}, "position=2.7"),
        ({"position": True}, "position=True"),
        ({"epoch": -1}, "epoch=-1"),
        ({"epoch": "1"}, "epoch='1'"),
        ({"unit": "bytes"}, "unit='bytes'"),
        ({"plan": {"remainder": 7}}, "plan remainder=7"),
        ({"plan": None}, "plan=None"),
        ({"history": [{"world_size": 2}]}, "history"),
        ({"worker": 3, "num_workers": 2}, "worker=3"),
        ({"surprise": 1}, "'surprise'"),
        ({"version": 1}, "version 1, saved by an older fastdata"),
    ],
)
@pytest.mark.parametrize("name", ["tar_shards", "indexed_tar"])
def test_a_garbled_state_is_refused_naming_the_field(data: dict, name: str, change: dict, needle: str) -> None:
    _, state = stopped(name, make_loader(name, data[name], num_workers=0, rank=0, world_size=1))
    plan = change.get("plan", {})
    garbled = {**state, **change, "plan": {**state["plan"], **plan} if isinstance(plan, dict) else plan}
    loader = make_loader(name, data[name], num_workers=0, rank=0, world_size=1)
    with pytest.raises(ConfigError) as info:
        loader.load_state_dict(garbled)
    assert needle in str(info.value), str(info.value)


@pytest.mark.parametrize("name", ["tar_shards", "indexed_tar"])
def test_a_position_past_the_saved_epoch_is_refused_on_another_number_of_ranks(data: dict, name: str) -> None:
    # saved at 2 ranks, loaded at 1: elastic, so the position is checked against the saved layout
    _, state = stopped(name, make_loader(name, data[name], num_workers=0, rank=0, world_size=2))
    loader = make_loader(name, data[name], num_workers=0, rank=0, world_size=1)
    with pytest.raises(ConfigError, match="batches=1000000 is outside the epoch it was saved in"):
        loader.load_state_dict({**state, "position": 10**6})
