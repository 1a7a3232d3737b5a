"""fsspec's `azureml` protocol (entry point `fsspec.specs`) over Azurite:
datastore paths resolved through the workspace, read through adlfs."""

from __future__ import annotations

import io
from pathlib import Path

import fsspec
import pandas as pd
import pytest
from azure.storage.blob import ContainerClient

from azurite import Azurite
from datamount.mltable.fsspec_azureml import AzureMLFileSystem
from mltable_support import azurite_workspace


@pytest.mark.unit
def test_entry_point_registers_the_protocol() -> None:
    assert fsspec.get_filesystem_class("azureml") is AzureMLFileSystem


def test_read_list_and_pandas_through_a_datastore(
    azurite: Azurite, container: ContainerClient
) -> None:
    container.upload_blob("d/a.csv", b"x,y\n1,2\n3,4\n")
    container.upload_blob("d/sub/b.bin", bytes(range(256)) * 4)
    ws = azurite_workspace(azurite.endpoint, azurite.key, {"main": container.container_name})
    with fsspec.open("azureml://datastores/main/paths/d/a.csv", "rb", workspace=ws) as f:
        assert f.read() == b"x,y\n1,2\n3,4\n"
    fs = fsspec.filesystem("azureml", workspace=ws)
    assert sorted(fs.ls("azureml://datastores/main/paths/d/", detail=False)) == [
        "datastores/main/paths/d/a.csv",
        "datastores/main/paths/d/sub",
    ]
    info = fs.info("azureml://datastores/main/paths/d/sub/b.bin")
    assert (info["name"], info["size"], info["type"]) == (
        "datastores/main/paths/d/sub/b.bin",
        1024,
        "file",
    )
    assert fs.cat_file("azureml://datastores/main/paths/d/sub/b.bin", start=250, end=260) == bytes(
        [250, 251, 252, 253, 254, 255, 0, 1, 2, 3]
    )
    assert fs.find("azureml://datastores/main/paths/d") == [
        "datastores/main/paths/d/a.csv",
        "datastores/main/paths/d/sub/b.bin",
    ]
    long_form = (
        "azureml://subscriptions/s/resourcegroups/rg/workspaces/w/datastores/main/paths/d/a.csv"
    )
    assert fs.cat_file(long_form) == b"x,y\n1,2\n3,4\n"
    df = pd.read_csv("azureml://datastores/main/paths/d/a.csv", storage_options={"workspace": ws})
    pd.testing.assert_frame_equal(df, pd.read_csv(io.BytesIO(b"x,y\n1,2\n3,4\n")))
    with pytest.raises(FileNotFoundError):
        fs.cat_file("azureml://datastores/main/paths/d/missing.csv")
    with pytest.raises(PermissionError, match="read-only"):
        fs.open("azureml://datastores/main/paths/d/new.csv", "wb")


def test_workspace_as_a_path_or_a_bad_type(
    azurite: Azurite, container: ContainerClient, tmp_path: Path
) -> None:
    container.upload_blob("p/a.csv", b"x\n1\n")
    ws = tmp_path / "ws.yaml"
    ws.write_text(
        f"datastores:\n  main: {{account_name: {azurite.account}, container_name: "
        f"{container.container_name}, endpoint: '{azurite.endpoint}', "
        f"credentials: {{account_key: '{azurite.key}'}}}}\n"
    )
    for arg in (ws, str(ws)):
        fs = AzureMLFileSystem(workspace=arg, skip_instance_cache=True)
        assert fs.cat_file("azureml://datastores/main/paths/p/a.csv") == b"x\n1\n"
    with pytest.raises(TypeError, match="workspace: expected a datamount Workspace"):
        AzureMLFileSystem(workspace=42, skip_instance_cache=True)
