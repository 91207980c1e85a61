"""``VideoClipDataset`` (``_dataset``) and where its clips start (``_plan``: pure functions of seed, epoch,
video and clip)."""
