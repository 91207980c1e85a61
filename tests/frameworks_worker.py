"""One rank of the framework tests; ``tests/test_frameworks.py`` launches it with torchrun (2 ranks, gloo).

    torchrun --standalone --nproc-per-node=2 tests/frameworks_worker.py --root DIR

``DIR/<backend>/`` holds each backend's data. One launch runs every scenario in turn (the monitor's reports
first, then Accelerate's:
its state joins the process group started here, then Lightning's, which finds it started), and writes
``DIR/rank<R>.json``: per scenario, the keys each epoch read on this rank and the steps, or the error.
Every collective runs under a gloo timeout, so a rank left waiting fails instead of hanging.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script by torchrun

import fastdata as fd
from tests.dist_backends import BACKENDS, BATCH, make_dataset

EPOCHS = 2
STOP = 2  # batches of epoch 1 read before the mid-epoch checkpoint
LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK")


def keys(name: str, batch: Any) -> list[str]:
    return [str(k) for k in BACKENDS[name].keys_of(batch)]


def built_without(drop: tuple[str, ...], name: str, folder: Path) -> Any:
    """The dataset built while the launch variables ``drop`` are unset: before the ranks exist (all of them,
    as in a ddp_spawn parent), or as a Lightning ddp child sees them (no ``RANK``)."""
    saved = {k: os.environ.pop(k) for k in drop if k in os.environ}
    try:
        return make_dataset(name, folder)
    finally:
        os.environ.update(saved)


def run_epochs(name: str, loader: Any, set_epoch: Any = None) -> dict[str, Any]:
    out: dict[str, Any] = {"epochs": [], "steps": []}
    try:
        for epoch in range(EPOCHS):
            if set_epoch is not None:
                set_epoch(epoch)
            got = [k for batch in loader for k in keys(name, batch)]
            out["epochs"].append(got)
            out["steps"].append(-(-len(got) // BATCH))
    except Exception as e:  # noqa: BLE001  # the error is the result of this scenario
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def monitor(root: Path, ds: Any) -> None:
    """One epoch through ``fd.Loader(monitor=...)`` to ``DIR/reports/loader.jsonl`` and
    ``DIR/reports/{rank}/loader.jsonl`` (the same paths on every rank, as one script launched on every rank
    gives them), and one through ``fd.monitor`` of a plain DataLoader logging to the logger
    ``fastdata.monitor``, whose lines go to ``DIR/log<RANK>.txt``. ``ds`` was built before the process group."""
    from fastdata.loading.observe import Monitor

    to = [str(root / "reports" / "loader.jsonl"), str(root / "reports" / "{rank}" / "loader.jsonl")]
    with fd.Loader(ds, batch_size=BATCH, monitor=Monitor(to=to, seconds=None, every=2)) as loader:
        for _ in loader:
            pass
    handler = logging.FileHandler(root / f"log{dist.get_rank()}.txt")
    logger = logging.getLogger("fastdata.monitor")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with fd.monitor(DataLoader(ds, sampler=ds.sampler(), batch_size=BATCH), seconds=None, every=2) as plain:
            for _ in plain:
                pass
    finally:
        logger.removeHandler(handler)
        handler.close()


def accelerate(root: Path) -> dict[str, Any]:
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    res: dict[str, Any] = {}
    acc = Accelerator(cpu=True)
    # a plain DataLoader over fastdata's rank-aware sampler: Accelerate splits it again (BatchSamplerShard)
    ds = make_dataset("hdf5", root / "hdf5")
    dl = acc.prepare(DataLoader(ds, sampler=ds.sampler(), batch_size=BATCH))
    res["accelerate/hdf5/DataLoader(sampler=ds.sampler())"] = run_epochs("hdf5", dl, dl.set_epoch)
    # the docs' plain tar recipe: an iterable dataset is dispatched from rank 0 (DataLoaderDispatcher)
    tar = make_dataset("tar_shards", root / "tar_shards")
    dl = acc.prepare(DataLoader(tar, batch_size=None, collate_fn=fd.as_is))
    res["accelerate/tar/DataLoader(batch_size=None)"] = run_epochs("tar_shards", dl)
    # fd.Loader, which prepare() leaves as it is; and the dataset told to let Accelerate split alone
    for name in ("tar_shards", "hdf5", "mix"):
        loader = acc.prepare(fd.Loader(make_dataset(name, root / name), batch_size=BATCH))
        acc.register_for_checkpointing(loader)
        res[f"accelerate/{name}/fd.Loader"] = run_epochs(name, loader, loader.set_epoch)
    one = make_dataset("hdf5", root / "hdf5", rank=0, world_size=1)
    dl = acc.prepare(DataLoader(one, batch_size=BATCH, sampler=one.sampler(), drop_last=True))
    res["accelerate/hdf5/DataLoader(rank=0, world_size=1)"] = run_epochs("hdf5", dl, dl.set_epoch)
    del DataLoaderConfiguration
    res["accelerate/tar_shards/save"] = accelerate_checkpoint(root)
    return res


def accelerate_checkpoint(root: Path, resume: bool = False) -> dict[str, Any]:
    """The recipe of docs/frameworks.md: ``save_state`` after ``STOP`` batches of epoch 1 on the 2 ranks into
    ``DIR/accelerate-ckpt``; with ``resume``, in one process, ``load_state`` and read on to the end of epoch 2.
    A fresh Accelerator, so that the loader is the only object registered for checkpointing."""
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    loader = acc.prepare(fd.Loader(make_dataset("tar_shards", root / "tar_shards"), batch_size=BATCH))
    acc.register_for_checkpointing(loader)  # the one line: save_state/load_state carry its position
    out: dict[str, Any] = {"epochs": [], "steps": []}
    first = 0
    if resume:
        acc.load_state(str(root / "accelerate-ckpt"))
        first = loader.epoch
    out["first_epoch"] = first
    try:
        for epoch in range(first, EPOCHS + 1 if resume else EPOCHS):
            loader.set_epoch(epoch)
            got: list[str] = []
            for batch in loader:
                got += keys("tar_shards", batch)
                if not resume and epoch == 1 and loader.consumed == STOP:
                    acc.save_state(str(root / "accelerate-ckpt"))
            out["epochs"].append(got)
            out["steps"].append(-(-len(got) // BATCH))
    except Exception as e:  # noqa: BLE001
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def trainer(root: Path) -> dict[str, Any]:
    """Hugging Face ``Trainer``, which builds its own DataLoader and prepares it through Accelerate: over a
    dataset split by fastdata (refused, naming the fix), over one built with ``rank=0, world_size=1`` (with
    ``dataloader_drop_last``: Accelerate's split alone, no padding), and with ``get_train_dataloader``
    returning an ``fd.Loader`` (the recipe of docs/frameworks.md)."""
    from transformers import Trainer, TrainingArguments

    class Model(torch.nn.Module):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name, self.w = name, torch.nn.Parameter(torch.zeros(1))
            self.seen: list[list[str]] = []

        def forward(self, **batch: Any) -> dict[str, Any]:
            self.seen.append(keys(self.name, batch))
            return {"loss": self.w.sum() * 0.0}

    class LoaderTrainer(Trainer):
        def get_train_dataloader(self) -> Any:
            return fd.Loader(self.train_dataset, batch_size=self._train_batch_size)

    def fit(name: str, ds: Any, kind: Any = Trainer) -> dict[str, Any]:
        args = TrainingArguments(
            str(root / "trainer-out"),
            per_device_train_batch_size=BATCH,
            num_train_epochs=EPOCHS,
            use_cpu=True,
            report_to=[],
            save_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
            remove_unused_columns=False,  # keep every field of fastdata's samples
            dataloader_drop_last=True,
        )
        model = Model(name)
        out: dict[str, Any] = {}
        try:
            kind(model=model, args=args, train_dataset=ds).train()
        except Exception as e:  # noqa: BLE001
            out["error"] = f"{type(e).__name__}: {e}"
        per_epoch = len(model.seen) // EPOCHS
        steps = [model.seen[e * per_epoch : (e + 1) * per_epoch] for e in range(EPOCHS)]
        out["epochs"] = [[k for batch in epoch for k in batch] for epoch in steps]
        out["steps"] = [per_epoch] * EPOCHS
        return out

    res = {"trainer/hdf5/Trainer": fit("hdf5", make_dataset("hdf5", root / "hdf5"))}
    one = make_dataset("hdf5", root / "hdf5", rank=0, world_size=1)
    res["trainer/hdf5/Trainer(rank=0, world_size=1)"] = fit("hdf5", one)
    for name in ("tar_shards", "hdf5", "mix"):
        res[f"trainer/{name}/fd.Loader"] = fit(name, make_dataset(name, root / name), LoaderTrainer)
    return res


def lightning(
    root: Path, before: dict[str, Any], devices: int = 2, ckpt: Path | None = None, save: Path | None = None
) -> dict[str, Any]:
    import lightning.pytorch as pl

    class Model(pl.LightningModule):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.seen: dict[int, list[str]] = {}  # by epoch: a resumed epoch starts without on_train_epoch_start

        def training_step(self, batch: Any, i: int) -> Any:
            self.seen.setdefault(self.current_epoch, []).extend(keys(self.name, batch))
            return self.w.sum() * 0.0

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class SaveAt(pl.Callback):
        """Save a checkpoint mid-epoch, as ``ModelCheckpoint(every_n_train_steps=...)`` does."""

        def __init__(self, step: int, path: Path) -> None:
            self.step, self.path = step, path

        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            if trainer.global_step == self.step:
                trainer.save_checkpoint(self.path)

    def fit(name: str, loader: Any, **options: Any) -> dict[str, Any]:
        model = Model(name)
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=devices,
            strategy="ddp" if devices > 1 else "auto",
            max_epochs=options.pop("max_epochs", EPOCHS),
            use_distributed_sampler=True,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            **options,
        )
        out: dict[str, Any] = {}
        try:
            trainer.fit(model, train_dataloaders=loader, ckpt_path=ckpt)
        except Exception as e:  # noqa: BLE001
            out["error"] = f"{type(e).__name__}: {e}"
        out["epochs"] = [model.seen[e] for e in sorted(model.seen)]
        out["first_epoch"] = min(model.seen, default=None)
        out["steps"] = [-(-len(s) // BATCH) for s in out["epochs"]]
        return out

    res: dict[str, Any] = {}
    if ckpt is not None:  # resume the checkpoint saved mid-epoch 1 on 2 ranks, here on 1 device
        loader = fd.Loader(make_dataset("tar_shards", root / "tar_shards"), batch_size=BATCH)
        return {"lightning/tar_shards/resume": fit("tar_shards", loader, max_epochs=EPOCHS + 1)}
    if save is not None:  # stop after STOP batches of epoch 1, and save a checkpoint there
        loader = fd.Loader(make_dataset("tar_shards", root / "tar_shards"), batch_size=BATCH)
        at = SaveAt(len(loader) + STOP, save)
        return {"lightning/tar_shards/save": fit("tar_shards", loader, callbacks=[at])}
    for name in ("hdf5", "mix"):
        ds = make_dataset(name, root / name)
        res[f"lightning/{name}/DataLoader(sampler=ds.sampler())"] = fit(
            name, DataLoader(ds, sampler=ds.sampler(), batch_size=BATCH)
        )
    for name in ("tar_shards", "hdf5", "mix"):
        res[f"lightning/{name}/fd.Loader"] = fit(name, fd.Loader(make_dataset(name, root / name), batch_size=BATCH))
    # built before the process group: no launch variables at all (a ddp_spawn parent), no RANK (a ddp child)
    for how, ds in before.items():
        res[f"lightning/tar_shards/fd.Loader(built {how})"] = fit("tar_shards", fd.Loader(ds, batch_size=BATCH))
    return res


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--resume", action="store_true", help="one process: resume the 2-rank checkpoint")
    args = parser.parse_args()
    root: Path = args.root
    if args.resume:
        result = lightning(root, {}, devices=1, ckpt=root / "mid.ckpt")
        result["accelerate/tar_shards/resume"] = accelerate_checkpoint(root, resume=True)
        (root / "resume.json").write_text(json.dumps(result))
        return
    before = {
        "before the ranks": built_without(LAUNCH_VARS, "tar_shards", root / "tar_shards"),
        "without RANK": built_without(("RANK",), "tar_shards", root / "tar_shards"),
    }
    built = {how: [ds.rank, ds.world_size] for how, ds in before.items()}
    watched = built_without(LAUNCH_VARS, "hdf5", root / "hdf5")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    monitor(root, watched)
    result = {"built": built, **accelerate(root), **trainer(root), **lightning(root, before)}
    result.update(lightning(root, {}, save=root / "mid.ckpt"))
    (root / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
