"""Read delimited text files of an MLTable as a stream of Arrow record batches.

Each file is parsed block by block (`block_size`) through its store
(readers.StoreFile): by whole lines when a newline always ends a record, else
with Arrow's streaming reader (quoted line breaks, UTF-16/32). Types are
inferred per block (unified when the table is assembled) unless
`infer_column_types` is off, when every value is the file's text; type
overrides read their columns as text and convert them. Runs on the
consumer's thread.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from datamount.errors import StorageError
from datamount.mltable import convert, rowshape
from datamount.mltable.layout import EvalFile
from datamount.mltable.model import CODECS, ReadDelimited
from datamount.mltable.readers import Chunk, StoreFile, StoreOf, fail, open_file, with_path
from datamount.storage.base import ObjectStore


def read_delimited(
    opts: ReadDelimited, files: list[EvalFile], store_of: StoreOf, block_size: int
) -> Iterator[Chunk]:
    path_col = opts.path_column if opts.include_path_column else None
    first_names: list[str] | None = None
    # from_first_file: later files have no header line; all_files_same_headers:
    # their first line is a header, dropped, and the first file's names hold
    # (both as Azure ML reads them: by position).
    shared = opts.header in ("from_first_file", "all_files_same_headers")
    base, size = 0, opts.partition_size or PARTITION_SIZE  # select_partitions' partitions
    for index, file in enumerate(files):
        names = first_names if shared and index > 0 else None
        for batch, part in _csv_batches(opts, file, store_of(file), block_size, names):
            if shared and first_names is None:
                first_names = list(batch.schema.names)
            batch = _overridden(batch, opts)
            yield Chunk(
                with_path(batch, path_col, file), file, None if part is None else base + part
            )
        base += max(1, -(-file.size // size))


PARTITION_SIZE = 20 << 20  # Azure ML's partition of delimited text: 20 MiB of a file


def _csv_batches(
    opts: ReadDelimited,
    file: EvalFile,
    store: ObjectStore,
    block_size: int,
    names: list[str] | None,
) -> Iterator[tuple[pa.RecordBatch, int | None]]:
    """Batches and the partition of the file each one's rows are in (None:
    not known, with Arrow's streaming reader)."""
    if file.size == 0:
        return
    codec = CODECS[opts.encoding]
    try:
        if opts.support_multi_line or codec in ("utf-16", "utf-32"):
            for batch in _csv_streaming(opts, file, store, block_size, names):
                yield batch, None
        else:
            yield from _csv_by_lines(opts, file, store, block_size, names)
    except (pa.ArrowInvalid, StorageError, UnicodeError) as exc:
        raise fail(file, exc) from None


def _convert_options(opts: ReadDelimited, types: dict[str, pa.DataType] | None) -> Any:
    # As Azure ML: only an unquoted empty field is null (`NA`, `null`, `NaN`
    # stay text; pyarrow's default null list would turn them into nulls), and
    # a quoted empty field is an empty string.
    return pacsv.ConvertOptions(
        # empty_as_string: no value is null, so a column with an empty field is text
        null_values=[] if opts.empty_as_string else [""],
        strings_can_be_null=not opts.empty_as_string,
        quoted_strings_can_be_null=False,
        column_types=types,
    )


def _line_blocks(raw: StoreFile, block_size: int, part_size: int) -> Iterator[tuple[bytes, int]]:
    """The file in ~block_size pieces cut after a newline: one ranged read
    per block, and a block is read only when the previous one was consumed.
    Each with its partition (`part_size` bytes each, a row in the one its
    first byte is in): a block whose rows are in two is cut in two."""
    carry, start = b"", 0  # start: the file offset of carry's first byte
    while True:
        data = raw.read(block_size)
        if not data:
            if carry:  # a last line with no newline: Arrow reads a lone header line
                yield carry + b"\n", start // part_size  # without one as an empty file
            return
        buf = carry + data
        cut = buf.rfind(b"\n") + 1
        i = 0
        while i < cut:
            part = (start + i) // part_size
            end = (part + 1) * part_size - start  # where the partition ends, in buf
            nl = buf.find(b"\n", end - 1, cut) if end < cut else -1
            piece_end = cut if nl < 0 else nl + 1
            yield buf[i:piece_end], part
            i = piece_end
        carry, start = buf[cut:], start + cut


def _csv_by_lines(
    opts: ReadDelimited,
    file: EvalFile,
    store: ObjectStore,
    block_size: int,
    names: list[str] | None,
) -> Iterator[tuple[pa.RecordBatch, int]]:
    """Parse each block of whole lines on its own (types inferred per block,
    unified when the table is assembled). Arrow's own streaming reader reads
    ahead on a background thread (docs/design/mltable.md, "Fetch only what
    the pipeline pulls"); this fetches exactly the blocks the consumer pulls. Valid when a newline
    byte always ends a record: no quoted line breaks, a byte-oriented encoding."""
    codec = CODECS[opts.encoding]
    encoding = "utf8" if codec == "utf-8-sig" else codec  # Arrow drops a UTF-8 BOM
    parse = pacsv.ParseOptions(delimiter=opts.delimiter)
    no_header = opts.header == "no_header"
    raw = StoreFile(store, file.key, file.size, file.etag or None)
    columns = names
    schema: pa.Schema | None = None  # of the last block, for a file with no rows
    any_rows = False
    skip = 1 if names is not None and opts.header == "all_files_same_headers" else 0
    for block, part in _line_blocks(raw, block_size, opts.partition_size or PARTITION_SIZE):
        if columns is None and not opts.infer_column_types:
            # Inference off: every value is the file's text. Learn the column
            # names from the first line alone, then read the whole block as
            # strings (inferring first and casting back rewrites `00501`).
            columns = _first_line_names(block, encoding, parse, no_header)
            skip = 0 if no_header else 1
        read = pacsv.ReadOptions(
            use_threads=False,
            encoding=encoding,
            block_size=len(block) + 1,
            column_names=columns,
            autogenerate_column_names=no_header and columns is None,
            skip_rows=skip,
        )
        skip = 0
        types = (
            {n: pa.string() for n in columns}
            if columns and not opts.infer_column_types
            else _text_columns(opts)
        )
        convert_opts = _convert_options(opts, types)
        shape, first_read = _Shape(opts, parse, encoding, no_header), read
        try:
            table, block, read, wide = shape.parse(block, read, convert_opts, columns)
            joined = b'"' in block and rowshape.joined(table, block, read)
        except pa.ArrowInvalid:
            if b'"' not in block:
                raise
            joined = True  # e.g. a quote left open on the block's last line
        if joined:  # without support_multi_line a newline always ends a row
            block = rowshape.literal_open_quotes(block, opts.delimiter.encode(encoding))
            table, block, read, wide = shape.parse(block, first_read, convert_opts, columns)
        columns = columns or wide
        if opts.infer_column_types and b"+" in block:  # `+2`: Arrow infers float
            table = rowshape.plus_ints(table, _as_text(block, read, parse, opts))
        if columns is None:
            columns = (
                [f"Column{i + 1}" for i in range(table.num_columns)]
                if no_header
                else dedupe(table.schema.names)
            )
            table = table.rename_columns(columns)
        table = _typed(table)
        schema, any_rows = table.schema, any_rows or table.num_rows > 0
        for batch in table.to_batches():
            yield batch, part
    if not any_rows and schema is not None:  # a header and no row: its columns still count
        yield _empty(schema), 0


class _Shape:
    """Parses one block of whole lines, padding short rows and widening long
    ones as Azure ML reads them (rowshape.py)."""

    def __init__(self, opts: ReadDelimited, parse: Any, encoding: str, no_header: bool) -> None:
        self.opts, self.parse_opts, self.encoding, self.no_header = opts, parse, encoding, no_header

    def parse(
        self, block: bytes, read: Any, convert_opts: Any, columns: list[str] | None
    ) -> tuple[Any, bytes, Any, list[str] | None]:
        """(table, the block parsed, its read options, the header's names when a
        long row widened a block whose header it read)."""
        opts, parse = self.opts, self.parse_opts
        try:
            table = pacsv.read_csv(
                pa.py_buffer(block), read_options=read, parse_options=parse,
                convert_options=convert_opts,
            )  # fmt: skip
            return table, block, read, None
        except pa.ArrowInvalid as exc:
            if "columns, got" not in str(exc):
                raise
        # A short row: padded with nulls; a long row: its extra fields as
        # Column<n> columns (nulls in the other rows), as Azure ML reads them.
        base = columns or _first_line_names(block, self.encoding, parse, self.no_header)
        block, width = rowshape.pad_rows(block, CODECS[opts.encoding], opts.delimiter, len(base))
        wide = None
        if width > len(base):
            header_here = columns is None and not self.no_header
            names_now = rowshape.wide_names(base, width)
            read = pacsv.ReadOptions(
                use_threads=False, encoding=self.encoding, block_size=len(block) + 1,
                column_names=names_now, skip_rows=read.skip_rows + header_here,
            )  # fmt: skip
            if not opts.infer_column_types:
                convert_opts = _convert_options(opts, dict.fromkeys(names_now, pa.string()))
            wide = base
        table = pacsv.read_csv(
            pa.py_buffer(block), read_options=read, parse_options=parse,
            convert_options=convert_opts,
        )  # fmt: skip
        return table, block, read, wide


def _as_text(block: bytes, read: Any, parse: Any, opts: ReadDelimited) -> Any:
    """Reads `block`'s columns `names` as text (rowshape.plus_ints)."""

    def as_text(names: list[str]) -> Any:
        convert_opts = _convert_options(opts, dict.fromkeys(names, pa.string()))
        convert_opts.include_columns = names
        return pacsv.read_csv(
            pa.py_buffer(block), read_options=read, parse_options=parse,
            convert_options=convert_opts,
        )  # fmt: skip

    return as_text


def _first_line_names(block: bytes, encoding: str, parse: Any, no_header: bool) -> list[str]:
    """The column names of a file whose first line starts `block`: its header's
    fields, or Column1..n for a file with no header."""
    first = block[: block.find(b"\n") + 1] or block
    read = pacsv.ReadOptions(
        use_threads=False, encoding=encoding, autogenerate_column_names=no_header
    )
    table = pacsv.read_csv(pa.py_buffer(first), read_options=read, parse_options=parse)
    if no_header:
        return [f"Column{i + 1}" for i in range(table.num_columns)]
    return dedupe(table.schema.names)


def _csv_streaming(
    opts: ReadDelimited,
    file: EvalFile,
    store: ObjectStore,
    block_size: int,
    names: list[str] | None,
) -> Iterator[pa.RecordBatch]:
    """Arrow's streaming reader: for quoted line breaks and UTF-16/32 text."""
    no_header = opts.header == "no_header"
    read = pacsv.ReadOptions(
        block_size=block_size,
        use_threads=False,
        encoding=CODECS[opts.encoding],
        column_names=names,
        autogenerate_column_names=no_header and names is None,
        skip_rows=1 if names is not None and opts.header == "all_files_same_headers" else 0,
    )
    parse = pacsv.ParseOptions(delimiter=opts.delimiter, newlines_in_values=opts.support_multi_line)

    def reader(types: dict[str, pa.DataType] | None) -> Any:
        return pacsv.open_csv(
            open_file(file, store, block_size),
            read_options=read,
            parse_options=parse,
            convert_options=_convert_options(opts, types),
        )

    csv = reader(None)
    # A column empty in the first block is inferred as null and would fail
    # on the first value later: read it as text (also when inference is off).
    inferred = csv.schema  # a column with no value yet is null-typed here
    loose = [f.name for f in csv.schema if pa.types.is_null(f.type) or not opts.infer_column_types]
    loose += [c for c in _text_columns(opts) or {} if c in csv.schema.names and c not in loose]
    if loose:
        csv.close()
        csv = reader({n: pa.string() for n in loose})
    rename = (
        [f"Column{i + 1}" for i in range(len(csv.schema))]
        if no_header
        else dedupe(csv.schema.names)
    )
    any_rows = False
    with csv:
        for batch in csv:
            batch = _typed(pa.RecordBatch.from_arrays(batch.columns, names=rename))
            any_rows = any_rows or batch.num_rows > 0
            yield batch
        if not any_rows:  # a header and no row: its columns still count, typed as no value
            schema = inferred if opts.infer_column_types else csv.schema
            schema = pa.schema([f.with_name(n) for f, n in zip(schema, rename, strict=True)])
            yield _empty(schema)


def _empty(schema: pa.Schema) -> pa.RecordBatch:
    """A batch with `schema`'s columns and no rows (Arrow yields no batch at all
    for a CSV file that has a header only, and its columns would be lost)."""
    return pa.RecordBatch.from_pylist([], schema=schema)


def dedupe(names: list[str]) -> list[str]:
    """Header names with a repeated one suffixed (`a`, `a_1`), as Azure ML names them."""
    out: list[str] = []
    for name in names:
        new, k = name, 0
        while new in out:
            k += 1
            new = f"{name}_{k}"
        out.append(new)
    return out


def _typed(table: Any) -> Any:
    """A date-only column as a timestamp (pandas datetime64, not Python dates),
    a zoned timestamp as its UTC time, and a 0/1-only column as boolean, as
    Azure ML types delimited text.
    `table`: a Table or a RecordBatch."""
    for i, f in enumerate(table.schema):
        if pa.types.is_date(f.type):
            table = table.set_column(i, f.name, table.column(i).cast(pa.timestamp("us")))
        elif pa.types.is_timestamp(f.type) and f.type.tz is not None:  # `...Z`, `+02:00`
            naive = pa.timestamp(f.type.unit)  # the UTC time, as Azure ML gives it
            table = table.set_column(i, f.name, table.column(i).cast(naive))
        elif pa.types.is_integer(f.type) and _zero_one(table.column(i)):
            field = pa.field(f.name, pa.bool_(), metadata=ZERO_ONE)
            table = table.set_column(i, field, table.column(i).cast(pa.bool_()))
    return table


ZERO_ONE = {b"datamount": b"zero_one"}  # a boolean read from 0/1: as text it is 0/1


def _zero_one(column: Any) -> bool:
    """A column of 0s and 1s only: Azure ML reads it as boolean (a block that
    has other ints later merges back to int: tabular.py)."""
    bounds = pc.min_max(column).as_py()
    return bounds["min"] is not None and bounds["min"] >= 0 and bounds["max"] <= 1


def _text_columns(opts: ReadDelimited) -> dict[str, pa.DataType] | None:
    """The override columns of `infer_column_types`, read as text."""
    names = [c for conv in opts.overrides for c in conv.columns]
    return {n: pa.string() for n in names} or None


def _overridden(batch: pa.RecordBatch, opts: ReadDelimited) -> pa.RecordBatch:
    """The override columns converted from their text to their type."""
    if not opts.overrides:
        return batch
    arrays = dict(zip(batch.schema.names, batch.columns, strict=True))
    for conv in opts.overrides:
        for col in (c for c in conv.columns if c in arrays):
            arrays[col] = convert.convert(arrays[col], conv, col)
    return pa.RecordBatch.from_arrays(list(arrays.values()), names=list(arrays))
