"""Oracle cases for `read_delta_lake`: Delta Lake tables written with the
`deltalake` package (appends, overwrites, partitions, a schema change), each
commit's `commitInfo.timestamp` and its files' `modificationTime` set to a fixed day so that `timestamp_as_of`
picks the same version every run. No cases without `deltalake`."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

from mltable_cases.base import Case, table_text

DAYS = ["2024-01-01", "2024-03-01", "2024-06-01"]  # commit i's timestamp
TABLE = "  - folder: ./t\n"


def _ms(day: str) -> int:
    return int(datetime.fromisoformat(day).replace(tzinfo=UTC).timestamp() * 1000)


def _delta(writes: Callable[[str], None]) -> dict[str, bytes]:
    """The files of the Delta table `writes` makes in a folder, under t/."""
    with tempfile.TemporaryDirectory() as tmp:
        writes(tmp)
        out: dict[str, bytes] = {}
        for path in sorted(Path(tmp).rglob("*")):
            if not path.is_file():
                continue
            data = path.read_bytes()
            rel = path.relative_to(tmp).as_posix()
            if rel.startswith("_delta_log/") and rel.endswith(".json"):
                data = _stamped(data, DAYS[min(int(path.stem), len(DAYS) - 1)])
            out[f"t/{rel}"] = data
        return out


def _stamped(data: bytes, day: str) -> bytes:
    lines = [json.loads(line) for line in data.splitlines() if line.strip()]
    for action in lines:
        if "commitInfo" in action:
            action["commitInfo"]["timestamp"] = _ms(day)
        if "add" in action:
            action["add"]["modificationTime"] = _ms(day)
    return "".join(json.dumps(a) + "\n" for a in lines).encode()


def _tables() -> dict[str, dict[str, bytes]]:
    from deltalake import write_deltalake

    first = pa.table({"id": [1, 2], "name": ["ann", "bob"], "score": [1.5, None]})
    second = pa.table({"id": [3], "name": ["cy"], "score": [3.0]})
    typed = pa.table({
        "i": pa.array([1, None, 3], pa.int32()), "f": [0.5, None, 2.0],
        "b": [True, False, None], "s": ["x", None, ""],
        "d": pa.array([datetime(2024, 1, 1).date(), None, datetime(2024, 2, 3).date()]),
        "ts": pa.array([datetime(2024, 1, 1, 10, 0, 0), None, datetime(2024, 2, 3, 4, 5, 6)],
                       pa.timestamp("us", "UTC")),
    })  # fmt: skip

    def appended(tmp: str) -> None:
        write_deltalake(tmp, first)
        write_deltalake(tmp, second, mode="append")
        write_deltalake(tmp, second, mode="append")

    def overwritten(tmp: str) -> None:
        write_deltalake(tmp, first)
        write_deltalake(tmp, second, mode="overwrite")

    def merged(tmp: str) -> None:
        write_deltalake(tmp, first)
        extra = pa.table({"id": [9], "name": ["dee"], "score": [0.0], "tag": ["new"]})
        write_deltalake(tmp, extra, mode="append", schema_mode="merge")

    def partitioned(tmp: str) -> None:
        write_deltalake(tmp, pa.table({"k": ["a", "b", "a"], "v": [1, 2, 3]}), partition_by=["k"])

    return {
        "one": _delta(lambda tmp: write_deltalake(tmp, first)),
        "appended": _delta(appended),
        "overwritten": _delta(overwritten),
        "merged": _delta(merged),
        "typed": _delta(lambda tmp: write_deltalake(tmp, typed)),
        "partitioned": _delta(partitioned),
    }


def _read(**opts: object) -> str:
    if not opts:
        return "read_delta_lake"
    return "read_delta_lake: {" + ", ".join(f"{k}: {v}" for k, v in opts.items()) + "}"


def delta_cases() -> list[Case]:
    try:
        tables = _tables()
    except ImportError:
        return []
    t = tables
    return [
        Case("delta_one", t["one"], table_text(TABLE, _read())),
        Case("delta_appended", t["appended"], table_text(TABLE, _read())),
        Case("delta_version0", t["appended"], table_text(TABLE, _read(version_as_of=0))),
        Case("delta_version1", t["appended"], table_text(TABLE, _read(version_as_of=1))),
        Case("delta_version_missing", t["appended"], table_text(TABLE, _read(version_as_of=7))),
        Case("delta_ts_before", t["appended"],
             table_text(TABLE, _read(timestamp_as_of="'2023-06-01T00:00:00Z'"))),
        Case("delta_ts_between", t["appended"],
             table_text(TABLE, _read(timestamp_as_of="'2024-04-01T00:00:00Z'"))),
        Case("delta_ts_exact", t["appended"],
             table_text(TABLE, _read(timestamp_as_of="'2024-03-01T00:00:00Z'"))),
        Case("delta_ts_offset", t["appended"],
             table_text(TABLE, _read(timestamp_as_of="'2024-03-01T02:00:00+03:00'"))),
        Case("delta_ts_after", t["appended"],
             table_text(TABLE, _read(timestamp_as_of="'2030-01-01T00:00:00Z'"))),
        Case("delta_overwritten", t["overwritten"], table_text(TABLE, _read())),
        Case("delta_overwritten_v0", t["overwritten"], table_text(TABLE, _read(version_as_of=0))),
        Case("delta_merged", t["merged"], table_text(TABLE, _read())),
        Case("delta_merged_v0", t["merged"], table_text(TABLE, _read(version_as_of=0))),
        Case("delta_typed", t["typed"], table_text(TABLE, _read())),
        Case("delta_partitioned", t["partitioned"], table_text(TABLE, _read())),
        Case("delta_path_column", t["appended"],
             table_text(TABLE, _read(include_path_column="true"))),
        Case("delta_steps", t["appended"],
             table_text(TABLE, _read(), "filter: 'col(\"id\") > 1'", "keep_columns: [name, id]",
                        "take: 1")),
        Case("delta_convert", t["one"],
             table_text(TABLE, _read(), "convert_column_types: [{columns: id, column_type: float}]")),
        Case("delta_not_a_table", {"t/a.parquet": t["one"][next(
            k for k in t["one"] if k.endswith(".parquet"))]}, table_text(TABLE, _read())),
    ]  # fmt: skip
