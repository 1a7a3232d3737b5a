"""The MLTable syntax added to match Azure ML's SDK and runtime (issue 12):
what parses, and one line naming the file and entry for what does not."""

from __future__ import annotations

import re
from datetime import datetime

import pytest

from datamount.mltable import MLTableError, parse_mltable
from datamount.mltable import expr as fexpr
from datamount.mltable.options import InferTypes

pytestmark = pytest.mark.unit

SRC = "/data/t/MLTable"


def steps(text: str):
    return parse_mltable(f"paths: [{{file: a.csv}}]\ntransformations: [{text}]\n", SRC).steps


def test_sdk_keys_parse() -> None:
    (read,) = steps(
        "{read_delimited: {partition_size: 20971520, encoding: windows-1252, "
        "infer_column_types: {sample_size: 10, column_type_overrides: "
        "[{columns: zip, column_type: string}]}}}"
    )
    assert isinstance(read.args.infer_column_types, InferTypes)
    assert [c.columns for c in read.args.overrides] == [["zip"]]
    part, read = steps(
        "{extract_columns_from_partition_format: {partition_format: '/k={k}/a.csv', "
        "ignore_errors: false, path_column: Path}}, read_delimited"
    )
    assert part.name == "extract_columns_from_partition_format" and read.is_read
    (_, keep) = steps("read_parquet, {keep_columns: {pattern: '^a'}}")
    assert isinstance(keep.args, re.Pattern)


def test_filter_datetime_and_startswith() -> None:
    node = fexpr.parse('col("d") >= datetime(2024, 1, 8, 10)')
    assert node == fexpr.Compare(">=", fexpr.Column("d"), fexpr.Literal(datetime(2024, 1, 8, 10)))
    assert fexpr.parse('col("n").startswith("b")') == fexpr.parse('startswith(col("n"), "b")')


@pytest.mark.parametrize(
    ("step", "message"),
    [
        (
            "{read_delimited: {infer_column_types: {sample_size: x}}}",
            "transformations[0].read_delimited: infer_column_types: sample_size: Input "
            "should be a valid integer, unable to parse string as an integer",
        ),
        (
            "read_delimited, {keep_columns: {pattern: '[a'}}",
            "transformations[1].keep_columns: pattern '[a': unterminated character set at "
            "position 0",
        ),
        (
            'read_delimited, {filter: \'col("a").endswith("x")\'}',
            "transformations[1].filter: expected startswith, found 'endswith' at position 9",
        ),
        (
            "read_delimited, {filter: 'datetime(2024, 13, 1) < a'}",
            "transformations[1].filter: datetime(2024, 13, 1): month must be in 1..12",
        ),
        (
            "{extract_columns_from_partition_format: {partition_format: '{x}/', bogus: 1}}, "
            "read_delimited",
            "transformations[0].extract_columns_from_partition_format: unknown key 'bogus'",
        ),
    ],
)
def test_one_line_errors(step: str, message: str) -> None:
    with pytest.raises(MLTableError) as info:
        steps(step)
    assert str(info.value) == f"MLTable {SRC}: {message}"
    assert info.value.exit_code == 2


def test_read_delta_lake_options() -> None:
    (read,) = steps("{read_delta_lake: {version_as_of: 2, include_path_column: false}}")
    assert read.is_read and read.args.version_as_of == 2 and read.args.timestamp_as_of is None
    (read,) = steps("{read_delta_lake: {timestamp_as_of: '2024-01-01T00:00:00+02:00'}}")
    assert read.args.timestamp_as_of == "2024-01-01T00:00:00+02:00"
    for bad, message in [
        ("{version_as_of: 1, timestamp_as_of: '2024-01-01T00:00:00Z'}",
         "give version_as_of or timestamp_as_of, not both"),
        ("{timestamp_as_of: 'yesterday'}", "timestamp_as_of 'yesterday': expected RFC 3339"),
        ("{version_as_of: -1}", "version_as_of"),
    ]:  # fmt: skip
        with pytest.raises(MLTableError) as info:
            steps(f"{{read_delta_lake: {bad}}}")
        text = str(info.value)
        assert text.startswith(f"MLTable {SRC}: transformations[0].read_delta_lake: ")
        assert message in text and "\n" not in text


def test_select_partitions_and_sample_parse() -> None:
    (_, parts) = steps("read_parquet, {select_partitions: [3, 1, 3]}")
    assert parts.args == [1, 3]
    (_, one) = steps("read_parquet, {select_partitions: 2}")
    assert one.args == [2]
    (_, sample) = steps(
        "read_parquet, {sample: {sampler: random_percent, sampler_arguments: "
        "{probability: 0.5, probability_lower_bound: 0.1, seed: 4}}}"
    )
    assert sample.args.sampler_arguments.probability_lower_bound == 0.1
    for bad, message in [
        ("{select_partitions: [-1]}", "expected a partition index or a list of them"),
        ("{select_partitions: []}", "expected a partition index or a list of them"),
        ("{sample: {sampler: random_percent, sampler_arguments: {probability: 0.5}}}",
         "probability_lower_bound"),
        ("{sample: {sampler: stratified, sampler_arguments: "
         "{probability: 0.5, probability_lower_bound: 0}}}", "sampler"),
    ]:  # fmt: skip
        with pytest.raises(MLTableError) as info:
            steps(f"read_parquet, {bad}")
        assert message in str(info.value) and "\n" not in str(info.value)
        assert str(info.value).startswith(f"MLTable {SRC}: transformations[1].")
