"""Hugging Face `datasets` streaming CSV, parquet and JSON lines from
`azureml://` paths over Azurite, through datamount's fsspec protocol."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from azure.storage.blob import ContainerClient

from azurite import Azurite

pytestmark = pytest.mark.azurite

ROWS = [{"id": i, "text": f"row {i}"} for i in range(25)]


def parquet_bytes(rows: list[dict]) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), sink, row_group_size=10)
    return sink.getvalue()


def workspace_file(tmp_path: Path, azurite: Azurite, container: str) -> Path:
    ws = tmp_path / "workspace.yaml"
    ws.write_text(
        "datastores:\n"
        f"  main: {{account_name: {azurite.account}, container_name: {container}, "
        f"endpoint: '{azurite.endpoint}', credentials: {{account_key: '{azurite.key}'}}}}\n"
    )
    return ws


@pytest.mark.parametrize("builder", ["csv", "json", "parquet"])
def test_load_dataset_streams_from_azureml_paths(
    azurite: Azurite,
    container: ContainerClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    builder: str,
) -> None:
    datasets = pytest.importorskip("datasets")  # here, not at collection (`-m unit` collects)
    halves = [ROWS[:12], ROWS[12:]]
    ext = {"csv": "csv", "json": "jsonl", "parquet": "parquet"}[builder]
    for n, part in enumerate(halves):
        if builder == "csv":
            body = ("id,text\n" + "".join(f"{r['id']},{r['text']}\n" for r in part)).encode()
        elif builder == "json":
            body = "".join(json.dumps(r) + "\n" for r in part).encode()
        else:
            body = parquet_bytes(part)
        container.upload_blob(f"hf/{builder}/part-{n}.{ext}", body)
    # The workspace file through storage_options: fsspec caches filesystem
    # instances by their arguments, so a per-test file keeps the tests apart.
    options = {"workspace": str(workspace_file(tmp_path, azurite, container.container_name))}
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))

    files = [f"azureml://datastores/main/paths/hf/{builder}/part-{n}.{ext}" for n in range(2)]
    ds = datasets.load_dataset(
        builder, data_files=files, split="train", streaming=True, storage_options=options
    )
    assert list(ds) == ROWS
    # a glob over the folder, as a training script writes it
    glob = f"azureml://datastores/main/paths/hf/{builder}/*.{ext}"
    ds = datasets.load_dataset(
        builder, data_files={"train": glob}, split="train", streaming=True, storage_options=options
    )
    assert sorted((r["id"], r["text"]) for r in ds) == [(r["id"], r["text"]) for r in ROWS]
