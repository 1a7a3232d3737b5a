"""MLTable parser, glob patterns, partition formats and the filter language
(pure: no storage)."""

from __future__ import annotations

import textwrap
from datetime import datetime

import pyarrow as pa
import pytest

from datamount.mltable import MLTableError, parse_mltable
from datamount.mltable import expr as fexpr
from datamount.mltable.model import BooleanType, Conversion, DatetimeType
from datamount.mltable.patterns import PartitionFormat, compile_glob, fixed_prefix, needs_recursion

pytestmark = pytest.mark.unit

SRC = "/data/t/MLTable"


def parse(text: str):
    return parse_mltable(textwrap.dedent(text), SRC)


def error(text: str) -> str:
    with pytest.raises(MLTableError) as info:
        parse(text)
    assert len(info.value.problems) == 1
    return str(info.value)


FULL = """\
    $schema: https://azuremlschemas.azureedge.net/latest/MLTable.schema.json
    type: mltable
    paths:
      - file: ./a.csv
      - folder: wasbs://data@acct.blob.core.windows.net/x/
      - pattern: azureml://datastores/ds/paths/logs/**/*.csv
    transformations:
      - read_delimited:
          encoding: ascii
          header: from_first_file
          delimiter: ";"
          include_path_column: true
          empty_as_string: true
      - keep_columns: [col1, col2, col3]
      - drop_columns: col3
      - convert_column_types:
          - columns: col1
            column_type: int
          - columns: col2
            column_type:
              datetime:
                formats:
                  - "%d/%m/%Y"
          - columns: [col3, col4]
            column_type:
              boolean:
                mismatch_as: error
                true_values: ["yes", "true", "1"]
                false_values: ["no", "false", "0"]
      - filter: 'col("col1") > 32 and col("col7") == "a_string"'
      - extract_columns_from_partition_format: {timestamp:yyyy/MM/dd}
      - skip: 10
      - take: 200
      - take_random_sample:
          probability: 0.50
          seed: 1394
"""


def test_every_path_kind_and_transformation() -> None:
    t = parse(FULL)
    assert [(p.kind, p.value, p.where) for p in t.paths] == [
        ("file", "./a.csv", "paths[0]"),
        ("folder", "wasbs://data@acct.blob.core.windows.net/x/", "paths[1]"),
        ("pattern", "azureml://datastores/ds/paths/logs/**/*.csv", "paths[2]"),
    ]
    names = [s.name for s in t.steps]
    assert names == [
        "read_delimited",
        "keep_columns",
        "drop_columns",
        "convert_column_types",
        "filter",
        "extract_columns_from_partition_format",
        "skip",
        "take",
        "take_random_sample",
    ]
    read = t.steps[0].args
    assert (read.delimiter, read.header, read.encoding) == (";", "from_first_file", "ascii")
    assert (read.include_path_column, read.empty_as_string, read.path_column) == (
        True,
        True,
        "Path",
    )
    assert t.steps[1].args == ["col1", "col2", "col3"]
    assert t.steps[2].args == ["col3"]
    assert t.steps[3].args == [
        Conversion(columns=["col1"], column_type="int"),
        Conversion(
            columns=["col2"], column_type="datetime", datetime=DatetimeType(formats=["%d/%m/%Y"])
        ),
        Conversion(
            columns=["col3", "col4"],
            column_type="boolean",
            boolean=BooleanType(
                true_values=["yes", "true", "1"],
                false_values=["no", "false", "0"],
                mismatch_as="error",
            ),
        ),
    ]
    assert t.steps[4].args == fexpr.BoolOp(
        "and",
        fexpr.Compare(">", fexpr.Column("col1"), fexpr.Literal(32)),
        fexpr.Compare("==", fexpr.Column("col7"), fexpr.Literal("a_string")),
    )
    assert t.steps[5].args.columns == (("timestamp", "yyyy/MM/dd"),)
    assert (t.steps[6].args, t.steps[7].args) == (10, 200)
    assert (t.steps[8].args.probability, t.steps[8].args.seed) == (0.5, 1394)
    assert t.file_steps() == []
    assert [s.name for s in t.row_steps()] == names[1:]


def test_parquet_json_and_file_level_steps() -> None:
    t = parse("""\
        paths: [{pattern: "./*.parquet"}]
        transformations:
          - take: 3
          - skip: 1
          - read_parquet
          - take: 5
    """)
    assert [s.name for s in t.file_steps()] == ["take", "skip"]
    assert [s.name for s in t.row_steps()] == ["take"]
    j = parse("""\
        paths: [{file: x.jsonl}]
        transformations:
          - read_json_lines: {invalid_lines: drop, encoding: utf8bom, include_path_column: true}
    """)
    opts = j.steps[0].args
    assert (opts.invalid_lines, opts.encoding, opts.include_path_column) == (
        "drop",
        "utf8bom",
        True,
    )
    only_paths = parse(
        "paths: [{folder: ./}]\ntransformations: [{take_random_sample: {probability: 0.2}}]"
    )
    assert [s.name for s in only_paths.file_steps()] == ["take_random_sample"]
    assert only_paths.steps[0].args.seed is None


def test_partition_format_spellings() -> None:
    for text in (
        "extract_columns_from_partition_format: '{year}/{month}/'",
        "extract_columns_from_partition_format: {partition_format: '{year}/{month}/'}",
    ):
        t = parse(f"paths: [{{folder: ./}}]\ntransformations:\n  - read_parquet\n  - {text}\n")
        assert t.steps[1].args.columns == (("year", None), ("month", None))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "paths: [{file: a.csv}]\ntransformations: [{read_delimited: {delimeter: ','}}]",
            "MLTable /data/t/MLTable: transformations[0].read_delimited: unknown key 'delimeter'",
        ),
        (
            "paths: [{file: a.csv}]\npath: x",
            "MLTable /data/t/MLTable: unknown key 'path' (allowed: paths, transformations, type, $schema)",
        ),
        (
            "paths: [{files: a.csv}]",
            "MLTable /data/t/MLTable: paths[0]: unknown path kind 'files' (allowed: file, folder, pattern)",
        ),
        (
            "paths: [{file: a.csv, folder: b}]",
            "MLTable /data/t/MLTable: paths[0]: expected one of file:, folder:, pattern: with a path, got {'file': 'a.csv', 'folder': 'b'}",
        ),
        (
            "paths: [{pattern: './data/[a-c.csv'}]",
            "MLTable /data/t/MLTable: paths[0].pattern: './data/[a-c.csv': unclosed '[' in character class",
        ),
        (
            "paths: [{pattern: './data/[z-a].csv'}]",
            "MLTable /data/t/MLTable: paths[0].pattern: './data/[z-a].csv': bad range 'z-a' in character class",
        ),
        (
            "paths: [{pattern: './***.csv'}]",
            "MLTable /data/t/MLTable: paths[0].pattern: './***.csv': '***' is not a valid wildcard",
        ),
        (
            "paths: []",
            "MLTable /data/t/MLTable: paths: expected a non-empty list of file:, folder: or pattern: entries",
        ),
        (
            "paths: [{file: a.csv}]\ntransformations: [{shuffle: 3}]",
            "MLTable /data/t/MLTable: transformations[0]: unknown transformation 'shuffle' (known: "
            "convert_column_types, drop_columns, extract_columns_from_partition_format, filter, "
            "keep_columns, read_delimited, read_delta_lake, read_json_lines, read_parquet, sample, "
            "select_partitions, skip, take, take_random_sample)",
        ),
        (
            "paths: [{file: a.csv}]\ntransformations: [{take: -1}]",
            "MLTable /data/t/MLTable: transformations[0].take: expected a non-negative integer, got -1",
        ),
        (
            "paths: [{file: a.csv}]\ntransformations: [{take_random_sample: {probability: 1.5}}]",
            "MLTable /data/t/MLTable: transformations[0].take_random_sample: probability: Input should be less than or equal to 1",
        ),
        (
            "paths: [{file: a.csv}]\ntransformations: [{read_delimited: {header: first}}]",
            "MLTable /data/t/MLTable: transformations[0].read_delimited: header: Input should be "
            "'all_files_same_headers', 'from_first_file', 'all_files_different_headers' or 'no_header'",
        ),
        (
            "paths: [{file: a.csv}]\ntransformations: [{read_delimited: {delimiter: ';;'}}]",
            "MLTable /data/t/MLTable: transformations[0].read_delimited: delimiter: delimiter must be one character, got ';;'",
        ),
        (
            "paths: [{file: a.csv}]\ntransformations: [{convert_column_types: [{columns: a, column_type: number}]}]",
            "MLTable /data/t/MLTable: transformations[0].convert_column_types: [0].column_type: "
            "Input should be 'int', 'float', 'string', 'boolean' or 'datetime'",
        ),
        (
            "paths: [{file: a.csv}]\ntransformations: [{convert_column_types: [{columns: a, type: int}]}]",
            "MLTable /data/t/MLTable: transformations[0].convert_column_types: [0]: unknown key 'type'",
        ),
        (
            "paths: [{file: a.csv}]\ntransformations: [{filter: 'col(\"a\") >'}]",
            "MLTable /data/t/MLTable: transformations[0].filter: unexpected end of expression",
        ),
        (
            "paths: [{file: a.csv}]\ntransformations: [{keep_columns: [a, a]}]",
            "MLTable /data/t/MLTable: transformations[0].keep_columns: duplicate column in ['a', 'a']",
        ),
        (
            "paths: [{file: a.csv}]\ntransformations: [read_parquet, read_delimited]",
            "MLTable /data/t/MLTable: transformations[1]: only one read_* transformation is allowed",
        ),
        (
            "paths: [{file: a.csv}]\ntransformations: [{extract_columns_from_partition_format: '{a}/{a}'}]",
            "MLTable /data/t/MLTable: transformations[0].extract_columns_from_partition_format: '{a}/{a}': column 'a' is empty or repeated",
        ),
        (
            "paths: [{file: a.csv}]\ntransformations: [{keep_columns: [a]}, read_parquet]",
            "MLTable /data/t/MLTable: transformations[0]: keep_columns works on columns: it must come after the read_* transformation",
        ),
        (
            "paths: [{file: a.csv}]\ntransformations: [{filter: 'a > 1'}]",
            "MLTable /data/t/MLTable: transformations[0]: filter works on columns: it must come after a read_* transformation",
        ),
        (
            "- just\n- a list",
            "MLTable /data/t/MLTable: expected a mapping with 'paths' and 'transformations' at the top level",
        ),
        (
            "paths: [{file: a.csv}\n",
            "MLTable /data/t/MLTable: not valid YAML (line 2, column 1): expected ',' or ']', "
            "but got '<stream end>' (while parsing a flow sequence at line 1, column 8)",
        ),
        (
            "type: mltable2\npaths: [{file: a}]",
            "MLTable /data/t/MLTable: type: expected 'mltable', got 'mltable2'",
        ),
    ],
)
def test_malformed_files_exact_errors(text: str, message: str) -> None:
    assert error(text) == message


# -- patterns --------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "matches", "misses"),
    [
        ("data/*.csv", ["data/a.csv", "data/.csv"], ["data/x/a.csv", "data/a.csvx", "dat/a.csv"]),
        ("data/**/*.csv", ["data/a.csv", "data/x/y/a.csv"], ["other/a.csv", "data/a.txt"]),
        ("data/**", ["data/a", "data/x/y"], ["dat/a"]),
        (
            "a/file?.txt",
            ["a/file1.txt", "a/fileZ.txt"],
            ["a/file.txt", "a/file12.txt", "a/file/.txt"],
        ),
        ("a/[abc]-[0-9].bin", ["a/a-0.bin", "a/c-9.bin"], ["a/d-0.bin", "a/a-x.bin"]),
        ("a/[!x]*", ["a/y", "a/yz"], ["a/x", "a/xyz", "a/"]),
        ("a/*/b/*.csv", ["a/1/b/c.csv"], ["a/1/2/b/c.csv", "a/b/c.csv"]),
        ("a+b (1)/$x.csv", ["a+b (1)/$x.csv"], ["aab (1)/$x.csv"]),
    ],
)
def test_glob_semantics(pattern: str, matches: list[str], misses: list[str]) -> None:
    regex = compile_glob(pattern)
    assert [k for k in matches if regex.match(k)] == matches
    assert [k for k in misses if regex.match(k)] == []


def test_fixed_prefix_and_recursion() -> None:
    assert fixed_prefix("logs/2024-*/x.csv") == "logs/2024-"
    assert fixed_prefix("logs/a.csv") == "logs/a.csv"
    assert fixed_prefix("**/*.csv") == ""
    assert needs_recursion("logs/*.csv") is False
    assert needs_recursion("logs/**.csv") is True
    assert needs_recursion("logs/*/x.csv") is True


def test_partition_format_extracts_strings_and_datetimes() -> None:
    fmt = PartitionFormat.parse("/{Department}/{PartitionDate:yyyy/MM/dd}/data.csv")
    assert fmt.extract("root/Accounts/2019/01/01/data.csv") == {
        "Department": "Accounts",
        "PartitionDate": datetime(2019, 1, 1),
    }
    assert fmt.extract("root/Accounts/2019/01/01/other.csv") is None
    folders = PartitionFormat.parse("{year}/{month}/")
    assert folders.extract("/mnt/x/2020/03/part-0.csv") == {"year": "2020", "month": "03"}
    assert PartitionFormat.parse("{ts:yyyy-MM-dd HH}").extract("a/2021-05-06 07") == {
        "ts": datetime(2021, 5, 6, 7)
    }


# -- filter language ---------------------------------------------------------

BATCH = pa.RecordBatch.from_pydict(
    {
        "a": [1, 5, None, 40],
        "name": ["x", "UK", "UK", None],
        "f": [0.5, 1.5, 2.5, None],
        "when": pa.array([datetime(2020, 1, 1), datetime(2021, 6, 1), None, datetime(2024, 1, 1)]),
    }
)


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ('col("a") > 2', [1, 3]),
        ("a >= 5 and name == 'UK'", [1]),
        ('a < 5 or name == "UK"', [0, 1, 2]),
        ("not (a > 2)", [0]),
        ("a is null", [2]),
        ("name is not null and not name != 'UK'", [1, 2]),
        ("f <= 1.5 and a != 5", [0]),
        ("f > 1", [1, 2]),
        ("when >= '2021-01-01'", [1, 3]),
        ("a == 40.0", [3]),
        ("(a > 0) == true", [0, 1, 3]),
        ('NAME == "x" or A IS NULL', []),  # column names are case-sensitive: both unknown
    ],
)
def test_filter_expressions(text: str, kept: list[int]) -> None:
    if text.startswith("NAME"):
        with pytest.raises(fexpr.ExprError, match="no column 'NAME'"):
            fexpr.mask(fexpr.parse(text), BATCH)
        return
    mask = fexpr.mask(fexpr.parse(text), BATCH)
    assert [i for i, v in enumerate(mask.to_pylist()) if v] == kept


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a >", "unexpected end of expression"),
        ("a > 1 )", "unexpected ')' at position 6"),
        ("(a > 1", "expected ')', found the end"),
        ("a = 1", "unexpected '= 1' at position 2"),
        ("col(a) > 1", "col(...) takes a quoted column name (position 0)"),
        ("a is 1", "expected 'null' after 'is' / 'is not'"),
        ("'unterminated", 'unexpected "\'untermina" at position 0'),
        ("__import__('os')", "unexpected '(' at position 10"),
    ],
)
def test_filter_syntax_errors(text: str, message: str) -> None:
    with pytest.raises(fexpr.ExprError) as info:
        fexpr.parse(text)
    assert str(info.value) == message


def test_filter_type_errors() -> None:
    with pytest.raises(fexpr.ExprError, match="cannot compare a string column with 3"):
        fexpr.mask(fexpr.parse("name > 3"), BATCH)
    with pytest.raises(fexpr.ExprError, match="not a condition"):
        fexpr.mask(fexpr.parse("a"), BATCH)
