"""Tabular loading: every transformation against a pandas reference computed
from the same data, read from real Azurite (and local files); parquet and
JSON lines; `take` over a large CSV fetches only the first blocks."""

from __future__ import annotations

import io
import json
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from azure.storage.blob import ContainerClient

from azurite import Azurite
from datamount.errors import DataError
from datamount.mltable import load
from datamount.workspace.datastores import Workspace
from mltable_support import Counts, azurite_workspace, counting_factory

PARTS = {
    "2023/01": [(1, "ann", 1.5, "yes", "01/02/2023"), (2, "", 2.5, "no", "15/01/2023")],
    "2023/02": [(3, "bob", None, "yes", "28/02/2023"), (4, "cy", 4.0, "no", "")],
    "2024/01": [(5, "dee", 5.5, "yes", "31/01/2024"), (6, "", 6.0, "no", "02/01/2024")],
}
HEADER = "id,name,score,flag,day"


def csv_bytes(rows: list[tuple[object, ...]], header: bool = True) -> bytes:
    lines = [HEADER] if header else []
    lines += [",".join("" if v is None else str(v) for v in row) for row in rows]
    return ("\n".join(lines) + "\n").encode()


def reference(keep_empty: bool = False) -> pd.DataFrame:
    """pandas' own reading of the same files, in the same order."""
    frames = [
        pd.read_csv(
            io.BytesIO(csv_bytes(rows)),
            keep_default_na=not keep_empty,
            na_values=[] if keep_empty else None,
        )
        for rows in PARTS.values()
    ]
    return pd.concat(frames, ignore_index=True)


@pytest.fixture
def remote(azurite: Azurite, container: ContainerClient) -> tuple[ContainerClient, Workspace]:
    for part, rows in PARTS.items():
        container.upload_blob(f"t/data/{part}/part.csv", csv_bytes(rows))
    ws = azurite_workspace(azurite.endpoint, azurite.key, {"main": container.container_name})
    return container, ws


def load_remote(
    remote: tuple[ContainerClient, Workspace],
    steps: list[str],
    path: str = "pattern: ./data/**/*.csv",
    counts: Counts | None = None,
):
    container, ws = remote
    text = f"paths:\n  - {path}\ntransformations:\n" + "".join(f"  - {s}\n" for s in steps)
    container.upload_blob("t/MLTable", text.encode(), overwrite=True)
    return load(
        "azureml://datastores/main/paths/t/", ws, store_factory=counting_factory(counts or Counts())
    )


def same(actual: pd.DataFrame, expected: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(
        actual.reset_index(drop=True), expected.reset_index(drop=True), check_dtype=False
    )


def test_read_delimited_matches_pandas(remote) -> None:
    df = load_remote(remote, ["read_delimited: {}"]).to_pandas_dataframe()
    same(df, reference())
    assert df["name"].isna().sum() == 2  # empty fields are nulls by default


def test_empty_as_string_and_path_column(remote) -> None:
    container, _ = remote
    t = load_remote(remote, ["read_delimited: {empty_as_string: true, include_path_column: true}"])
    df = t.to_pandas_dataframe()
    assert list(df["name"]) == ["ann", "", "bob", "cy", "dee", ""]
    endpoint = remote[1].config.datastores["main"].endpoint
    assert list(df["Path"]) == [
        f"{endpoint}/{container.container_name}/t/data/{part}/part.csv"
        for part in PARTS
        for _ in range(2)
    ]


def test_headers_delimiter_and_encoding(remote) -> None:
    container, _ = remote
    container.upload_blob("t/h/1.csv", "a;b\n1;é\n".encode("latin-1"))
    container.upload_blob("t/h/2.csv", "2;ü\n3;x\n".encode("latin-1"))
    t = load_remote(
        remote,
        ["read_delimited: {delimiter: ';', encoding: latin1, header: from_first_file}"],
        path="folder: ./h/",
    )
    same(t.to_pandas_dataframe(), pd.DataFrame({"a": [1, 2, 3], "b": ["é", "ü", "x"]}))
    t = load_remote(
        remote,
        ["read_delimited: {delimiter: ';', encoding: latin1, header: no_header}"],
        path="folder: ./h/",
    )
    same(
        t.to_pandas_dataframe(),
        pd.DataFrame({"Column1": ["a", "1", "2", "3"], "Column2": ["b", "é", "ü", "x"]}),
    )


def test_keep_drop_and_row_subsetting(remote) -> None:
    ref = reference()
    t = load_remote(
        remote, ["read_delimited: {}", "keep_columns: [score, id]", "skip: 1", "take: 3"]
    )
    # the table's order, not the list's (as Azure ML's keep_columns: issue 12)
    same(t.to_pandas_dataframe(), ref[["id", "score"]].iloc[1:4])
    t = load_remote(remote, ["read_delimited: {}", "drop_columns: [name, day]", "take: 100"])
    same(t.to_pandas_dataframe(), ref.drop(columns=["name", "day"]))
    steps = ["read_delimited: {}", "take_random_sample: {probability: 0.5, seed: 11}"]
    a = load_remote(remote, steps).to_pandas_dataframe()
    keep = np.random.default_rng(11).random(len(ref)) < 0.5
    same(a, ref[keep])
    same(load_remote(remote, steps).to_pandas_dataframe(), a)  # same seed, same rows


def test_convert_column_types_matches_pandas(remote) -> None:
    t = load_remote(
        remote,
        [
            "read_delimited: {infer_column_types: false}",
            "convert_column_types: ["
            "{columns: id, column_type: int},"
            "{columns: score, column_type: float},"
            "{columns: flag, column_type: {boolean: {true_values: ['yes'], false_values: ['no']}}},"
            "{columns: day, column_type: {datetime: {formats: ['%d/%m/%Y']}}}]",
        ],
    )
    df = t.to_pandas_dataframe()
    ref = reference()
    assert list(df["id"]) == list(ref["id"])
    assert df["score"].equals(ref["score"].astype(float))
    assert list(df["flag"]) == [v == "yes" for v in ref["flag"]]
    expected_days = pd.to_datetime(ref["day"], format="%d/%m/%Y")
    assert list(df["day"]) == list(expected_days)
    assert str(df["day"].dtype).startswith("datetime64")
    as_text = load_remote(
        remote,
        ["read_delimited: {}", "convert_column_types: [{columns: [id], column_type: string}]"],
    )
    assert list(as_text.to_pandas_dataframe()["id"]) == [str(i) for i in ref["id"]]
    bad = load_remote(
        remote,
        ["read_delimited: {}", "convert_column_types: [{columns: name, column_type: boolean}]"],
    )
    with pytest.raises(
        DataError, match="column 'name': 'ann' is in neither true_values nor false_values"
    ):
        bad.to_arrow_table()


def test_filter_matches_pandas(remote) -> None:
    ref = reference()
    t = load_remote(
        remote,
        [
            "read_delimited: {}",
            """filter: 'col("score") > 2 and (name is not null or flag == "no")'""",
        ],
    )
    same(t.to_pandas_dataframe(), ref[(ref.score > 2) & (ref.name.notna() | (ref.flag == "no"))])
    t = load_remote(remote, ["read_delimited: {}", "filter: 'not id <= 4 or score is null'"])
    same(t.to_pandas_dataframe(), ref[~(ref.id <= 4) | ref.score.isna()])
    missing = load_remote(remote, ["read_delimited: {}", "filter: 'nope > 1'"])
    with pytest.raises(DataError, match=r"transformations\[1\].filter: no column 'nope'"):
        missing.to_arrow_table()


def test_partition_columns(remote) -> None:
    t = load_remote(
        remote,
        [
            "read_delimited: {}",
            "extract_columns_from_partition_format: '{year}/{month}/part.csv'",
            "keep_columns: [id, year, month]",
        ],
    )
    df = t.to_pandas_dataframe()
    assert list(zip(df.id, df.year, df.month, strict=True)) == [
        (1, "2023", "01"),
        (2, "2023", "01"),
        (3, "2023", "02"),
        (4, "2023", "02"),
        (5, "2024", "01"),
        (6, "2024", "01"),
    ]
    t = load_remote(
        remote, ["read_delimited: {}", "extract_columns_from_partition_format: {when:yyyy/MM}"]
    )
    assert list(t.to_pandas_dataframe()["when"].drop_duplicates()) == [
        datetime(2023, 1, 1),
        datetime(2023, 2, 1),
        datetime(2024, 1, 1),
    ]


def test_parquet_files(remote) -> None:
    container, _ = remote
    frames = []
    for i in range(3):
        df = pd.DataFrame(
            {"k": np.arange(i * 1000, (i + 1) * 1000), "v": [f"s{j}" for j in range(1000)]}
        )
        buf = io.BytesIO()
        pq.write_table(pa.Table.from_pandas(df, preserve_index=False), buf, row_group_size=100)
        container.upload_blob(f"t/pq/part-{i}.parquet", buf.getvalue())
        frames.append(df)
    ref = pd.concat(frames, ignore_index=True)
    t = load_remote(
        remote,
        ["read_parquet: {include_path_column: true}", "filter: 'k >= 500 and k < 2500'"],
        path="pattern: ./pq/*.parquet",
    )
    df = t.to_pandas_dataframe()
    same(df[["k", "v"]], ref[(ref.k >= 500) & (ref.k < 2500)])
    assert df["Path"].str.endswith("part-1.parquet").sum() == 1000
    counts = Counts()
    t = load_remote(
        remote, ["read_parquet", "take: 5"], path="pattern: ./pq/*.parquet", counts=counts
    )
    same(t.to_pandas_dataframe(), ref.iloc[:5])


def test_json_lines(remote) -> None:
    container, _ = remote
    rows = [{"a": i, "b": f"x{i}", "c": None if i % 3 else i / 2} for i in range(7)]
    body = (
        "\n".join(json.dumps(r) for r in rows[:4])
        + "\n{not json}\n\n"
        + "\n".join(json.dumps(r) for r in rows[4:])
        + "\n"
    )
    container.upload_blob("t/j/1.jsonl", body.encode())
    t = load_remote(
        remote, ["read_json_lines: {invalid_lines: drop}", "skip: 1"], path="file: ./j/1.jsonl"
    )
    same(t.to_pandas_dataframe(), pd.DataFrame(rows).iloc[1:])
    strict = load_remote(remote, ["read_json_lines: {}"], path="file: ./j/1.jsonl")
    with pytest.raises(DataError) as info:
        strict.to_arrow_table()
    base = f"{remote[1].config.datastores['main'].endpoint}/{container.container_name}/t"
    assert str(info.value) == (
        f"MLTable {base}/MLTable: transformations[0].read_json_lines: {base}/j/1.jsonl "
        "(paths[0]): line 5: invalid JSON (Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1)); set invalid_lines: drop to skip"
    )


def test_take_over_a_large_csv_reads_only_the_first_blocks(remote) -> None:
    container, _ = remote
    row = b"%08d,some text to make the line longer than it needs to be,3.14159\n"
    body = b"n,text,pi\n" + b"".join(row % i for i in range(250_000))  # ~18 MiB
    container.upload_blob("t/big/big.csv", body)
    counts = Counts()
    t = load_remote(
        remote, ["read_delimited: {}", "take: 10"], path="file: ./big/big.csv", counts=counts
    )
    read_before = counts["bytes"]  # the MLTable file itself
    df = t.to_pandas_dataframe()
    assert list(df["n"]) == list(range(10))
    fetched = counts["bytes"] - read_before
    assert len(body) > 16 << 20
    assert fetched == 1 << 20, fetched  # the first 1 MiB block of an 18 MiB file, nothing more
    assert all(length <= 1 << 20 for _, _, length in counts["ranges"])  # bounded ranges


@pytest.mark.unit
def test_paths_only_and_local_mltable(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.csv").write_text("x,y\n1,2\n3,4\n")
    (tmp_path / "d" / "b.csv").write_text("x,y\n5,6\n")
    (tmp_path / "MLTable").write_text(
        "paths: [{pattern: ./d/*.csv}]\ntransformations: [read_delimited, {filter: 'y > 2'}]\n"
    )
    same(load(str(tmp_path)).to_pandas_dataframe(), pd.DataFrame({"x": [3, 5], "y": [4, 6]}))
    (tmp_path / "MLTable").write_text("paths: [{pattern: ./d/*.csv}]\n")
    df = load(str(tmp_path)).to_pandas_dataframe()
    assert list(df["Path"]) == [str(tmp_path / "d" / "a.csv"), str(tmp_path / "d" / "b.csv")]


@pytest.mark.unit
@pytest.mark.parametrize("multi_line", [False, True], ids=["by-lines", "arrow-streaming"])
def test_a_header_only_csv_keeps_its_columns(tmp_path: Path, multi_line: bool) -> None:
    """As pandas.read_csv: a file with a header and no row is a table with those
    columns and no row (Arrow yields no batch for it: the columns were lost)."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.csv").write_text("x,y\n")
    step = f"{{read_delimited: {{support_multi_line: {str(multi_line).lower()}}}}}"
    (tmp_path / "MLTable").write_text(f"paths: [{{file: ./d/a.csv}}]\ntransformations: [{step}]\n")
    df = load(str(tmp_path)).to_pandas_dataframe()
    assert list(df.columns) == list(pd.read_csv(tmp_path / "d" / "a.csv").columns) == ["x", "y"]
    assert len(df) == 0
    # beside a file with rows (3, not 1: a 0/1-only column is boolean, issue 12)
    (tmp_path / "d" / "b.csv").write_text("x,y\n3,2\n")
    (tmp_path / "MLTable").write_text(
        f"paths: [{{pattern: ./d/*.csv}}]\ntransformations: [{step}]\n"
    )
    same(load(str(tmp_path)).to_pandas_dataframe(), pd.DataFrame({"x": [3], "y": [2]}))
    # No rows asked for: the columns keep the types the rows give, not the
    # header-only file's (typed by no value), wherever it comes in the listing.
    for subset, files in (("take: 0", ["a.csv", "b.csv"]), ("skip: 5", ["b.csv", "a.csv"])):
        paths = ", ".join(f"{{file: ./d/{f}}}" for f in files)
        text = f"paths: [{paths}]\ntransformations: [{step}, {{{subset}}}]\n"
        (tmp_path / "MLTable").write_text(text)
        df = load(str(tmp_path)).to_pandas_dataframe()
        assert list(df.columns) == ["x", "y"] and len(df) == 0, subset
        assert [str(t) for t in df.dtypes] == ["int64", "int64"], subset


@pytest.mark.unit
def test_a_header_line_without_a_newline_gives_the_columns(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("x,y")  # pandas.read_csv: columns x, y, no row
    (tmp_path / "b.csv").write_text("x,y\n1,2")  # a last row without a newline
    for name, rows in (("a.csv", {"x": [], "y": []}), ("b.csv", {"x": [1], "y": [2]})):
        text = f"paths: [{{file: ./{name}}}]\ntransformations: [read_delimited]\n"
        (tmp_path / "MLTable").write_text(text)
        df = load(str(tmp_path)).to_pandas_dataframe()
        assert list(df.columns) == list(pd.read_csv(tmp_path / name).columns) == ["x", "y"]
        assert df.to_dict("list") == rows


@pytest.mark.unit
def test_small_blocks_quoted_newlines_and_utf16(tmp_path: Path) -> None:
    lines = [f"{i},{i * 0.5 if i >= 60 else i},{'bad' if i == 90 else i}" for i in range(100)]
    (tmp_path / "m.csv").write_text("a,b,c\n" + "\n".join(lines) + "\n")
    (tmp_path / "MLTable").write_text("paths: [{file: m.csv}]\ntransformations: [read_delimited]\n")
    # 64-byte blocks: every block is parsed (and typed) on its own, then unified.
    df = load(str(tmp_path), block_size=64).to_pandas_dataframe()
    ref = pd.read_csv(tmp_path / "m.csv")
    assert list(df["a"]) == list(ref["a"])
    assert df["b"].dtype == "float64" and list(df["b"]) == list(ref["b"])
    assert list(df["c"]) == [str(v) for v in ref["c"]]  # ints, then 'bad': kept as text
    (tmp_path / "MLTable").write_text(
        "paths: [{file: m.csv}]\ntransformations: [read_delimited, {skip: 7}, {take: 25}]\n"
    )
    same(load(str(tmp_path), block_size=100).to_pandas_dataframe()[["a"]], ref[["a"]].iloc[7:32])
    (tmp_path / "q.csv").write_text('a,b\n1,"two\nlines"\n2,z\n')
    (tmp_path / "MLTable").write_text(
        "paths: [{file: q.csv}]\ntransformations: [{read_delimited: {support_multi_line: true}}]\n"
    )
    same(
        load(str(tmp_path)).to_pandas_dataframe(),
        pd.DataFrame({"a": [1, 2], "b": ["two\nlines", "z"]}),
    )
    (tmp_path / "u.csv").write_bytes("a,b\n1,é\n2,ü\n".encode("utf-16"))
    (tmp_path / "MLTable").write_text(
        "paths: [{file: u.csv}]\ntransformations: [{read_delimited: {encoding: utf16}}]\n"
    )
    same(load(str(tmp_path)).to_pandas_dataframe(), pd.DataFrame({"a": [1, 2], "b": ["é", "ü"]}))


def test_eval_layout_round_trip(remote, tmp_path: Path) -> None:
    """What eval_download will do: copy every evaluated file to its eval path,
    write the eval MLTable at the root, load it locally: same table."""
    from datamount.mltable import evaluate_table
    from datamount.storage import open_store

    container, ws = remote
    steps = [
        "take: 2",  # file level: the first two files
        "read_delimited: {include_path_column: false}",
        "extract_columns_from_partition_format: {when:yyyy/MM}",
        "filter: 'score > 1'",
        "keep_columns: [id, when]",
    ]
    remote_table = load_remote(remote, steps)
    expected = remote_table.to_pandas_dataframe()
    _, files, text = evaluate_table(
        "azureml://datastores/main/paths/t/", ws, counting_factory(Counts())
    )
    assert [f.eval_path for f in files] == [
        f"devstoreaccount1/{container.container_name}/t/data/2023/01/part.csv",
        f"devstoreaccount1/{container.container_name}/t/data/2023/02/part.csv",
    ]
    for f in files:
        dest = tmp_path / f.eval_path
        dest.parent.mkdir(parents=True, exist_ok=True)
        store = open_store(f.location)
        dest.write_bytes(store.read(f.key, 0, f.size, etag=f.etag))
        store.close()
    (tmp_path / "MLTable").write_text(text)
    assert "take" not in text and "read_delimited" in text
    local = load(str(tmp_path)).to_pandas_dataframe()
    same(local, expected)
    assert list(local["id"]) == [1, 2, 4]
