"""``HDF5Dataset`` (``_dataset``) and the batch its ``__getitems__`` returns with the collate that reads its
columns (``_batch``)."""
