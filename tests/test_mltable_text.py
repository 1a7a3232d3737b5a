"""Regression tests for values that must reach the table unchanged: with
`infer_column_types: false` every delimited value is the file's exact text,
and JSON lines keep every key of every line (not only the first line's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from datamount.mltable import load

pytestmark = pytest.mark.unit

TEXT = ["00501", "1.50", "TRUE", "1e3", "2024-01-01", "07", "NA", "null", "-0", " 3 "]


def _table(tmp_path: Path, data: bytes, name: str, step: str) -> Path:
    (tmp_path / name).write_bytes(data)
    (tmp_path / "MLTable").write_text(f"paths: [{{file: ./{name}}}]\ntransformations: [{step}]\n")
    return tmp_path


@pytest.mark.parametrize("multi_line", [False, True], ids=["by-lines", "arrow-streaming"])
@pytest.mark.parametrize("header", ["all_files_same_headers", "no_header"])
def test_no_inference_keeps_the_exact_text(tmp_path: Path, multi_line: bool, header: str) -> None:
    names = [f"c{i}" for i in range(len(TEXT))]
    lines = [",".join(TEXT), ",".join(reversed(TEXT))]
    if header != "no_header":
        lines.insert(0, ",".join(names))
    else:
        names = [f"Column{i + 1}" for i in range(len(TEXT))]
    step = (
        f"{{read_delimited: {{infer_column_types: false, header: {header}, "
        f"support_multi_line: {str(multi_line).lower()}}}}}"
    )
    folder = _table(tmp_path, ("\n".join(lines) + "\n").encode(), "a.csv", step)
    df = load(str(folder), block_size=64).to_pandas_dataframe()
    assert list(df.columns) == names
    assert df.iloc[0].tolist() == TEXT
    assert df.iloc[1].tolist() == list(reversed(TEXT))


def test_no_inference_later_blocks_keep_the_text(tmp_path: Path) -> None:
    rows = [f"{i:05d},{i}.50" for i in range(200)]
    data = ("zip,price\n" + "\n".join(rows) + "\n").encode()
    folder = _table(tmp_path, data, "a.csv", "{read_delimited: {infer_column_types: false}}")
    df = load(str(folder), block_size=128).to_pandas_dataframe()
    assert df["zip"].tolist() == [f"{i:05d}" for i in range(200)]
    assert df["price"].tolist() == [f"{i}.50" for i in range(200)]


def test_quoted_and_unquoted_empty_fields(tmp_path: Path) -> None:
    folder = _table(tmp_path, b'a,b\nx,""\n,y\n', "a.csv", "read_delimited")
    df = load(str(folder)).to_pandas_dataframe()
    assert df["a"].tolist()[0] == "x" and df["a"].isna().tolist() == [False, True]
    assert df["b"].tolist() == ["", "y"]


def test_json_lines_keep_keys_first_seen_on_a_later_line(tmp_path: Path) -> None:
    data = b'{"a": 1}\n{"a": 2, "b": "x"}\n{"c": 1.5}\n'
    folder = _table(tmp_path, data, "a.jsonl", "read_json_lines")
    df = load(str(folder)).to_pandas_dataframe()
    assert list(df.columns) == ["a", "b", "c"]
    assert df["b"].tolist()[1] == "x" and df["c"].tolist()[2] == 1.5
    assert df["a"].tolist()[:2] == [1, 2]


def test_a_short_row_gets_nulls_in_any_block(tmp_path: Path) -> None:
    rows = [f"{i},x{i},{i}.5" if i % 7 else f"{i},x{i}" for i in range(1, 60)]
    folder = _table(
        tmp_path, ("a,b,c\n" + "\n".join(rows) + "\n").encode(), "a.csv", "read_delimited"
    )
    df = load(str(folder), block_size=64).to_pandas_dataframe()
    assert df["a"].tolist() == list(range(1, 60))
    assert df["c"].isna().tolist() == [i % 7 == 0 for i in range(1, 60)]
    # A longer row: its extra fields as Column3..., as Azure ML (issue 12; was an error).
    (tmp_path / "a.csv").write_bytes(b"a,b\n1,2,3\n4,5\n")
    df = load(str(folder)).to_pandas_dataframe()
    assert list(df.columns) == ["a", "b", "Column3"]
    assert df["Column3"].tolist()[0] == 3 and df["Column3"].isna().tolist() == [False, True]


def test_no_multi_line_a_newline_ends_a_row(tmp_path: Path) -> None:
    """support_multi_line: false (the default): a quote left open at a line's
    end is text, and the next line is the next row, as Azure ML reads it."""
    data = b'a,b\n1,"two\nlines"\n2,z\n' + b"".join(b"%d,y\n" % i for i in range(3, 40))
    folder = _table(tmp_path, data, "a.csv", "read_delimited")
    df = load(str(folder), block_size=64).to_pandas_dataframe()
    assert df["a"].tolist()[:3] == ["1", 'lines"', "2"]
    assert df["b"][0] == '"two' and df["b"].isna().tolist()[:3] == [False, True, False]


def test_plus_signed_ints_stay_int(tmp_path: Path) -> None:
    folder = _table(tmp_path, b"i,f\n-1,-1.5\n+2,1e3\n", "a.csv", "read_delimited")
    df = load(str(folder)).to_pandas_dataframe()
    assert df["i"].tolist() == [-1, 2] and str(df["i"].dtype) == "int64"
    assert df["f"].tolist() == [-1.5, 1000.0]


def test_select_partitions_by_bytes(tmp_path: Path) -> None:
    """A partition is `partition_size` bytes of a file; a row is in the one its
    first byte is in (as Azure ML), however the reader cuts its blocks."""
    data = b"n\n" + b"".join(b"%d\n" % i for i in range(2000))
    offsets, at = [], 2
    for i in range(2000):
        offsets.append(at)
        at += len(b"%d\n" % i)
    step = "{read_delimited: {partition_size: 1000}}, {select_partitions: [1, 4]}"
    folder = _table(tmp_path, data, "a.csv", step)
    expected = [i for i, o in enumerate(offsets) if o // 1000 in (1, 4)]
    for block in (64, 700, 1 << 20):
        df = load(str(folder), block_size=block).to_pandas_dataframe()
        assert df["n"].tolist() == expected
