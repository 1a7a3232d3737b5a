"""The oracle corpus's building blocks: a case (its data files, its MLTable
text, and the difference from Azure ML's mltable it expects, with the
reason) and `write(case, root)`, which puts it in a folder."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


@dataclass(frozen=True)
class Case:
    name: str
    files: dict[str, bytes]
    mltable: str
    differs: frozenset[str] = frozenset()  # e.g. {"values:a", "dtype:a"}
    reason: str = ""  # why datamount differs on purpose (README lists each)


def write(case: Case, root: Path) -> Path:
    folder = root / case.name
    for name, data in case.files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "MLTable").write_text(case.mltable)
    return folder


def table_text(paths: str, *steps: str) -> str:
    text = f"paths:\n{paths}"
    if steps:
        text += "transformations:\n" + "".join(f"  - {s}\n" for s in steps)
    return text


def file_entry(name: str) -> str:
    return f"  - file: ./{name}\n"


def parquet_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()
