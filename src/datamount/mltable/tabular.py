"""Load an MLTable as a table: `load(path_or_uri, workspace=None)`.

The transformations run in file order as a lazy pipeline of record-batch
streams: steps before the read step subset the file list (evaluate.py), the
read step streams batches out of the files (readers.py), and every later
step transforms the stream batch by batch. `take` stops pulling once it has
its rows, so the readers never fetch the blocks after them. Row-level
`take_random_sample` keeps row i (counted over the whole stream) when the i-th
draw of numpy's default_rng(seed) is below the probability (`sample`: at or
above its lower bound too). `select_partitions` keeps the rows of the
partitions the readers number (Chunk.part). Runs on the consumer's thread
(the parquet reader's short-lived prefetch pool aside: readers.py).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datamount.errors import DataError
from datamount.mltable import convert, delimited, delta, expr, readers
from datamount.mltable.evaluate import (
    StoreFactory,
    Stores,
    WorkspaceSource,
    list_files,
    locate,
    read_mltable,
    subset,
)
from datamount.mltable.layout import EvalFile
from datamount.mltable.model import MLTable, Step
from datamount.mltable.patterns import PartitionFormat
from datamount.mltable.readers import Chunk
from datamount.mltable.wsarg import WorkspaceArg, workspace_source
from datamount.storage import open_store
from datamount.storage.location import StorageLocation


def default_store_factory(location: StorageLocation, ca_bundle: Path | None = None) -> Any:
    """A store for `location`, trusting `ca_bundle` (REQUESTS_CA_BUNDLE) beside
    the system store, as the CLI's stores do."""
    return open_store(location, ca_bundle=ca_bundle)


def load(
    path_or_uri: str | os.PathLike[str] | StorageLocation,
    workspace: WorkspaceArg = None,
    *,
    store_factory: StoreFactory | None = None,
    base_dir: Path | None = None,
    block_size: int = readers.BLOCK_SIZE,
) -> TabularMLTable:
    """Read and parse the MLTable at `path_or_uri` (a local folder or file,
    or any URI datamount parses); data is read when asked for.

    `workspace` resolves `azureml://` paths: a Workspace, a path (str or
    os.PathLike) to a workspace file (read now), or None: `$DATAMOUNT_WORKSPACE`
    if set, else `./configs/workspace.yaml` if it exists, else no workspace (the
    CLI's rule), read when the first non-local path needs it (a local MLTable
    of local files never reads it). Any other type is a TypeError.

    This is a library entry point that training code calls inside a job, i.e.
    its own composition root: it reads `os.environ` (the variable, the
    `${VAR}`s of the workspace file, and REQUESTS_CA_BUNDLE for https
    entries) and the working directory here, once.
    """
    ws = workspace_source(workspace, os.environ, Path.cwd())
    bundle = os.environ.get("REQUESTS_CA_BUNDLE")
    factory = store_factory or functools.partial(
        default_store_factory, ca_bundle=Path(bundle) if bundle else None
    )
    location = locate(path_or_uri, ws, base_dir)
    with Stores(factory) as stores:
        table, folder = read_mltable(location, stores)
    return TabularMLTable(table, folder, ws, factory, block_size)


@dataclass
class TabularMLTable:
    mltable: MLTable
    folder: StorageLocation
    workspace: WorkspaceSource  # called when a path needs the workspace
    store_factory: StoreFactory
    block_size: int = readers.BLOCK_SIZE
    _files: list[EvalFile] | None = field(default=None, repr=False)

    def files(self) -> list[EvalFile]:
        """The files the read step reads (file-level subsetting applied)."""
        if self._files is None:
            with Stores(self.store_factory) as stores:
                found = list_files(self.mltable, self.folder, self.workspace, stores)
            self._files = subset(found, self.mltable.file_steps())
        return self._files

    def to_arrow_table(self) -> pa.Table:
        with Stores(self.store_factory) as stores:
            chunks = self._pipeline(stores)
            try:
                tables = [pa.Table.from_batches([c.batch]) for c in chunks]
            finally:
                chunks.close()
        if not tables:  # no file at all (a file-level take: 0)
            return (
                pa.table({"Path": pa.array([], pa.string())})
                if self.mltable.read_step is None
                else pa.table({})
            )
        try:
            return pa.concat_tables(tables, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            pass
        tables = _bool_as_number_where_mixed(tables)
        try:
            return pa.concat_tables(tables, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            pass
        try:  # files (or blocks) inferred different types for a column: keep its text
            return pa.concat_tables(_as_text_where_mixed(tables), promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            raise DataError(
                f"MLTable {self.mltable.source}: files disagree on column types: {exc}"
            ) from None

    def to_pandas_dataframe(self) -> Any:
        return self.to_arrow_table().to_pandas()

    # -- the pipeline ---------------------------------------------------------

    def _pipeline(self, stores: Stores) -> Generator[Chunk, None, None]:
        table = self.mltable
        read = table.read_step
        files = self.files()
        if read is None:  # paths only: a table of the files' URIs
            uris = pa.array([f.uri for f in files], pa.string())
            chunks: Iterator[Chunk] = iter(
                [Chunk(pa.RecordBatch.from_arrays([uris], names=["Path"]), f) for f in files[:1]]
            )
            return _stream(chunks)
        reader = _READERS[read.name]
        chunks = _located(
            reader(read.args, files, lambda f: stores.get(f.location), self.block_size),
            f"MLTable {table.source}: {read.where}.{read.name}",
        )
        for step in table.row_steps():
            chunks = _apply(step, chunks, table.source, table.leads(step))
        return _stream(chunks)


_READERS: dict[str, Callable[..., Iterator[Chunk]]] = {
    "read_delimited": delimited.read_delimited,
    "read_parquet": readers.read_parquet,
    "read_json_lines": readers.read_json_lines,
    "read_delta_lake": delta.read_delta_lake,
}


def _bool_as_number_where_mixed(tables: list[pa.Table]) -> list[pa.Table]:
    """A column boolean in some tables (a block of 0s and 1s only) and int or
    float in others: its booleans as 0 and 1."""
    kinds: dict[str, set[pa.DataType]] = {}
    for t in tables:
        for f in t.schema:
            if not pa.types.is_null(f.type):
                kinds.setdefault(f.name, set()).add(f.type)
    number = (pa.types.is_integer, pa.types.is_floating)
    mixed = {
        name
        for name, types in kinds.items()
        if pa.bool_() in types
        and all(t == pa.bool_() or any(f(t) for f in number) for t in types)
        and len(types) > 1
    }
    out = []
    for t in tables:
        for name in mixed & set(t.schema.names):
            i = t.schema.get_field_index(name)
            if pa.types.is_boolean(t.schema.field(i).type):
                t = t.set_column(i, name, pc.cast(t.column(i), pa.int64()))
        out.append(t)
    return out


def _as_text_where_mixed(tables: list[pa.Table]) -> list[pa.Table]:
    """Cast to string every column whose non-null types differ between tables
    and are not all numeric (int64 and double still merge as double)."""
    kinds: dict[str, set[pa.DataType]] = {}
    for t in tables:
        for f in t.schema:
            if not pa.types.is_null(f.type):
                kinds.setdefault(f.name, set()).add(f.type)
    numeric = (pa.types.is_integer, pa.types.is_floating)
    mixed = {
        name
        for name, types in kinds.items()
        if len(types) > 1 and not all(any(f(t) for f in numeric) for t in types)
    }
    out = []
    for t in tables:
        for name in mixed & set(t.schema.names):
            i = t.schema.get_field_index(name)
            column = t.column(i)
            if t.schema.field(i).metadata == delimited.ZERO_ONE:  # read as 0/1: "1", not "true"
                column = pc.cast(column, pa.int64())
            t = t.set_column(i, name, pc.cast(column, pa.string()))
        out.append(t)
    return out


def _located(chunks: Iterator[Chunk], where: str) -> Iterator[Chunk]:
    """Name the MLTable file and the read step in a reader's error."""
    try:
        yield from chunks
    except readers.ReadError as exc:
        raise DataError(f"{where}: {exc}") from None


def _stream(chunks: Iterator[Chunk]) -> Generator[Chunk, None, None]:
    yield from chunks


def _apply(step: Step, chunks: Iterator[Chunk], source: str, leads: bool) -> Iterator[Chunk]:
    where = f"MLTable {source}: {step.where}.{step.name}"
    if step.name == "take":
        return _take(chunks, step.args)
    if step.name == "skip":
        return _skip(chunks, step.args)
    if step.name == "take_random_sample":
        return _sample(chunks, step.args.probability, step.args.seed)
    if step.name == "sample":
        args = step.args.sampler_arguments
        return _sample(chunks, args.probability, args.seed, args.probability_lower_bound)
    if step.name == "select_partitions":
        return _partitions(chunks, step.args, where)
    return _map(step, chunks, where, leads)


def _take(chunks: Iterator[Chunk], count: int) -> Iterator[Chunk]:
    left = count
    if left <= 0:  # no rows, but the columns: one batch's schema (one block read)
        first = next(chunks, None)
        if first is not None and not first.batch.num_rows:
            # a header-only file: its columns are typed by no value (null); the
            # first rows of a later file, if any, give the types
            first = next((c for c in chunks if c.batch.num_rows), first)
        if first is not None:
            yield first.with_batch(first.batch.slice(0, 0))
        return
    for chunk in chunks:
        n = chunk.batch.num_rows
        if n >= left:
            yield chunk.with_batch(chunk.batch.slice(0, left))
            return
        left -= n
        yield chunk


def _skip(chunks: Iterator[Chunk], count: int) -> Iterator[Chunk]:
    left = count
    emitted, last = False, None
    for chunk in chunks:
        n = chunk.batch.num_rows
        if left >= n:
            left -= n
            if n or last is None or not last.batch.num_rows:  # rows type the columns
                last = chunk
            continue
        yield chunk.with_batch(chunk.batch.slice(left)) if left else chunk
        left, emitted = 0, True
    if not emitted and last is not None:  # every row skipped: no rows, but the columns
        yield last.with_batch(last.batch.slice(0, 0))


def _sample(
    chunks: Iterator[Chunk], probability: float, seed: int | None, lower: float = 0.0
) -> Iterator[Chunk]:
    rng = np.random.default_rng(seed)
    for chunk in chunks:
        draws = rng.random(chunk.batch.num_rows)
        keep = (draws >= lower) & (draws < probability)
        yield chunk.with_batch(chunk.batch.filter(pa.array(keep)))


def _partitions(chunks: Iterator[Chunk], wanted: list[int], where: str) -> Iterator[Chunk]:
    """The rows of the partitions `wanted`, in table order (Azure ML's order:
    a partition is a row group of parquet, a `partition_size` byte range of
    delimited text, each row in the range its first byte is in)."""
    keep, last = set(wanted), -1
    for chunk in chunks:
        if chunk.part is None:
            raise DataError(f"{where}: not supported yet for this read (only read_delimited "
                            "without support_multi_line, and read_parquet)")  # fmt: skip
        last = max(last, chunk.part)
        if chunk.part in keep:
            yield chunk
    if max(keep) > last:
        raise DataError(f"{where}: partition {max(keep)}: the table has {last + 1} partitions")


def _map(step: Step, chunks: Iterator[Chunk], where: str, leads: bool) -> Iterator[Chunk]:
    for chunk in chunks:
        try:
            batch = _transform(step, chunk, where, leads)
        except (expr.ExprError, convert.ConversionError) as exc:
            raise DataError(f"{where}: {exc}") from None
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise DataError(f"{where}: {chunk.file.uri}: {exc}") from None
        yield chunk.with_batch(batch)


def _transform(step: Step, chunk: Chunk, where: str, leading: bool) -> pa.RecordBatch:
    batch = chunk.batch
    names = batch.schema.names
    # keep / drop / convert skip a column the table lacks, as Azure ML does
    # (nothing is lost: there is no such data); keep_columns keeps table order.
    if step.name in ("keep_columns", "drop_columns"):
        sel = step.args
        hit = [bool(sel.search(n)) if isinstance(sel, re.Pattern) else n in sel for n in names]
        keep = step.name == "keep_columns"
        return batch.select([n for n, h in zip(names, hit, strict=True) if h == keep])
    if step.name == "filter":
        return batch.filter(expr.mask(step.args, batch), null_selection_behavior="drop")
    if step.name == "convert_column_types":
        arrays = dict(zip(names, batch.columns, strict=True))
        for conv in step.args:
            for col in (c for c in conv.columns if c in arrays):
                arrays[col] = convert.convert(arrays[col], conv, col)
        return pa.RecordBatch.from_arrays(list(arrays.values()), names=list(arrays))
    if step.name == "extract_columns_from_partition_format":
        return _partition_columns(batch, step.args, chunk.file, leading)
    raise AssertionError(f"unhandled transformation {step.name}")  # the parser rejects others


def _partition_columns(
    batch: pa.RecordBatch, fmt: PartitionFormat, file: EvalFile, leading: bool
) -> Any:
    """The partition columns (the path's text, or a datetime) added to `batch`:
    first when the step came before the read step (Azure ML's order), else last."""
    values = fmt.extract(file.path) or {}
    n = batch.num_rows
    parts = {}
    for name, dt_format in fmt.columns:
        kind = pa.string() if dt_format is None else convert.TIMESTAMP
        parts[name] = pa.array([values.get(name)] * n, kind)
    data = {n: c for n, c in zip(batch.schema.names, batch.columns, strict=True) if n not in parts}
    arrays = {**parts, **data} if leading else {**data, **parts}
    return pa.RecordBatch.from_arrays(list(arrays.values()), names=list(arrays))
