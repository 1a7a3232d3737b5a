"""`read_delta_lake` over real Azurite: the log is replayed by `deltalake`,
the data files are read through datamount's stores, partition columns come from the log."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from azure.storage.blob import ContainerClient

from azurite import Azurite
from datamount.errors import DataError
from datamount.mltable import load
from mltable_support import Counts, azurite_workspace, counting_factory

deltalake = pytest.importorskip("deltalake")


def _upload(container: ContainerClient, local: Path, prefix: str) -> None:
    for path in sorted(local.rglob("*")):
        if path.is_file():
            container.upload_blob(
                f"{prefix}/{path.relative_to(local).as_posix()}", path.read_bytes()
            )


def _load(container: ContainerClient, azurite: Azurite, read: str, counts: Counts):
    text = f"paths:\n  - folder: ./t\ntransformations:\n  - {read}\n"
    container.upload_blob("m/MLTable", text.encode(), overwrite=True)
    ws = azurite_workspace(azurite.endpoint, azurite.key, {"main": container.container_name})
    return load("azureml://datastores/main/paths/m/", ws, store_factory=counting_factory(counts))


def test_delta_over_azurite(azurite: Azurite, container: ContainerClient, tmp_path: Path) -> None:
    local = tmp_path / "t"
    deltalake.write_deltalake(
        str(local), pa.table({"k": ["a", "b"], "v": [1, 2]}), partition_by=["k"]
    )
    deltalake.write_deltalake(str(local), pa.table({"k": ["a"], "v": [3]}), mode="append")
    deltalake.write_deltalake(str(local), pa.table({"k": ["c"], "v": [9]}), mode="overwrite")
    _upload(container, local, "m/t")
    counts = Counts()
    latest = _load(container, azurite, "read_delta_lake", counts).to_pandas_dataframe()
    assert latest.to_dict("list") == {"k": ["c"], "v": [9]}
    v1 = _load(container, azurite, "read_delta_lake: {version_as_of: 1}", Counts())
    frame = v1.to_pandas_dataframe().sort_values("v")
    assert frame.to_dict("list") == {"k": ["a", "b", "a"], "v": [1, 2, 3]}
    with_path = _load(
        container, azurite, "read_delta_lake: {include_path_column: true}", Counts()
    ).to_pandas_dataframe()
    assert list(with_path.columns) == ["Path", "k", "v"]
    assert "/m/t/k%3Dc/part-" in with_path["Path"][0]  # the blob's URL, as read_parquet's


def test_not_a_delta_table(azurite: Azurite, container: ContainerClient) -> None:
    container.upload_blob("m/t/a.txt", b"x")
    with pytest.raises(DataError, match=r"read_delta_lake: .*no _delta_log/ in the folder"):
        _load(container, azurite, "read_delta_lake", Counts()).to_pandas_dataframe()


@pytest.mark.unit
def test_delta_eval_layout_round_trip(tmp_path: Path) -> None:
    """eval_download's layout of a Delta table (each file a `file:` entry)
    loads to the same table: the log is found among the files."""
    import shutil

    from datamount.mltable.evaluate import evaluate_table
    from datamount.mltable.tabular import default_store_factory

    table = pa.table({"k": ["a", "b", "a"], "v": [1, 2, 3]})
    deltalake.write_deltalake(str(tmp_path / "src" / "t"), table, partition_by=["k"])
    (tmp_path / "src" / "MLTable").write_text(
        "paths:\n  - folder: ./t\ntransformations:\n  - read_delta_lake\n"
    )
    _, files, text = evaluate_table(str(tmp_path / "src"), None, default_store_factory)
    out = tmp_path / "eval"
    for f in files:
        (out / f.eval_path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f.path, out / f.eval_path)
    (out / "MLTable").write_text(text)
    want = load(str(tmp_path / "src")).to_pandas_dataframe()
    assert load(str(out)).to_pandas_dataframe().to_dict("list") == want.to_dict("list")
    assert sorted(want["v"].tolist()) == [1, 2, 3]
