"""The MLTable file: its model and parser (Azure ML's MLTable YAML syntax).

An MLTable is a folder holding an `MLTable` YAML file with `paths` (each a
`file:`, `folder:` or `pattern:` entry) and an ordered list of
`transformations`, each a one-key mapping (`- take: 10`). Parsing is pure:
text in, `MLTable` out; every problem is one line naming the MLTable file and
the entry (`MLTable /data/t/MLTable: transformations[1].read_delimited: unknown
key 'delimeter'`). Reading the file from storage is `evaluate.read_mltable`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from datamount import yamlfile
from datamount.errors import InvalidInput
from datamount.mltable import expr, patterns
from datamount.mltable.options import (
    CODECS,
    BooleanType,
    Conversion,
    DatetimeType,
    Encoding,
    ReadDelimited,
    ReadDeltaLake,
    ReadJsonLines,
    ReadParquet,
    Sample,
    TakeRandomSample,
)
from datamount.mltable.options import (
    columns as _columns,
)
from datamount.mltable.options import (
    conversions as _conversions,
)
from datamount.mltable.options import (
    pydantic_message as _pydantic_message,
)

__all__ = [  # the option models live in options.py; re-exported for callers
    "CODECS", "BooleanType", "Conversion", "DatetimeType", "Encoding", "MLTable",
    "MLTableError", "PathEntry", "ReadDelimited", "ReadDeltaLake", "ReadJsonLines",
    "ReadParquet", "Step", "TakeRandomSample", "parse_mltable",
]  # fmt: skip


class MLTableError(InvalidInput):
    """The MLTable file is malformed (exit code 2, one line per problem)."""


READS = ("read_delimited", "read_parquet", "read_json_lines", "read_delta_lake")
FILE_STEPS = ("take", "skip", "take_random_sample")  # before a read step: on the file list
PATH_KINDS = ("file", "folder", "pattern")
# May come before the read step too (the SDK writes it there): its columns come first.
PARTITION_STEP = "extract_columns_from_partition_format"


@dataclass(frozen=True)
class PathEntry:
    """One `paths` item. `value` is the path or URI as written."""

    kind: Literal["file", "folder", "pattern"]
    value: str
    where: str  # "paths[0]"


@dataclass(frozen=True)
class Step:
    """One transformation. `args` is the typed value for `name`:

    read_delimited → ReadDelimited, read_parquet → ReadParquet, read_json_lines
    → ReadJsonLines, read_delta_lake → ReadDeltaLake, take / skip → int,
    take_random_sample → TakeRandomSample,
    keep_columns / drop_columns → list[str] or re.Pattern ({pattern: <regex>}),
    convert_column_types →
    list[Conversion], filter → expr.Expr, extract_columns_from_partition_format
    → patterns.PartitionFormat, select_partitions → list[int] (sorted),
    sample → Sample.
    """

    name: str
    args: Any
    where: str  # "transformations[2]"
    raw: Any = None  # the item as written (to write the MLTable back out)

    @property
    def is_read(self) -> bool:
        return self.name in READS


@dataclass(frozen=True)
class MLTable:
    source: str  # where the MLTable file is (path or URI), for messages
    paths: tuple[PathEntry, ...]
    steps: tuple[Step, ...]

    @property
    def read_step(self) -> Step | None:
        return next((s for s in self.steps if s.is_read), None)

    def file_steps(self) -> list[Step]:
        """take / skip / take_random_sample before the first read step: they
        subset the file list (with no read step at all, every one of them does)."""
        out = []
        for step in self.steps:
            if step.is_read:
                break
            if step.name in FILE_STEPS:
                out.append(step)
        return out

    def row_steps(self) -> list[Step]:
        """Every step after the first read step (applied to rows), after the
        partition steps written before the read step (as the SDK writes them)."""
        steps = list(self.steps)
        first = next((i for i, s in enumerate(steps) if s.is_read), None)
        if first is None:
            return []
        return [s for s in steps[:first] if s.name == PARTITION_STEP] + steps[first + 1 :]

    def leads(self, step: Step) -> bool:
        """Whether `step` comes before the read step (its columns go first)."""
        read = self.read_step
        return read is not None and self.steps.index(step) < self.steps.index(read)


TOP_KEYS = {"$schema", "type", "paths", "transformations", "traits", "metadata"}


def parse_mltable(text: str, source: str) -> MLTable:
    """Parse MLTable YAML `text`; `source` names the file in every error."""
    fail = _Failer(source)
    data = yamlfile.parse(text, f"MLTable {source}", MLTableError)
    if not isinstance(data, dict):
        raise fail("expected a mapping with 'paths' and 'transformations' at the top level")
    unknown = sorted(str(k) for k in data if k not in TOP_KEYS)
    if unknown:
        raise fail(f"unknown key {unknown[0]!r} (allowed: paths, transformations, type, $schema)")
    if data.get("type", "mltable") != "mltable":
        raise fail(f"type: expected 'mltable', got {data['type']!r}")
    raw_paths = data.get("paths")
    if not isinstance(raw_paths, list) or not raw_paths:
        raise fail("paths: expected a non-empty list of file:, folder: or pattern: entries")
    paths = tuple(_path_entry(item, f"paths[{i}]", fail) for i, item in enumerate(raw_paths))
    raw_steps = data.get("transformations") or []
    if not isinstance(raw_steps, list):
        raise fail("transformations: expected a list")
    steps = tuple(_step(item, f"transformations[{i}]", fail) for i, item in enumerate(raw_steps))
    reads = [s for s in steps if s.is_read]
    if len(reads) > 1:
        raise fail(f"{reads[1].where}: only one read_* transformation is allowed")
    for step in steps:
        if step.is_read:
            break
        if step.name not in (*FILE_STEPS, PARTITION_STEP):
            place = "after the read_* transformation" if reads else "after a read_* transformation"
            raise fail(f"{step.where}: {step.name} works on columns: it must come {place}")
    return MLTable(source, paths, steps)


class _Failer:
    def __init__(self, source: str) -> None:
        self.source = source

    def __call__(self, message: str) -> MLTableError:
        return MLTableError(f"MLTable {self.source}: {message}")


def _path_entry(item: Any, where: str, fail: _Failer) -> PathEntry:
    if not isinstance(item, dict) or len(item) != 1:
        raise fail(f"{where}: expected one of file:, folder:, pattern: with a path, got {item!r}")
    ((kind, value),) = item.items()
    if kind not in PATH_KINDS:
        raise fail(f"{where}: unknown path kind {kind!r} (allowed: file, folder, pattern)")
    if not isinstance(value, str) or not value.strip():
        raise fail(f"{where}.{kind}: expected a path or URI, got {value!r}")
    if kind == "pattern":
        try:
            patterns.compile_glob(value)
        except ValueError as exc:
            raise fail(f"{where}.pattern: {value!r}: {exc}") from None
    return PathEntry(kind, value.strip(), where)


def _step(item: Any, where: str, fail: _Failer) -> Step:
    if isinstance(item, str) and item in READS:  # `- read_parquet` with no options
        item = {item: None}
    if not isinstance(item, dict) or len(item) != 1:
        raise fail(f"{where}: expected one transformation as a one-key mapping, got {item!r}")
    ((name, value),) = item.items()
    at = f"{where}.{name}"
    parser = _PARSERS.get(str(name))
    if parser is None:
        known = ", ".join(sorted(_PARSERS))
        raise fail(f"{where}: unknown transformation {name!r} (known: {known})")
    try:
        return Step(str(name), parser(value), where, {name: value})
    except ValidationError as exc:
        raise fail(f"{at}: {_pydantic_message(exc)}") from None
    except ValueError as exc:
        raise fail(f"{at}: {exc}") from None


def _options(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping of options, got {value!r}")
    return value


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected a non-negative integer, got {value!r}")
    return value


def _partition(value: Any) -> patterns.PartitionFormat:
    # Written as a string, as {partition_format: ...}, or as the docs' flow
    # mapping `{timestamp:yyyy/MM/dd}`, which YAML reads as {'timestamp:yyyy/MM/dd': None}.
    # The SDK writes {partition_format, ignore_errors, path_column}.
    if isinstance(value, dict) and "partition_format" in value:
        unknown = sorted(set(value) - {"partition_format", "ignore_errors", "path_column"})
        if unknown:
            raise ValueError(f"unknown key {unknown[0]!r}")
        value = value["partition_format"]
    elif isinstance(value, dict) and len(value) == 1 and next(iter(value.values())) is None:
        value = "{" + str(next(iter(value))) + "}"
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a partition format such as '{{year}}/{{month}}/': {value!r}")
    return patterns.PartitionFormat.parse(value)


def _selector(value: Any) -> list[str] | re.Pattern[str]:
    """Column names, or `{pattern: <regex>}`: every column the regex finds in."""
    if isinstance(value, dict) and set(value) == {"pattern"}:
        try:
            return re.compile(str(value["pattern"]))
        except re.error as exc:
            raise ValueError(f"pattern {value['pattern']!r}: {exc}") from None
    return _columns(value)


def _partition_list(value: Any) -> list[int]:
    """`select_partitions`: partition indexes (one, or a non-empty list)."""
    items = value if isinstance(value, list) else [value]
    if not items or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in items
    ):
        raise ValueError(f"expected a partition index or a list of them (>= 0), got {value!r}")
    return sorted(set(items))


def _filter(value: Any) -> expr.Expr:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected an expression string, got {value!r}")
    return expr.parse(value)


_PARSERS: dict[str, Any] = {
    "read_delimited": lambda v: ReadDelimited.model_validate(_options(v)),
    "read_parquet": lambda v: ReadParquet.model_validate(_options(v)),
    "read_json_lines": lambda v: ReadJsonLines.model_validate(_options(v)),
    "read_delta_lake": lambda v: ReadDeltaLake.model_validate(_options(v)),
    "take": _count,
    "skip": _count,
    "take_random_sample": lambda v: TakeRandomSample.model_validate(_options(v)),
    "keep_columns": _selector,
    "drop_columns": _selector,
    "convert_column_types": _conversions,
    "filter": _filter,
    "select_partitions": _partition_list,
    "sample": lambda v: Sample.model_validate(_options(v)),
    "extract_columns_from_partition_format": _partition,
}
