"""`RowDataset`: map-style random access to the records of an MLTable or a
folder of record files (the units of sources.py, in their listing order).

Every record is read once, at construction, into one Arrow table per unit
(columnar: far smaller than Python dicts); `ds[i]` is the dict of row i,
found by bisecting the units' row offsets. For data larger than RAM, stream
it with RecordDataset instead. No threads.
"""

from __future__ import annotations

import bisect
import os
from typing import Any

import pyarrow as pa

from datamount.data.sources import units_of
from datamount.data.torchbase import MapBase


class RowDataset(MapBase):
    """`len(ds)` records; `ds[i] -> dict`, in RecordDataset's unshuffled order."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = root
        self._tables: list[pa.Table] = []
        self._starts: list[int] = []
        total = 0
        for unit in units_of(root):
            table = pa.Table.from_pylist(list(unit.read()))
            if table.num_rows:
                self._tables.append(table)
                self._starts.append(total)
                total += table.num_rows
        self._len = total

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> dict[str, Any]:
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError(f"row {index} of {self._len}")
        unit = bisect.bisect_right(self._starts, index) - 1
        row = self._tables[unit].slice(index - self._starts[unit], 1).to_pylist()
        return dict(row[0])

    def __repr__(self) -> str:
        return f"RowDataset({os.fspath(self.root)!r}, {self._len} rows)"
