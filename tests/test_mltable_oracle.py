"""datamount's MLTable reader against Azure ML's own `mltable` package (the
oracle), case by case over tests/mltable_cases (hand-written MLTables) and
over MLTables the real SDK writes (`from_*_files(...).save()`).

`compare` reports the kinds of difference between the two tables: `error:<who>`
(only one of them failed), `error:both` (both rejected it: agreement, which
a case declares, so that a case never passes by failing twice), `columns` (names or
order), `rows` (count), `dtype:<col>`, `values:<col>`. Normalised before
comparing: pandas' text dtypes (`str`, `string`, `object` of text) are one
`string`; datetime64 units are one `datetime`; nulls (None, NaN, NaT, pd.NA)
are one null; a Path column is compared by its file name. Each case expects
exactly its `differs` set (empty: the same table). The real package starts
a Rust runtime once per process; every case is read in one test process.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from datamount.mltable import load as dm_load
from mltable_cases.cases import CASES, Case, write

pytestmark = pytest.mark.oracle


class _Oracle:
    """The `mltable` package, imported at its first use in a test (skipping the
    test when it is missing): collecting this file, as `pytest -m unit` does,
    does not load the oracle."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # what collection asks of a module's objects
            raise AttributeError(name)
        return getattr(pytest.importorskip("mltable"), name)


mltable: Any = _Oracle()

PATHY = {"Path", "path", "source"}


def _dtype(series: pd.Series) -> str:
    kind = str(series.dtype)
    if kind in ("str", "string", "object"):
        return "string" if kind != "object" or _all_text(series) else "object"
    if kind.startswith("datetime64"):
        return "datetime" + (", tz" if "," in kind else "")  # the unit is normalised, a zone not
    return {"Int64": "int64", "boolean": "bool", "Float64": "float64"}.get(kind, kind)


def _all_text(series: pd.Series) -> bool:
    return all(isinstance(v, str) for v in series if not _null(v))


def _null(v: Any) -> bool:
    if v is None or v is pd.NA or v is pd.NaT:
        return True
    return isinstance(v, float) and math.isnan(v)


def _values(series: pd.Series, name: str) -> list[Any]:
    out = []
    for v in series.tolist():
        if _null(v):
            out.append(None)
        elif name in PATHY and isinstance(v, str):
            out.append(v.replace("\\", "/").rsplit("/", 1)[-1])
        elif hasattr(v, "tolist"):  # a list value (numpy array) of nested JSON or parquet
            out.append(v.tolist())
        elif isinstance(v, pd.Timestamp):
            out.append(v.to_datetime64().astype("datetime64[us]"))
        else:
            out.append(v)
    return out


def compare(ours: Any, real: Any) -> set[str]:
    """The kinds of difference between datamount's result and the real package's."""
    if isinstance(ours, Exception) and isinstance(real, Exception):
        return {"error:both"}  # agreement, but a case must say it expects it
    if isinstance(ours, Exception) or isinstance(real, Exception):
        return {"error:datamount" if isinstance(ours, Exception) else "error:mltable"}
    diffs: set[str] = set()
    if list(ours.columns) != list(real.columns):
        diffs.add("columns")
    if len(ours) != len(real):
        diffs.add("rows")
    for name in [c for c in ours.columns if c in set(real.columns)]:
        a, b = ours[name], real[name]
        if isinstance(a, pd.DataFrame) or isinstance(b, pd.DataFrame):
            diffs.add(f"columns:{name}")  # a duplicate name
            continue
        if _dtype(a) != _dtype(b):
            diffs.add(f"dtype:{name}")
        if len(a) == len(b) and _values(a, name) != _values(b, name):
            diffs.add(f"values:{name}")
    return diffs


def read_both(folder: Path) -> tuple[Any, Any]:
    try:
        ours: Any = dm_load(str(folder)).to_pandas_dataframe()
    except Exception as exc:  # the difference, not the test, is the outcome
        ours = exc
    try:
        real: Any = mltable.load(str(folder)).to_pandas_dataframe()
    except Exception as exc:
        real = exc
    return ours, real


def _show(result: Any) -> str:
    if isinstance(result, Exception):
        return f"{type(result).__name__}: {str(result).strip().splitlines()[0][:300]}"
    return f"{result.to_dict('list')} {dict(result.dtypes.astype(str))}"


def check(case: Case, folder: Path) -> None:
    ours, real = read_both(folder)
    diffs = compare(ours, real)
    assert diffs == set(case.differs), (
        f"{case.name}: differences {sorted(diffs)}, expected {sorted(case.differs)}\n"
        f"  datamount: {_show(ours)}\n  mltable:   {_show(real)}"
    )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mltable_cases")
    for case in CASES:
        write(case, root)
    return root


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case(case: Case, corpus: Path) -> None:
    check(case, corpus / case.name)


# -- MLTables the real SDK writes ---------------------------------------------------

SDK_CSV = b"zip,price,flag,day\n00501,1.50,true,2024-01-01\n02134,2.00,false,2024-01-08\n"
SDK_JSON = b'{"a": 1, "b": "x"}\n{"a": 2, "c": 2.5}\n'


def _sdk_data(root: Path) -> dict[str, str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "data" / "k=1").mkdir(parents=True)
    (root / "data" / "k=2").mkdir(parents=True)
    (root / "data" / "k=1" / "a.csv").write_bytes(SDK_CSV)
    (root / "data" / "k=2" / "a.csv").write_bytes(SDK_CSV)
    (root / "data" / "a.jsonl").write_bytes(SDK_JSON)
    pq.write_table(pa.table({"a": [1, 2, 3], "s": ["x", None, "z"]}), root / "data" / "a.parquet")
    try:
        from deltalake import write_deltalake

        write_deltalake(str(root / "delta"), pa.table({"a": [1, 2], "s": ["x", None]}))
        write_deltalake(str(root / "delta"), pa.table({"a": [3], "s": ["z"]}), mode="append")
    except ImportError:
        pass
    return {
        "delta": str(root / "delta"),
        "csv": str(root / "data" / "k=1" / "a.csv"),
        "csvs": str(root / "data" / "*" / "a.csv"),
        "json": str(root / "data" / "a.jsonl"),
        "parquet": str(root / "data" / "a.parquet"),
    }


def _sdk_tables(p: dict[str, str]) -> dict[str, Any]:
    """Each MLTable as a new user writes it with the SDK (saved, then read back)."""
    m = mltable
    return {
        "delimited": lambda: m.from_delimited_files([{"file": p["csv"]}]),
        "delimited_noinfer": lambda: m.from_delimited_files(
            [{"file": p["csv"]}], infer_column_types=False
        ),
        "delimited_path_col": lambda: m.from_delimited_files(
            [{"file": p["csv"]}], include_path_column=True
        ),
        "delimited_options": lambda: m.from_delimited_files(
            [{"file": p["csv"]}], empty_as_string=True, encoding="utf8", header="from_first_file"
        ),
        "delimited_pattern": lambda: m.from_delimited_files([{"pattern": p["csvs"]}]),
        "delimited_overrides": lambda: m.from_delimited_files(
            [{"file": p["csv"]}],
            infer_column_types={"column_type_overrides": {"zip": "string"}},
        ),
        "delimited_overrides_sample": lambda: m.from_delimited_files(
            [{"file": p["csv"]}],
            infer_column_types={
                "sample_size": 100,
                "column_type_overrides": {
                    "price": m.DataType.to_float(),
                    "flag": m.DataType.to_bool(),
                },
            },
        ),
        "delimited_partition": lambda: m.from_delimited_files(
            [{"pattern": p["csvs"]}]
        ).extract_columns_from_partition_format("/k={k}/a.csv"),
        "delimited_steps": lambda: (
            m.from_delimited_files([{"file": p["csv"]}]).keep_columns(["zip", "price"]).take(1)
        ),
        "delimited_drop_skip": lambda: (
            m.from_delimited_files([{"file": p["csv"]}]).drop_columns(["flag"]).skip(1)
        ),
        "delimited_convert": lambda: m.from_delimited_files(
            [{"file": p["csv"]}], infer_column_types=False
        ).convert_column_types({"price": m.DataType.to_float(), "zip": m.DataType.to_int()}),
        "delimited_filter": lambda: m.from_delimited_files([{"file": p["csv"]}]).filter(
            'col("price") > 1.7'
        ),
        "json": lambda: m.from_json_lines_files([{"file": p["json"]}]),
        "json_options": lambda: m.from_json_lines_files(
            [{"file": p["json"]}], invalid_lines="drop", include_path_column=True
        ),
        "json_take": lambda: m.from_json_lines_files([{"file": p["json"]}]).take(1),
        "parquet": lambda: m.from_parquet_files([{"file": p["parquet"]}]),
        "parquet_path_col": lambda: m.from_parquet_files(
            [{"file": p["parquet"]}], include_path_column=True
        ),
        "parquet_steps": lambda: (
            m.from_parquet_files([{"file": p["parquet"]}]).keep_columns(["s"]).skip(1)
        ),
        "paths": lambda: m.from_paths([{"file": p["parquet"]}]),
        "delta": lambda: m.from_delta_lake(p["delta"]),
        "delta_version": lambda: m.from_delta_lake(p["delta"], version_as_of=0),
        "delta_path_col": lambda: m.from_delta_lake(p["delta"], include_path_column=True),
    }


SDK_DIFFERENCES: dict[str, set[str]] = {
    # deliberate: a stream_info value is the file's URI as text (see the corpus)
    "paths": {"dtype:Path", "values:Path"},
    # deliberate: partition values stay the path's text (see the corpus)
    "delimited_partition": {"dtype:k", "values:k"},
    # deliberate: the columns are every key of the lines read (the real package:
    # of the rows kept)
    "json_take": {"columns"},
}
SDK_NAMES = list(_sdk_tables({}))


@pytest.fixture(scope="module")
def sdk_paths(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("sdk")
    return root, _sdk_data(root)


@pytest.mark.parametrize("name", SDK_NAMES)
def test_sdk_written(name: str, sdk_paths: tuple[Path, dict[str, str]]) -> None:
    root, paths = sdk_paths
    if name.startswith("delta"):
        pytest.importorskip("deltalake")
    folder = root / "tables" / name
    _sdk_tables(paths)[name]().save(str(folder))
    assert (folder / "MLTable").is_file()
    differs = SDK_DIFFERENCES.get(name, set())
    check(Case(f"sdk_{name}", {}, "", frozenset(differs)), folder)
