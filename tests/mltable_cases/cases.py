"""The MLTable oracle corpus: the cases of delimited.py and the ones here
(transformations, conversions, JSON lines, parquet, partitions), each its
data files and its MLTable text (base.py). A case that
datamount reads differently from Azure ML's `mltable` on purpose names the
difference (`differs`: the kinds of difference, as `compare` in
test_mltable_oracle.py reports them) and the reason; the test asserts
exactly that difference. `make_cases.py` writes the corpus to a folder for
review."""

from __future__ import annotations

import pyarrow as pa

from mltable_cases.base import Case, file_entry, parquet_bytes, table_text, write
from mltable_cases.delimited import CSV_DATA, PEOPLE, csv_cases, csv_variants
from mltable_cases.delta import delta_cases
from mltable_cases.sections import section_cases

__all__ = ["CASES", "Case", "write"]

# -- transformations over PEOPLE --------------------------------------------------

STEPS: dict[str, list[str]] = {
    "take": ["take: 2"],
    "take0": ["take: 0"],
    "skip": ["skip: 1"],
    "skip_all": ["skip: 10"],
    "skip_take": ["skip: 1", "take: 2"],
    "keep": ["keep_columns: [name, id]"],
    "keep_one": ["keep_columns: score"],
    "drop": ["drop_columns: [flag, day]"],
    "keep_missing": ["keep_columns: [id, nope]"],
    "drop_missing": ["drop_columns: [nope]"],
    "filter_gt": ["filter: 'col(\"id\") > 2'"],
    "filter_eq_str": ['filter: \'col("name") == "bob"\''],
    "filter_and": ['filter: \'col("id") > 1 and col("score") < 3\''],
    "filter_or": ['filter: \'col("id") == 1 or col("id") == 4\''],
    "filter_not": ["filter: 'not col(\"flag\")'"],
    "filter_bool": ["filter: 'col(\"flag\") == True'"],
    "filter_ne": ['filter: \'col("name") != "ann"\''],
    "filter_null_score": ["filter: 'col(\"score\") >= 2'"],
    "filter_date": ["filter: 'col(\"day\") >= datetime(2024, 1, 8)'"],
    "filter_startswith": ['filter: \'col("name").startswith("b")\''],
    "filter_endswith": ['filter: \'col("name").endswith("e")\''],
    "filter_contains": ['filter: \'col("name").contains("n")\''],
    "filter_missing_col": ["filter: 'col(\"nope\") > 1'"],
    "filter_str_vs_num": ["filter: 'col(\"name\") > 1'"],
    "conv_int_to_float": ["convert_column_types: [{columns: id, column_type: float}]"],
    "conv_float_to_int": ["convert_column_types: [{columns: score, column_type: int}]"],
    "conv_to_string": ["convert_column_types: [{columns: [id, score], column_type: string}]"],
    "conv_bool": ["convert_column_types: [{columns: flag, column_type: boolean}]"],
    "conv_missing": ["convert_column_types: [{columns: nope, column_type: int}]"],
    "conv_datetime_fmt": [
        "convert_column_types: [{columns: day, column_type: {datetime: {formats: ['%Y-%m-%d']}}}]"
    ],
    "keep_then_filter": ["keep_columns: [id, name]", "filter: 'col(\"id\") < 3'"],
    "filter_then_take": ["filter: 'col(\"id\") > 1'", "take: 1"],
}


NAMES = b"n,k\nbob,1\nann,2\nbea,3\n"
NAME_STEPS: dict[str, list[str]] = {
    "startswith": ['filter: \'col("n").startswith("b")\''],
    "startswith_call": ['filter: \'startswith(col("n"), "a")\''],
    "startswith_and": ['filter: \'col("n").startswith("b") and col("k") > 1\''],
    "keep_pattern": ["keep_columns: {pattern: '^n'}"],
    "keep_pattern_search": ["keep_columns: {pattern: 'k'}"],
    "drop_pattern": ["drop_columns: {pattern: 'n'}"],
    "keep_list_order": ["keep_columns: [k, n]"],
}


def _step_cases() -> list[Case]:
    return [
        Case(f"step_{name}", {"d.csv": PEOPLE},
             table_text(file_entry("d.csv"), "read_delimited", *steps))
        for name, steps in STEPS.items()
    ] + [
        Case(f"names_{name}", {"d.csv": NAMES},
             table_text(file_entry("d.csv"), "read_delimited", *steps))
        for name, steps in NAME_STEPS.items()
    ]  # fmt: skip


TEXT_COLS = b"s,i,f,b\nyes,9.5,1.5,maybe\nno,7,x,true\n,3,2,false\n"
CONVERSIONS: dict[str, str] = {
    "int_of_9_5": "{columns: i, column_type: int}",
    "float_of_x": "{columns: f, column_type: float}",
    "bool_default_mismatch": "{columns: b, column_type: boolean}",
    "bool_mismatch_false": "{columns: b, column_type: {boolean: {mismatch_as: 'false'}}}",
    "bool_mismatch_true": "{columns: b, column_type: {boolean: {mismatch_as: 'true'}}}",
    "bool_custom_values": (
        "{columns: s, column_type: {boolean: {true_values: ['yes'], false_values: ['no']}}}"
    ),
    "bool_custom_mismatch_error": (
        "{columns: b, column_type: {boolean: {true_values: ['true'], false_values: ['false'], "
        "mismatch_as: error}}}"
    ),
}


def _conversion_cases() -> list[Case]:
    step = "read_delimited: {infer_column_types: false}"
    return [
        Case(f"conv_{name}", {"d.csv": TEXT_COLS},
             table_text(file_entry("d.csv"), step, f"convert_column_types: [{conv}]"))
        for name, conv in CONVERSIONS.items()
    ]  # fmt: skip


# -- JSON lines -------------------------------------------------------------------

JSON_DATA: dict[str, bytes] = {
    "basic": b'{"a": 1, "b": "x"}\n{"a": 2, "b": "y"}\n',
    "later_keys": b'{"a": 1}\n{"a": 2, "b": "x"}\n{"c": 1.5}\n',
    "nulls": b'{"a": 1, "b": null}\n{"a": null, "b": "y"}\n',
    "int_then_float": b'{"v": 1}\n{"v": 2.5}\n',
    "bools": b'{"f": true}\n{"f": false}\n',
    "unicode": '{"name": "Zoë"}\n{"name": "東京"}\n'.encode(),
    "blank_lines": b'{"a": 1}\n\n{"a": 2}\n',
    "key_order": b'{"b": 1, "a": 2}\n{"a": 3, "b": 4}\n',
    "strings_numbers_like": b'{"z": "00501"}\n{"z": "1e3"}\n',
    "date_strings": b'{"d": "2024-01-01"}\n{"d": "2024-02-03"}\n',
}
JSON_INVALID = b'{"a": 1}\nnot json\n{"a": 3}\n'


def _json_cases() -> list[Case]:
    one = file_entry("d.jsonl")
    out = [
        Case(f"json_{name}", {"d.jsonl": data}, table_text(one, "read_json_lines"))
        for name, data in JSON_DATA.items()
    ]
    out += [
        Case("json_invalid_drop", {"d.jsonl": JSON_INVALID},
             table_text(one, "read_json_lines: {invalid_lines: drop}")),
        Case("json_invalid_error", {"d.jsonl": JSON_INVALID}, table_text(one, "read_json_lines")),
        Case("json_path_column", {"d.jsonl": JSON_DATA["basic"]},
             table_text(one, "read_json_lines: {include_path_column: true}")),
        Case("json_take_filter", {"d.jsonl": JSON_DATA["basic"]},
             table_text(one, "read_json_lines", "filter: 'col(\"a\") > 1'")),
        Case("json_two_files", {"d/a.jsonl": b'{"a": 1}\n', "d/b.jsonl": b'{"a": 2, "b": "x"}\n'},
             table_text("  - folder: ./d\n", "read_json_lines")),
    ]  # fmt: skip
    return out


# -- parquet ----------------------------------------------------------------------


def _parquet_cases() -> list[Case]:
    import datetime as dt

    tables = {
        "ints": pa.table({"a": pa.array([1, 2, None], pa.int64()), "b": pa.array([1, 2, 3], pa.int32())}),
        "floats": pa.table({"f": pa.array([1.5, None], pa.float64()), "g": pa.array([1.0, 2.0], pa.float32())}),
        "strings": pa.table({"s": ["x", None, "z"]}),
        "bools": pa.table({"b": [True, False, None]}),
        "timestamps_us": pa.table({"t": pa.array([dt.datetime(2024, 1, 1, 10)], pa.timestamp("us"))}),
        "timestamps_ns": pa.table({"t": pa.array([dt.datetime(2024, 1, 1, 10)], pa.timestamp("ns"))}),
        "dates": pa.table({"d": pa.array([dt.date(2024, 1, 1)], pa.date32())}),
        "many_cols": pa.table({f"c{i}": [i] for i in range(12)}),
    }  # fmt: skip
    one = file_entry("d.parquet")
    out = [
        Case(f"parquet_{name}", {"d.parquet": parquet_bytes(t)}, table_text(one, "read_parquet"))
        for name, t in tables.items()
    ]
    two = {
        "d/a.parquet": parquet_bytes(tables["ints"]),
        "d/b.parquet": parquet_bytes(tables["ints"]),
    }
    out += [
        Case("parquet_two_files", two, table_text("  - folder: ./d\n", "read_parquet")),
        Case("parquet_path_column", {"d.parquet": parquet_bytes(tables["strings"])},
             table_text(one, "read_parquet: {include_path_column: true}")),
        Case("parquet_keep_take", {"d.parquet": parquet_bytes(tables["many_cols"])},
             table_text(one, "read_parquet", "keep_columns: [c3, c1]", "take: 1")),
    ]  # fmt: skip
    return out


# -- partitions ---------------------------------------------------------------------


def _partition_cases() -> list[Case]:
    files = {"data/x=1/a.csv": b"v\n1\n", "data/x=2/a.csv": b"v\n2\n"}
    pattern = "  - pattern: ./data/**/*.csv\n"
    return [
        Case("partition_after_read", files,
             table_text(pattern, "read_delimited",
                      "extract_columns_from_partition_format: '/data/x={x}/a.csv'")),
        Case("partition_before_read", files,
             table_text(pattern, "extract_columns_from_partition_format: "
                               "{partition_format: '/data/x={x}/a.csv', ignore_errors: false, "
                               "path_column: Path}",
                      "read_delimited")),
    ]  # fmt: skip


# -- the differences, each with its reason ------------------------------------------
# "deliberate: ..." datamount keeps its behaviour on purpose (the real package
# loses or invents data, or is stricter for no gain); README lists each.
# "not yet: ..." a gap datamount has still to close (README: not supported yet).
# "both reject: ..." neither reads it (asserted, so that no case passes by
# failing twice unnoticed).

STREAM_INFO = (
    "deliberate: a stream_info value (a paths-only table's Path) is the file's URI as "
    "text (the real package's StreamInfo object needs its runtime to open)"
)
NO_COLUMNS = "deliberate: a table with no rows keeps its columns (the real package drops them)"
DIFFERENCES: dict[str, tuple[set[str], str]] = {
    "csv_default_header_only": ({"columns"}, NO_COLUMNS),
    "step_take0": ({"columns"}, NO_COLUMNS),
    "step_skip_all": ({"columns"}, NO_COLUMNS),
    "encoding_utf8bom": ({"error:mltable"},
                         "deliberate: datamount also takes the spelling utf8bom (and utf32)"),
    "encoding_utf8_bom_spelt": ({"error:mltable"},
        "deliberate: 'utf8 bom' reads (the real package's schema lists it, its reader "
        "rejects it)"),
    "files_named_twice": ({"rows"},
        "deliberate: a file named twice is read once (the real package repeats its rows)"),
    "files_paths_only": ({"dtype:Path", "values:Path"},
        STREAM_INFO),
    "step_filter_missing_col": ({"error:datamount"},
        "deliberate: a filter on a missing column is an error (the real package "
        "returns an empty table without columns)"),
    "step_filter_str_vs_num": ({"error:datamount"},
        "deliberate: comparing text with a number is an error (the real package "
        "keeps every non-null text)"),
    "conv_bool_default_mismatch": ({"error:datamount"},
        "deliberate: a value outside true_values/false_values is an error unless "
        "mismatch_as says (the real package nulls it)"),
    "conv_bool_custom_mismatch_error": ({"error:datamount"},
        "deliberate: mismatch_as: error is an error (the real package nulls the value)"),
    "json_int_then_float": ({"values:v"},
        "deliberate: a JSON value of another type than the first line's is kept "
        "(the real package nulls 2.5 after 1)"),
    "json_two_files": ({"values:a", "values:b"},
        "deliberate: rows stay in file order (the real package reorders files whose "
        "keys differ)"),
    "partition_after_read": ({"error:mltable"},
        "deliberate: the docs' string form of extract_columns_from_partition_format "
        "is accepted"),
    "partition_before_read": ({"dtype:x", "values:x"},
        "deliberate: partition values stay the path's text (the real package types "
        "them: 01 would become 1)"),
    "step_filter_startswith": ({"error:mltable"},
        "deliberate: startswith on a null is unknown and drops the row (the real "
        "package fails on the first null)"),
    "delim_multi_char": ({"error:datamount"},
        "deliberate: a multi-character delimiter is an error (the real package splits "
        "at each character and invents an empty column)"),
    "row_sample": ({"values:id", "values:name", "values:score", "values:flag", "values:day"},
        "deliberate: a row-level take_random_sample draws other rows than Azure ML's "
        "(a seeded numpy generator: the same seed keeps the same rows; Azure ML's "
        "generator is its runtime's own)"),
    "conv_stream_info": ({"error:datamount"},
        "deliberate: convert_column_types to stream_info is an error (the real package "
        "nulls every text value)"),
    "conv_datetime_default": ({"error:mltable"},
        "deliberate: column_type: datetime without formats reads ISO 8601"),
    "filter_is_not_null": ({"error:mltable"},
        "deliberate: datamount's filters also take `is null` / `is not null`"),
    "late_odd_beyond_sample": ({"dtype:n", "values:n", "dtype:m", "values:m"},
        "deliberate: a value past the rows the types were inferred from keeps its "
        "data: `bad` stays text, `1.5` makes the column float (the real package "
        "nulls `bad` and truncates 1.5 to 1)"),
    "step_filter_endswith": ({"error:both"}, "both reject: endswith in a filter"),
    "step_filter_contains": ({"error:both"}, "both reject: contains in a filter"),
    "json_invalid_error": ({"error:both"}, "both reject: an invalid line by default"),
    "parts_one": ({"error:mltable"},
        "deliberate: select_partitions takes one index as well as a list (as the SDK's "
        "select_partitions(1) does; the real package's schema wants a list)"),
    "parts_past_end": ({"error:both"}, "both reject: a partition past the table's last"),
    "sample_random_percent": ({"rows"},
        "deliberate: `sample` draws other rows than Azure ML's runtime (a seeded numpy "
        "generator, as take_random_sample)"),
    "sample_no_lower_bound": ({"error:both"},
        "both reject: sample without probability_lower_bound"),
    "delta_partitioned": ({"columns"},
        "deliberate: a partitioned Delta table keeps its partition columns (the real "
        "package drops them)"),
    "delta_version_missing": ({"error:both"}, "both reject: a version the table has not reached"),
    "delta_not_a_table": ({"error:both"}, "both reject: a folder without _delta_log"),
}  # fmt: skip


# -- more: sections, sampling, nested JSON, parquet with steps -----------------------


def _more_cases() -> list[Case]:
    one = file_entry("d.csv")
    pq_one = file_entry("d.parquet")
    table = pa.table({"k": [1, 2, 3, 4], "s": ["a", "b", None, "d"], "f": [0.5, 1.5, 2.5, None]})
    nested = b'{"o": {"x": 1}, "l": [1, 2]}\n{"o": {"x": 2}, "l": []}\n'
    return [
        Case("delim_multi_char", {"d.csv": b"a||b\n1||x\n"},
             table_text(one, "read_delimited: {delimiter: '||'}")),
        Case("section_traits", {"d.csv": CSV_DATA["basic"]},
             table_text(one, "read_delimited") + "traits:\n  index_columns: [a]\n"),
        Case("section_metadata", {"d.csv": CSV_DATA["basic"]},
             "type: mltable\n" + table_text(one, "read_delimited")),
        Case("row_sample", {"d.csv": PEOPLE},
             table_text(one, "read_delimited", "take_random_sample: {probability: 0.5, seed: 3}")),
        Case("conv_stream_info", {"d.csv": CSV_DATA["basic"]},
             table_text(one, "read_delimited",
                      "convert_column_types: [{columns: b, column_type: stream_info}]")),
        Case("conv_datetime_default", {"d.csv": b"d\n2024-01-01 10:00:00\nnope\n"},
             table_text(one, "read_delimited: {infer_column_types: false}",
                      "convert_column_types: [{columns: d, column_type: datetime}]")),
        Case("conv_float_of_text", {"d.csv": b"v\n1.5\n1e3\n-2\nx\n"},
             table_text(one, "read_delimited: {infer_column_types: false}",
                      "convert_column_types: [{columns: v, column_type: float}]")),
        Case("conv_int_negative_decimal", {"d.csv": b"v\n-9.5\n7\n"},
             table_text(one, "read_delimited: {infer_column_types: false}",
                      "convert_column_types: [{columns: v, column_type: int}]")),
        Case("json_nested", {"d.jsonl": nested}, table_text(file_entry("d.jsonl"), "read_json_lines")),
        Case("parquet_filter", {"d.parquet": parquet_bytes(table)},
             table_text(pq_one, "read_parquet", "filter: 'col(\"k\") >= 2'")),
        Case("filter_is_not_null", {"d.parquet": parquet_bytes(table)},
             table_text(pq_one, "read_parquet", "filter: 's is not null'")),
        Case("parquet_convert", {"d.parquet": parquet_bytes(table)},
             table_text(pq_one, "read_parquet",
                      "convert_column_types: [{columns: k, column_type: string}, "
                      "{columns: f, column_type: int}]")),
        Case("parquet_drop_skip_take", {"d.parquet": parquet_bytes(table)},
             table_text(pq_one, "read_parquet", "drop_columns: s", "skip: 1", "take: 2")),
        Case("noheader_two_files", {"d/a.csv": b"1,x\n", "d/b.csv": b"2,y\n"},
             table_text("  - folder: ./d\n", "read_delimited: {header: no_header}")),
        Case("first_file_dup_headers", {"d/a.csv": b"a,a\n1,2\n", "d/b.csv": b"3,4\n"},
             table_text("  - folder: ./d\n", "read_delimited: {header: from_first_file}")),
        Case("late_odd_beyond_sample",
             {"d.csv": b"n,m\n" + b"".join(b"%d,%d\n" % (i, i) for i in range(1000))
              + b"bad,1.5\n"},
             table_text(one, "read_delimited")),
        Case("file_level_skip", {"d/a.csv": b"a\n1\n", "d/b.csv": b"a\n2\n"},
             table_text("  - folder: ./d\n", "skip: 1", "read_delimited")),
    ]  # fmt: skip


def all_cases() -> list[Case]:
    cases = [
        *_more_cases(),
        *csv_cases(),
        *csv_variants(),
        *_step_cases(),
        *_conversion_cases(),
        *_json_cases(),
        *_parquet_cases(),
        *_partition_cases(),
        *delta_cases(),
        *section_cases(),
    ]
    names = {c.name for c in cases}
    unknown = set(DIFFERENCES) - names
    assert not unknown, f"DIFFERENCES names no case: {sorted(unknown)}"
    return [
        Case(c.name, c.files, c.mltable, frozenset(DIFFERENCES[c.name][0]),
             DIFFERENCES[c.name][1]) if c.name in DIFFERENCES else c
        for c in cases
    ]  # fmt: skip


CASES = all_cases()
