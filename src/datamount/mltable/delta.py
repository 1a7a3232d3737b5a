"""`read_delta_lake`: a Delta Lake table as a stream of record batches.

The table's transaction log (`_delta_log/`: JSON commits, checkpoints; a
few small files) is copied through the MLTable's stores into a temporary
folder, and the `deltalake` package (an optional dependency: `pip install
'datamount[delta]'`, imported only here) replays it there to the data files
of the version asked for. The data files themselves are read in place,
row group by row group, through the same stores as `read_parquet`, so a
remote table is never downloaded whole and uses datamount's credentials.

Data files are read in path order, as Azure ML's reader does (a Delta
table has no row order). `timestamp_as_of` picks the last version committed
at or before it, else the first version; a commit's time is its added
files' `modificationTime` (as Azure ML's reader takes it; not the log
file's modification time), else its `commitInfo` timestamp.
Partition columns (absent from the data files) are filled from the log's
partition values, typed as the table's schema says, in the schema's order.
Runs on the consumer's thread.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq

from datamount.errors import StorageError
from datamount.mltable.layout import EvalFile
from datamount.mltable.options import ReadDeltaLake
from datamount.mltable.readers import Chunk, ReadError, StoreOf, open_file, with_path

LOG = "_delta_log/"


def read_delta_lake(
    opts: ReadDeltaLake, files: list[EvalFile], store_of: StoreOf, block_size: int
) -> Iterator[Chunk]:
    root, log = _log_files(files)
    schema, adds = _replay(opts, log, store_of)
    by_key = {f.key: f for f in files}
    path_col = opts.path_column if opts.include_path_column else None
    emitted = False
    for rel, parts in adds:
        file = by_key.get(root + unquote(rel))
        if file is None:
            raise ReadError(
                f"{root or '/'}: the Delta log names {rel!r}, which is not in the folder"
            )
        try:
            with pq.ParquetFile(open_file(file, store_of(file), block_size)) as pf:
                for batch in pf.iter_batches(batch_size=65_536, use_threads=False):
                    emitted = True
                    yield Chunk(with_path(_typed(batch, schema, parts), path_col, file), file)
        except (pa.ArrowInvalid, StorageError, OSError) as exc:
            raise ReadError(
                f"{file.uri} ({file.entry}): {str(exc).strip().splitlines()[0]}"
            ) from None
    if not emitted and files:  # no data file in this version: the schema's columns
        empty = pa.RecordBatch.from_pylist([], schema=schema)
        yield Chunk(with_path(empty, path_col, files[0]), files[0])


def _log_files(files: list[EvalFile]) -> tuple[str, list[EvalFile]]:
    """The table's root key (ending in '/', or '') and its log files."""
    log = [f for f in files if f.key.startswith(LOG) or f"/{LOG}" in f.key]
    roots = {f.key[: f.key.rindex(LOG)] for f in log}
    if not log:
        where = files[0].entry if files else "paths"
        raise ReadError(f"{where}: no {LOG} in the folder: not a Delta Lake table")
    if len(roots) > 1:
        raise ReadError(f"{log[0].entry}: more than one Delta Lake table: {sorted(roots)}")
    return roots.pop(), log


def _replay(
    opts: ReadDeltaLake, log: list[EvalFile], store_of: StoreOf
) -> tuple[pa.Schema, list[tuple[str, dict[str, Any]]]]:
    """The table's schema and (relative path, partition values) of each data
    file of the version asked for, in the log's order."""
    try:
        import deltalake
    except ImportError:
        raise ReadError(
            "read_delta_lake needs the deltalake package: pip install 'datamount[delta]'"
        ) from None
    with tempfile.TemporaryDirectory(prefix="datamount-delta-") as tmp:
        commits: dict[int, bytes] = {}
        for f in log:
            name = f.key[f.key.rindex(LOG) + len(LOG) :]
            if "/" in name or not name:
                continue
            data = store_of(f).read(f.key, 0, f.size, etag=f.etag or None) if f.size else b""
            (Path(tmp) / LOG).mkdir(exist_ok=True)
            (Path(tmp) / LOG / name).write_bytes(data)
            if name.endswith(".json") and name[:-5].isdigit():
                commits[int(name[:-5])] = data
        version = opts.version_as_of
        if version is not None and commits and version > max(commits):
            raise ReadError(
                f"{log[0].entry}: version_as_of {version}: the table's last version is "
                f"{max(commits)}"
            )
        if opts.timestamp_as_of is not None:
            version = _version_at(commits, opts.timestamp_as_of)
        try:
            table = deltalake.DeltaTable(tmp, version=version)
            if table.protocol().min_reader_version > 1:
                raise ReadError(
                    f"{log[0].entry}: Delta reader version "
                    f"{table.protocol().min_reader_version} (column mapping, deletion vectors) "
                    "is not supported; only reader version 1"
                )
            schema = pa.schema(table.schema().to_arrow())
            actions = pa.table(table.get_add_actions(flatten=True))
        except ReadError:
            raise
        except Exception as exc:  # deltalake's own errors (TableNotFoundError, DeltaError...)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ReadError(f"{log[0].entry}: Delta log: {first}") from None
    parts = [c for c in actions.column_names if c.startswith("partition.")]
    rows = actions.select(["path", *parts]).to_pylist()
    adds = [(r["path"], {p[len("partition.") :]: r[p] for p in parts}) for r in rows]
    return schema, sorted(adds, key=lambda a: a[0])  # by path, as Azure ML's reader


def _actions(data: bytes) -> Iterator[dict[str, Any]]:
    for line in data.splitlines():
        try:
            action = json.loads(line)
        except ValueError:
            continue
        if isinstance(action, dict):
            yield action


def _version_at(commits: dict[int, bytes], timestamp: str) -> int | None:
    """The last version committed at or before `timestamp`, else the first."""
    at = datetime.fromisoformat(timestamp.replace(" ", "T"))
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    when_ms = at.timestamp() * 1000
    best = None
    for version in sorted(commits):
        stamp = _commit_time(commits[version])
        if stamp is not None and stamp <= when_ms:
            best = version
    if best is None and commits:
        return min(commits)
    return best


def _commit_time(data: bytes) -> float | None:
    """When a commit was made, as Azure ML's reader tells: its added files'
    modification time (the latest), else its in-commit or commitInfo timestamp."""
    added, stamp = [], None
    for action in _actions(data):
        add, info = action.get("add"), action.get("commitInfo")
        if isinstance(add, dict) and isinstance(add.get("modificationTime"), int | float):
            added.append(float(add["modificationTime"]))
        if isinstance(info, dict):
            value = info.get("inCommitTimestamp", info.get("timestamp"))
            stamp = float(value) if isinstance(value, int | float) else None
    return max(added) if added else stamp


def _typed(batch: pa.RecordBatch, schema: pa.Schema, parts: dict[str, Any]) -> pa.RecordBatch:
    """`batch` in the schema's column order, partition columns filled in, a
    column added since the file was written as nulls."""
    arrays = []
    for field in schema:
        if field.name in batch.schema.names:
            arrays.append(batch.column(field.name))
        else:
            value = parts.get(field.name)
            arrays.append(pa.array([value] * batch.num_rows, field.type))
    extra = [n for n in batch.schema.names if n not in schema.names]
    arrays += [batch.column(n) for n in extra]
    return pa.RecordBatch.from_arrays(arrays, names=[*schema.names, *extra])
