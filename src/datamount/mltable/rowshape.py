"""Row shapes of delimited text as Azure ML's reader gives them, on a block of
whole lines (delimited.py's line-by-line reader): a short row padded with
empty fields, a long row's extra fields as `Column<n>` columns, a quote left
open at a line's end taken literally (with `support_multi_line: false` a
newline always ends a row), and a `+`-signed integer column as int. Pure
functions of bytes and Arrow tables; run on the consumer's thread.
"""

from __future__ import annotations

import csv
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv

_INT_TEXT = r"^\s*[+-]?\d+\s*$"


def pad_rows(block: bytes, codec: str, delimiter: str, width: int) -> tuple[bytes, int]:
    """`block` (whole lines, one record each) with every row given empty
    fields up to the widest row's width (at least `width`), and that width."""
    codec = "utf-8" if codec == "utf-8-sig" else codec  # a BOM stays where it is
    lines = block.decode(codec).split("\n")
    counts = []
    for line in lines:
        body = line.removesuffix("\r")
        counts.append(len(next(csv.reader([body], delimiter=delimiter), [])) if body else 0)
    wide = max([width, *counts])
    out = []
    for line, n in zip(lines, counts, strict=True):
        body = line.removesuffix("\r")
        if body and n < wide:
            line = body + delimiter * (wide - n) + line[len(body) :]
        out.append(line)
    return "\n".join(out).encode(codec), wide


def wide_names(names: list[str], width: int) -> list[str]:
    """The header's names, then `Column<n>` (1-based position) for each field
    past them, as Azure ML names a long row's extra fields."""
    return [*names, *(f"Column{i + 1}" for i in range(len(names), width))]


def literal_open_quotes(block: bytes, delimiter: bytes) -> bytes:
    """`block` with each line whose quote is not closed on that line
    rewritten so that its quote characters are text (`1,"two` gives `1` and
    `"two`): a newline always ends a row, as Azure ML reads without
    `support_multi_line`. Lines with balanced quotes are unchanged."""
    out = []
    for line in block.split(b"\n"):
        body = line.removesuffix(b"\r")
        if body.count(b'"') % 2:
            fields = body.split(delimiter)
            body = delimiter.join(b'"' + f.replace(b'"', b'""') + b'"' for f in fields)
            line = body + line[len(line.removesuffix(b"\r")) :]
        out.append(line)
    return b"\n".join(out)


def joined(table: pa.Table, block: bytes, read: pa.csv.ReadOptions) -> bool:
    """Whether Arrow joined lines of `block` into one row (a quote left open
    at a line's end): fewer rows than lines, and a text value holding a line
    break. Counting lines is cheap; the text is searched only when they differ
    (a blank line also does: Arrow skips it)."""
    header = 0 if read.column_names or read.autogenerate_column_names else 1
    if table.num_rows == block.count(b"\n") - read.skip_rows - header:
        return False
    return any(
        pc.any(pc.match_substring(table.column(i), "\n")).as_py()
        for i, f in enumerate(table.schema)
        if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
    )


def plus_ints(table: pa.Table, as_text: Callable[[list[str]], pa.Table]) -> pa.Table:
    """Float columns of whole numbers whose text is all integers (`+2` makes
    Arrow infer float) as int64, as Azure ML infers them. `as_text(names)`
    reads the same block's columns `names` as text."""
    candidates = [
        f.name
        for f in table.schema
        if pa.types.is_floating(f.type)
        and table.column(f.name).null_count < len(table)
        and pc.all(pc.equal(pc.floor(table.column(f.name)), table.column(f.name))).as_py()
    ]
    if not candidates or len(set(table.schema.names)) != len(table.schema.names):
        return table
    text = as_text(candidates)
    for name in candidates:
        values = text.column(name)
        if pc.all(pc.match_substring_regex(values, _INT_TEXT)).as_py() is not False:
            ints = pc.cast(
                pc.utf8_trim_whitespace(pc.replace_substring(values, "+", "")), pa.int64()
            )
            table = table.set_column(table.schema.get_field_index(name), name, ints)
    return table
