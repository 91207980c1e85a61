"""One rank of tests/test_cache_distributed.py, launched by torchrun:

    torchrun --standalone --nproc-per-node=2 tests/cache_rank.py SPEC.json OUT_DIR

``SPEC.json`` names the shards, the S3 options (through the counting proxy) and the shared cache folder.
Each rank reads two epochs of the shards through a DataLoader with 2 workers, a barrier between epochs,
and writes the keys it read per epoch and its dataset's counters to ``OUT_DIR/rank<R>.json``.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import torch.distributed as dist
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script by torchrun

import fastdata as fd

WORKERS = 2
EPOCHS = 2


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    ds = fd.TarShardDataset(
        spec["urls"],
        shuffle=True,
        batch_size=spec["batch_size"],
        collate_fn=fd.as_is,
        storage_options=spec["options"],
        cache_dir=spec["cache_dir"],
    )
    loader = DataLoader(
        ds,
        batch_size=None,
        collate_fn=fd.as_is,
        num_workers=WORKERS,
        persistent_workers=True,
        multiprocessing_context="fork",
    )
    epochs = []
    for epoch in range(EPOCHS):
        ds.set_epoch(epoch)
        dist.barrier()  # both ranks read each epoch at the same time, from the one cache
        epochs.append({s["__key__"]: len(s["bin"]) for batch in loader for s in batch})
    dist.barrier()
    (out / f"rank{rank}.json").write_text(json.dumps({"epochs": epochs, "counters": ds.counters()}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
