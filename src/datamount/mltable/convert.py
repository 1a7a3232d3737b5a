"""`convert_column_types`: convert one Arrow column to int, float, string,
boolean or datetime.

Text that does not parse as the target type becomes null (int, float,
datetime), as Azure ML's error values do when a table is materialised; int of
a decimal text ("9.5") is truncated toward zero, as Azure ML does. Booleans
follow `mismatch_as`; by default a value in neither list is an error (Azure ML
nulls it: a deliberate difference, the value would be lost).
Datetimes use Python's strptime formats (`%d/%m/%Y`, `%Y-%m-%dT%H:%M:%S.%f`,
`%b`, `%p`, `%z` ...), tried in order; with no format, ISO 8601. Aware
datetimes are converted to UTC. Pure functions; imports pyarrow and
`mltable.model`.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc

from datamount.mltable.model import BooleanType, Conversion, DatetimeType

_INT = r"^\s*[+-]?\d+\s*$"
_FLOAT = r"^\s*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\s*$|^\s*(?i:[+-]?(?:nan|inf|infinity))\s*$"
TIMESTAMP = pa.timestamp("us")


class ConversionError(ValueError):
    pass


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def convert(array: pa.Array, conv: Conversion, column: str) -> pa.Array:
    t = array.type
    kind = conv.column_type
    if kind == "string":
        return array if _is_text(t) else pc.cast(array, pa.string())
    if kind in ("int", "float"):
        target = pa.int64() if kind == "int" else pa.float64()
        if _is_text(t):
            valid = pc.match_substring_regex(array, _INT if kind == "int" else _FLOAT)
            cleaned = pc.if_else(valid, pc.utf8_trim_whitespace(array), pa.scalar(None, t))
            if kind == "float":
                return pc.cast(cleaned, target)
            # int of a decimal text ("9.5"): truncated toward zero, as Azure ML does
            decimal = pc.and_(pc.invert(valid), pc.match_substring_regex(array, _FLOAT))
            floats = pc.cast(
                pc.if_else(decimal, pc.utf8_trim_whitespace(array), pa.scalar(None, t)),
                pa.float64(),
            )
            floats = pc.if_else(
                pc.is_finite(floats), pc.trunc(floats), pa.scalar(None, pa.float64())
            )
            return pc.coalesce(pc.cast(cleaned, target), pc.cast(floats, target, safe=False))
        if pa.types.is_null(t):
            return pa.nulls(len(array), target)
        if pa.types.is_floating(t) and kind == "int":  # NaN and inf have no integer: null
            array = pc.if_else(pc.is_finite(array), array, pa.scalar(None, t))
        return pc.cast(array, target, safe=False)
    if kind == "boolean":
        assert conv.boolean is not None
        return _boolean(array, conv.boolean, column)
    assert conv.datetime is not None
    return _datetime(array, conv.datetime)


def _boolean(array: pa.Array, opts: BooleanType, column: str) -> pa.Array:
    t = array.type
    if pa.types.is_boolean(t):
        return array
    if pa.types.is_null(t):
        return pa.nulls(len(array), pa.bool_())
    if not _is_text(t):
        array = pc.cast(array, pa.string())
    is_true = pc.is_in(array, value_set=pa.array(opts.true_values, pa.string()))
    is_false = pc.is_in(array, value_set=pa.array(opts.false_values, pa.string()))
    mismatch = pc.and_(pc.invert(pc.or_(is_true, is_false)), pc.is_valid(array))
    if pc.any(mismatch).as_py():
        if opts.mismatch_as in (None, "error"):
            bad = pc.filter(array, mismatch)[0].as_py()
            raise ConversionError(
                f"column {column!r}: {bad!r} is in neither true_values nor false_values "
                "(set mismatch_as: true or false to convert such values)"
            )
        fallback = pa.scalar(opts.mismatch_as == "true")
        return pc.if_else(
            is_true, True, pc.if_else(is_false, False, pc.if_else(mismatch, fallback, None))
        )
    return pc.if_else(is_true, True, pc.if_else(is_false, False, None))


def _datetime(array: pa.Array, opts: DatetimeType) -> pa.Array:
    t = array.type
    if pa.types.is_timestamp(t):
        return array
    if pa.types.is_date(t):
        return pc.cast(array, TIMESTAMP)
    values = array.to_pylist()
    out = [_parse_datetime(v, opts.formats) if v is not None else None for v in values]
    return pa.array(out, TIMESTAMP)


def _parse_datetime(value: object, formats: list[str]) -> datetime | None:
    text = str(value).strip()
    parsed: datetime | None = None
    for fmt in formats:
        try:
            parsed = datetime.strptime(text, fmt)
            break
        except ValueError:
            continue
    if parsed is None and not formats:
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            return None
    if parsed is not None and parsed.tzinfo is not None:
        parsed = parsed.astimezone(UTC).replace(tzinfo=None)
    return parsed
