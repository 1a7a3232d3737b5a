"""What a RecordDataset reads: its root as a list of `Unit`s (one per file),
each read through datamount's MLTable readers (mltable/readers.py), never
parsed here.

A root is a folder of files (format by suffix: .csv, .tsv, .parquet/.pq,
.jsonl/.json/.ndjson; files with other suffixes are skipped), a single such
file, or an MLTable (a folder holding an `MLTable` file, the file itself, or
a URI): its read step reads each of its files. An MLTable with
transformations after its read step (take, filter, ...) is read whole, as one
unit, since those steps count rows over the whole table. No threads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datamount.errors import InvalidInput
from datamount.mltable import readers
from datamount.mltable.delimited import read_delimited
from datamount.mltable.evaluate import Stores, locate
from datamount.mltable.layout import EvalFile
from datamount.mltable.model import ReadDelimited, ReadJsonLines, ReadParquet, Step, parse_mltable
from datamount.mltable.tabular import TabularMLTable, default_store_factory, load
from datamount.workspace.datastores import Workspace

Record = dict[str, Any]

_BY_SUFFIX: dict[str, tuple[Callable[..., Iterator[readers.Chunk]], Any]] = {
    ".csv": (read_delimited, ReadDelimited()),
    ".tsv": (read_delimited, ReadDelimited(delimiter="\t")),
    ".parquet": (readers.read_parquet, ReadParquet()),
    ".pq": (readers.read_parquet, ReadParquet()),
    ".jsonl": (readers.read_json_lines, ReadJsonLines()),
    ".json": (readers.read_json_lines, ReadJsonLines()),
    ".ndjson": (readers.read_json_lines, ReadJsonLines()),
}
_READ_STEPS: dict[str, Callable[..., Iterator[readers.Chunk]]] = {
    "read_delimited": read_delimited,
    "read_parquet": readers.read_parquet,
    "read_json_lines": readers.read_json_lines,
}


@dataclass(frozen=True)
class Unit:
    """One file (or a whole transformed MLTable): `read()` streams its records."""

    name: str
    size: int
    read: Callable[[], Iterator[Record]]


def units_of(root: str | os.PathLike[str], block_size: int = readers.BLOCK_SIZE) -> list[Unit]:
    """The units of `root`, in the order the dataset numbers them."""
    text = os.fspath(root)
    path = Path(text)
    if "://" in text or (path / "MLTable").is_file() or path.name == "MLTable":
        return _mltable_units(load(text, block_size=block_size))
    if path.is_file():
        return _folder_units(path.parent, [path.name], block_size)
    if not path.is_dir():
        raise InvalidInput(f"{text}: no such file or folder")
    return _folder_units(path, None, block_size)


def fingerprint(units: list[Unit]) -> str:
    """Names and sizes: a saved position only fits the same data."""
    digest = hashlib.sha256()
    for unit in units:
        digest.update(f"{unit.name}\0{unit.size}\n".encode())
    return digest.hexdigest()[:16]


def _records(chunks: Iterator[readers.Chunk]) -> Iterator[Record]:
    for chunk in chunks:
        yield from chunk.batch.to_pylist()


def _file_unit(
    reader: Callable[..., Iterator[readers.Chunk]],
    options: Any,
    file: EvalFile,
    factory: Callable[..., Any],
    block_size: int,
    name: str,
) -> Unit:
    def read() -> Iterator[Record]:
        with Stores(factory) as stores:
            yield from _records(
                reader(options, [file], lambda f: stores.get(f.location), block_size)
            )

    return Unit(name, file.size, read)


def _folder_units(folder: Path, only: list[str] | None, block_size: int) -> list[Unit]:
    location = locate(str(folder.resolve()), Workspace.empty)
    location = dataclasses.replace(location, path=location.path.rstrip("/") + "/")
    listing = parse_mltable("paths:\n  - folder: ./\n", str(folder))
    table = TabularMLTable(listing, location, Workspace.empty, default_store_factory, block_size)
    base = location.path
    units = []
    for file in sorted(table.files(), key=lambda f: tuple(f.path[len(base) :].split("/"))):
        rel = file.path[len(base) :]
        if only is not None and rel not in only:
            continue
        if any(part.startswith(".") for part in rel.split("/")):
            continue
        kind = _BY_SUFFIX.get(Path(rel).suffix.lower())
        if kind is not None:
            units.append(_file_unit(*kind, file, default_store_factory, block_size, rel))
    if not units:
        suffixes = ", ".join(_BY_SUFFIX)
        raise InvalidInput(f"{folder}: no record files in it (suffixes read: {suffixes})")
    return units


def _mltable_units(table: TabularMLTable) -> list[Unit]:
    read: Step | None = table.mltable.read_step
    files = table.files()
    if read is None:  # paths only: one record per file, its URI
        return [
            Unit(f.eval_path, f.size, lambda f=f: iter([{"Path": f.uri}]))  # type: ignore[misc]
            for f in files
        ]
    if table.mltable.row_steps():
        total = sum(f.size for f in files)
        return [Unit(table.mltable.source, total, lambda: iter(table.to_arrow_table().to_pylist()))]
    reader = _READ_STEPS[read.name]
    return [
        _file_unit(reader, read.args, f, table.store_factory, table.block_size, f.eval_path)
        for f in files
    ]
