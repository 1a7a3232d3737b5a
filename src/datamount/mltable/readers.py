"""Read files of an MLTable as streams of Arrow record batches.

Every file is read through its ObjectStore (`StoreFile`: a seekable raw file
over bounded ranged reads pinned to the etag seen when listing), so remote
and local files take the same path and nothing is downloaded whole: JSON
lines are parsed block by block (`block_size`, 1 MiB by default), parquet row
group by row group (a remote row group fetched first in parallel ranges by a
short-lived pool of 4 threads: PrefetchFile), and delimited text in
delimited.py. Consumers pull batches; when they stop (a `take` is satisfied)
no further block is fetched.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from datamount.errors import DataError, StorageError
from datamount.mltable.layout import EvalFile
from datamount.mltable.model import CODECS, ReadJsonLines, ReadParquet
from datamount.storage.base import ObjectStore

BLOCK_SIZE = 1 << 20  # 1 MiB: pyarrow's default CSV block; a `take: 10` costs one request
JSON_BATCH_ROWS = 10_000

StoreOf = Callable[[EvalFile], ObjectStore]


@dataclass(frozen=True)
class Chunk:
    """Rows of one file: the batch, the file it came from (for path columns)
    and the table partition its rows are in (`select_partitions`; None where
    the reader does not tell)."""

    batch: pa.RecordBatch
    file: EvalFile
    part: int | None = None

    def with_batch(self, batch: pa.RecordBatch) -> Chunk:
        return Chunk(batch, self.file, self.part)


class StoreFile(io.RawIOBase):
    """A read-only, seekable raw file over one object of a store.

    Each `readinto` is one bounded ranged read pinned to `etag` (a blob
    rewritten while it is read fails with VersionChanged rather than mixing
    versions). Wrap it in io.BufferedReader to batch small reads."""

    def __init__(self, store: ObjectStore, key: str, size: int, etag: str | None) -> None:
        super().__init__()
        self.store, self.key, self.size, self.etag = store, key, size, etag
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        want = min(len(view), self.size - self.pos)
        if want <= 0:
            return 0
        got = self.store.read_into(self.key, self.pos, view[:want], etag=self.etag)
        self.pos += got
        return got


class PrefetchFile(StoreFile):
    """A StoreFile that serves reads inside the byte range last prefetched
    from memory. `prefetch(start, end)` fetches the range in parallel pieces
    (PIECE bytes, THREADS at a time): a parquet row group is read as one
    burst instead of one round trip per column chunk."""

    PIECE = 4 << 20
    THREADS = 4

    def __init__(self, store: ObjectStore, key: str, size: int, etag: str | None) -> None:
        super().__init__(store, key, size, etag)
        self.start, self.data = 0, memoryview(b"")

    def prefetch(self, start: int, end: int) -> None:
        start, end = max(0, start), min(self.size, end)
        buf = bytearray(max(0, end - start))
        view = memoryview(buf)

        def get(offset: int) -> None:
            stop = min(offset + self.PIECE, end)
            while offset < stop:
                got = self.store.read_into(
                    self.key, offset, view[offset - start : stop - start], etag=self.etag
                )
                if got <= 0:
                    raise StorageError(f"{self.key}: the object ended at {offset} of {self.size}")
                offset += got

        self.data = memoryview(b"")  # the last range is dropped first (memory: one range)
        pieces = range(start, end, self.PIECE)
        if len(pieces) > 1:
            with ThreadPoolExecutor(self.THREADS, thread_name_prefix="datamount-parquet") as pool:
                list(pool.map(get, pieces))
        else:
            for offset in pieces:
                get(offset)
        self.start, self.data = start, view

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        inside = self.pos - self.start
        if 0 <= inside < len(self.data):
            n = min(len(view), len(self.data) - inside)
            view[:n] = self.data[inside : inside + n]
            self.pos += n
            return n
        return super().readinto(view)


def row_group_range(meta: Any, group: int) -> tuple[int, int]:
    """The byte range of a parquet row group's column chunks."""
    rg = meta.row_group(group)
    starts, ends = [], []
    for c in range(rg.num_columns):
        col = rg.column(c)
        start = col.data_page_offset
        if col.has_dictionary_page and col.dictionary_page_offset is not None:
            start = min(start, col.dictionary_page_offset)
        starts.append(start)
        ends.append(start + col.total_compressed_size)
    return (min(starts), max(ends)) if starts else (0, 0)


def open_file(file: EvalFile, store: ObjectStore, block_size: int) -> io.BufferedReader:
    raw = StoreFile(store, file.key, file.size, file.etag or None)
    return io.BufferedReader(raw, buffer_size=block_size)


def with_path(batch: pa.RecordBatch, name: str | None, file: EvalFile) -> pa.RecordBatch:
    """The path column first, as Azure ML puts it."""
    if name is None:
        return batch
    value = pa.array([file.uri] * batch.num_rows, pa.string())
    names = [n for n in batch.schema.names if n != name]
    arrays = [batch.column(n) for n in names]
    return pa.RecordBatch.from_arrays([value, *arrays], names=[name, *names])


class ReadError(DataError):
    """A file could not be read or parsed; tabular.py adds the MLTable and step."""


def fail(file: EvalFile, exc: Exception | str) -> ReadError:
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return ReadError(f"{file.uri} ({file.entry}): {first_line}")


# -- parquet ----------------------------------------------------------------


def read_parquet(
    opts: ReadParquet, files: list[EvalFile], store_of: StoreOf, block_size: int
) -> Iterator[Chunk]:
    path_col = opts.path_column if opts.include_path_column else None
    base = 0  # a partition is a row group, as Azure ML counts them
    for file in files:
        store = store_of(file)
        remote = store.local_path(file.key) is None
        raw = PrefetchFile(store, file.key, file.size, file.etag or None)
        try:
            with pq.ParquetFile(io.BufferedReader(raw, buffer_size=block_size)) as pf:
                for group in range(pf.num_row_groups):
                    if remote:  # the row group in one parallel burst
                        raw.prefetch(*row_group_range(pf.metadata, group))
                    batches = pf.iter_batches(
                        batch_size=65_536, row_groups=[group], use_threads=False
                    )
                    for batch in batches:
                        yield Chunk(with_path(batch, path_col, file), file, base + group)
                base += pf.num_row_groups
        except (pa.ArrowInvalid, StorageError, OSError) as exc:
            raise fail(file, exc) from None


# -- JSON lines ---------------------------------------------------------------


def read_json_lines(
    opts: ReadJsonLines, files: list[EvalFile], store_of: StoreOf, block_size: int
) -> Iterator[Chunk]:
    path_col = opts.path_column if opts.include_path_column else None
    for file in files:
        for batch in _json_batches(opts, file, store_of(file), block_size):
            yield Chunk(with_path(batch, path_col, file), file)


def _json_batch(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    """Rows as one batch whose columns are every key of every row, in the
    order first seen (`RecordBatch.from_pylist` takes the first row's keys
    only and drops the rest silently); a row without a key gets null there."""
    return pa.RecordBatch.from_struct_array(pa.array(rows))


def _json_batches(
    opts: ReadJsonLines, file: EvalFile, store: ObjectStore, block_size: int
) -> Iterator[pa.RecordBatch]:
    rows: list[dict[str, Any]] = []
    try:
        with io.TextIOWrapper(
            open_file(file, store, block_size), encoding=CODECS[opts.encoding], newline=None
        ) as text:
            for number, line in enumerate(text, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    if not isinstance(row, dict):
                        raise ValueError("not a JSON object")
                except ValueError as exc:
                    if opts.invalid_lines == "drop":
                        continue
                    msg = f"line {number}: invalid JSON ({exc}); set invalid_lines: drop to skip"
                    raise fail(file, msg) from None
                rows.append(row)
                if len(rows) >= JSON_BATCH_ROWS:
                    yield _json_batch(rows)
                    rows = []
        if rows:
            yield _json_batch(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError, StorageError, UnicodeError) as exc:
        raise fail(file, exc) from None
