"""`datamount.mltable.load`'s `workspace` argument, the way training code calls
it inside a job: a Workspace, a workspace file (str or Path), or None (then
DATAMOUNT_WORKSPACE, else ./configs/workspace.yaml, else none) — over real
Azurite."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from azure.storage.blob import ContainerClient

from azurite import Azurite
from datamount.errors import WorkspaceError
from datamount.mltable import load
from datamount.workspace.datastores import Workspace
from mltable_support import azurite_workspace

MLTABLE = b"paths:\n  - file: ./a.csv\ntransformations:\n  - read_delimited: {}\n"
CSV = b"x,y\n1,2\n3,4\n"
EXPECTED = pd.DataFrame({"x": [1, 3], "y": [2, 4]})
URI = "azureml://datastores/store/paths/tbl/"


@pytest.fixture
def table(container: ContainerClient) -> str:
    container.upload_blob("tbl/MLTable", MLTABLE, overwrite=True)
    container.upload_blob("tbl/a.csv", CSV, overwrite=True)
    return container.container_name


def workspace_file(path: Path, azurite: Azurite, container: str) -> Path:
    """A workspace file whose key comes from ${TEST_KEY} (expanded from os.environ)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "datastores:\n"
        "  store:\n"
        f"    account_name: {azurite.account}\n"
        f"    container_name: {container}\n"
        f"    endpoint: {azurite.endpoint}\n"
        "    credentials: {account_key: '${TEST_KEY}'}\n"
    )
    return path


def frame(workspace: object = None) -> pd.DataFrame:
    return load(URI, workspace).to_pandas_dataframe()  # type: ignore[arg-type]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, azurite: Azurite) -> Path:
    """No DATAMOUNT_WORKSPACE, an empty working directory, TEST_KEY set."""
    monkeypatch.delenv("DATAMOUNT_WORKSPACE", raising=False)
    monkeypatch.setenv("TEST_KEY", azurite.key)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def test_workspace_from_the_environment_variable(
    azurite: Azurite, table: str, clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = workspace_file(clean_env.parent / "elsewhere" / "ws.yaml", azurite, table)
    monkeypatch.setenv("DATAMOUNT_WORKSPACE", str(ws))
    pd.testing.assert_frame_equal(frame(), EXPECTED)
    # The variable wins over ./configs/workspace.yaml, and a missing file it
    # names is an error (not an empty workspace).
    workspace_file(clean_env / "configs" / "workspace.yaml", azurite, "nosuchcontainer")
    pd.testing.assert_frame_equal(frame(), EXPECTED)
    monkeypatch.setenv("DATAMOUNT_WORKSPACE", str(clean_env / "missing.yaml"))
    with pytest.raises(WorkspaceError, match="missing.yaml not found"):
        frame()


def test_workspace_from_the_default_file_else_none(
    azurite: Azurite, table: str, clean_env: Path, tmp_path: Path
) -> None:
    # No variable, no ./configs/workspace.yaml: no workspace, so a datastore
    # path fails, while a local MLTable still loads.
    with pytest.raises(WorkspaceError, match="datastore 'store' is not in the workspace"):
        frame()
    local = tmp_path / "local"
    local.mkdir()
    (local / "MLTable").write_bytes(MLTABLE)
    (local / "a.csv").write_bytes(CSV)
    pd.testing.assert_frame_equal(load(str(local)).to_pandas_dataframe(), EXPECTED)
    pd.testing.assert_frame_equal(load(local).to_pandas_dataframe(), EXPECTED)  # a Path too
    workspace_file(clean_env / "configs" / "workspace.yaml", azurite, table)
    pd.testing.assert_frame_equal(frame(), EXPECTED)


def test_local_mltable_never_reads_the_ambient_workspace(
    azurite: Azurite, clean_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The default workspace is read when a path needs it: a local MLTable of
    # local files loads beside a workspace file it could not expand.
    broken = workspace_file(clean_env / "configs" / "workspace.yaml", azurite, "c")
    monkeypatch.delenv("TEST_KEY")
    local = tmp_path / "local"
    local.mkdir()
    (local / "MLTable").write_bytes(MLTABLE)
    (local / "a.csv").write_bytes(CSV)
    pd.testing.assert_frame_equal(load(local).to_pandas_dataframe(), EXPECTED)
    monkeypatch.setenv("DATAMOUNT_WORKSPACE", str(broken))
    pd.testing.assert_frame_equal(load(local).to_pandas_dataframe(), EXPECTED)
    with pytest.raises(WorkspaceError, match="environment variable TEST_KEY is not set"):
        frame()  # a datastore path needs it
    # A file named by the caller is read (and checked) at once.
    with pytest.raises(WorkspaceError, match="environment variable TEST_KEY is not set"):
        load(local, broken)


def test_workspace_as_a_file_path_or_object(azurite: Azurite, table: str, clean_env: Path) -> None:
    ws = workspace_file(clean_env.parent / "ws.yaml", azurite, table)
    pd.testing.assert_frame_equal(frame(str(ws)), EXPECTED)
    pd.testing.assert_frame_equal(frame(ws), EXPECTED)
    (clean_env / "rel.yaml").write_text(ws.read_text())
    pd.testing.assert_frame_equal(frame("rel.yaml"), EXPECTED)  # relative to the cwd
    obj = azurite_workspace(azurite.endpoint, azurite.key, {"store": table})
    pd.testing.assert_frame_equal(frame(obj), EXPECTED)
    with pytest.raises(WorkspaceError, match="nope.yaml not found"):
        frame(clean_env / "nope.yaml")


class BytesPath:
    def __fspath__(self) -> bytes:
        return b"/ws.yaml"


@pytest.mark.unit
@pytest.mark.parametrize("bad", [42, {"datastores": {}}, b"/ws.yaml", BytesPath()])
def test_workspace_of_another_type_is_a_type_error(bad: object) -> None:
    with pytest.raises(TypeError, match=r"workspace: expected a datamount Workspace, .* got "):
        frame(bad)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("steps", "columns", "rows"),
    [
        (["read_delimited: {}", "take: 0"], ["x", "y"], []),
        (["read_delimited: {}", "skip: 2"], ["x", "y"], []),  # exactly every row
        (["read_delimited: {}", "skip: 9"], ["x", "y"], []),
        (["read_delimited: {}", "skip: 1"], ["x", "y"], [(3, 4)]),
        (["take: 0"], ["Path"], []),  # no read step, no file: still the Path column
    ],
)
def test_an_empty_result_keeps_its_columns(
    tmp_path: Path, steps: list[str], columns: list[str], rows: list[tuple[int, int]]
) -> None:
    (tmp_path / "a.csv").write_bytes(CSV)
    (tmp_path / "MLTable").write_text(
        "paths:\n  - file: ./a.csv\ntransformations:\n" + "".join(f"  - {s}\n" for s in steps)
    )
    df = load(tmp_path, Workspace.empty()).to_pandas_dataframe()
    assert list(df.columns) == columns
    assert list(df.itertuples(index=False, name=None)) == rows
