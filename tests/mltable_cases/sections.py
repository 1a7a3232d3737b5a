"""Oracle cases for `select_partitions` (a partition: a parquet row group, a
`partition_size` byte range of delimited text, each row in the range its first
byte is in), the `sample` transformation and the `traits` section. Files are
named one by one in `paths` (a folder's order would be the file system's:
Azure ML lists a local folder unsorted)."""

from __future__ import annotations

import pyarrow as pa

from mltable_cases.base import Case, file_entry, table_text

THREE = {f"f{i}.csv": b"a,b\n%d,x%d\n%d,y%d\n" % (i, i, i * 10, i) for i in range(3)}
THREE_PATHS = "".join(file_entry(name) for name in THREE)
LONG = b"n,s\n" + b"".join(b"%d,row%d\n" % (i, i) for i in range(3000))  # ~30 KB


def _grouped() -> bytes:
    import io

    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pa.table({"k": list(range(10))}), sink, row_group_size=3)
    return sink.getvalue()


def section_cases() -> list[Case]:
    grouped = {"d.parquet": _grouped()}
    long = {"d.csv": LONG}
    return [
        Case("parts_files", THREE, table_text(THREE_PATHS, "read_delimited",
                                               "select_partitions: [0, 2]")),
        Case("parts_one", THREE, table_text(THREE_PATHS, "read_delimited", "select_partitions: 1")),
        Case("parts_unsorted", THREE, table_text(THREE_PATHS, "read_delimited",
                                                  "select_partitions: [2, 0]")),
        Case("parts_past_end", THREE, table_text(THREE_PATHS, "read_delimited",
                                                  "select_partitions: [3]")),
        Case("parts_row_groups", grouped, table_text(file_entry("d.parquet"), "read_parquet",
                                                     "select_partitions: [1, 3]")),
        Case("parts_after_filter", grouped, table_text(file_entry("d.parquet"), "read_parquet",
                                                       "filter: 'k > 4'", "select_partitions: [1, 2]")),
        Case("parts_bytes", long, table_text(file_entry("d.csv"),
                                             "read_delimited: {partition_size: 8192}",
                                             "select_partitions: [1, 3]")),
        Case("parts_bytes_default", long, table_text(file_entry("d.csv"), "read_delimited",
                                                     "select_partitions: [0]")),
        Case("sample_random_percent", long, table_text(file_entry("d.csv"), "read_delimited",
             "sample: {sampler: random_percent, sampler_arguments: {probability: 0.5, seed: 7, "
             "probability_lower_bound: 0.0}}")),
        Case("sample_no_lower_bound", long, table_text(file_entry("d.csv"), "read_delimited",
             "sample: {sampler: random_percent, sampler_arguments: {probability: 0.5, seed: 7}}")),
        Case("sample_all", long, table_text(file_entry("d.csv"), "read_delimited",
             "sample: {sampler: randomPercent, sampler_arguments: {probability: 1.0, seed: 1, "
             "probability_lower_bound: 0.0}}")),
        Case("traits_both", long, table_text(file_entry("d.csv"), "read_delimited",
                                             "drop_columns: s")
             + "traits:\n  timestamp_column: n\n  index_columns: [n]\n"),
    ]  # fmt: skip
