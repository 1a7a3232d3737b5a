"""Datasets for training loops over a mounted or downloaded input.

Public API (the rest of the package is internal):

- `FileDataset(root)`: map-style over the files of a folder:
  `len(files)`, `files[i] -> (relative path, bytes)` in listing order.
- `RecordDataset(root, seed=0, shuffle=False, rank=None, world_size=None, ...)`:
  iterable over the records (one dict each) of CSV / parquet / JSON lines
  files or an MLTable folder; shards by node and loader worker, shuffles per
  epoch, resumes exactly from `state_dict()`.
- `RowDataset(root)`: map-style over the same records (read once, into
  Arrow tables): `len(rows)`, `rows[i] -> dict`.
- `Progress`: what `RecordDataset.progress()` reports.
- `hint(root, files)`: tell the datamount mount holding `root` which files
  (relative to `root`) this process reads next, in order (data/hints.py);
  False and nothing sent outside a mount.

Importing this package imports torch only where torch is installed (the
datasets subclass torch's then, data/torchbase.py); `RecordDataset` and
`RowDataset` (pyarrow, the MLTable readers) load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from datamount.data.files import FileDataset, list_files
from datamount.data.hints import hint

if TYPE_CHECKING:
    from datamount.data.records import Progress, RecordDataset
    from datamount.data.rows import RowDataset

__all__ = ["FileDataset", "Progress", "RecordDataset", "RowDataset", "hint", "list_files"]


def __getattr__(name: str) -> object:
    # RecordDataset pulls in pyarrow and the MLTable readers: only when asked for.
    if name in ("RecordDataset", "Progress"):
        from datamount.data import records

        return getattr(records, name)
    if name == "RowDataset":
        from datamount.data.rows import RowDataset

        return RowDataset
    raise AttributeError(name)
