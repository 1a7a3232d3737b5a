"""Data asset registration: versions, duplicates, concurrent jobs, and the
registered versions seen by the workspace."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from datamount.errors import WorkspaceError
from datamount.workspace.datastores import Workspace, registry_path
from datamount.workspace.registry import next_version, register

pytestmark = pytest.mark.unit

WS = """\
# comments and ${VAR}s stay untouched: registration never rewrites this file
datastores:
  store: {account_name: acct, container_name: c, credentials: {account_key: "${KEY}"}}
data_assets:
  declared:
    - {version: "3", type: uri_folder, path: azureml://datastores/store/paths/d/}
"""
ENV = {"KEY": "a2V5"}


def workspace(tmp_path: Path) -> Workspace:
    path = tmp_path / "ws.yaml"
    if not path.exists():
        path.write_text(WS)
    return Workspace.load(path, ENV)


def test_auto_and_explicit_versions_and_the_workspace_sees_them(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    path = "azureml://datastores/store/paths/out/"
    assert register(ws, "model", None, type_="uri_folder", path=path) == "1"
    assert register(ws, "model", None, type_="uri_folder", path=path + "2/") == "2"
    assert register(ws, "model", "v-final", type_="uri_folder", path=path + "f/") == "v-final"
    assert register(ws, "model", None, type_="uri_folder", path=path + "3/") == "3"
    # Hand-declared versions count: the next one after "3" is "4".
    assert register(ws, "declared", None, type_="uri_folder", path=path) == "4"

    reloaded = workspace(tmp_path)
    assert reloaded.asset("model", "2").path == path + "2/"
    assert reloaded.asset("model", None).version == "3"  # latest: numeric-aware, words first
    assert reloaded.asset("declared", None).version == "4"
    assert (tmp_path / "ws.yaml").read_text() == WS  # the workspace file is never rewritten
    assert registry_path(tmp_path / "ws.yaml", reloaded.config) == tmp_path / "ws.assets.yaml"


def test_duplicate_version_is_refused(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    register(ws, "model", "1", type_="uri_file", path="/data/m.bin")
    with pytest.raises(WorkspaceError, match=r"data asset model:1 is already registered"):
        register(ws, "model", "1", type_="uri_file", path="/data/other.bin")
    with pytest.raises(WorkspaceError, match=r"declared:3 is already registered"):
        register(ws, "declared", "3", type_="uri_folder", path="/data/")
    with pytest.raises(WorkspaceError, match=r"needs a workspace file"):
        register(Workspace.empty(), "model", None, type_="uri_file", path="/x")
    with pytest.raises(WorkspaceError, match=r"not a data asset name"):
        register(ws, "a/b", None, type_="uri_file", path="/x")
    assert [v.version for v in workspace(tmp_path).config.data_assets["model"]] == ["1"]


def test_registry_file_setting_and_corrupt_registry(tmp_path: Path) -> None:
    (tmp_path / "ws.yaml").write_text(WS + "registry_file: reg/assets.yaml\n")
    ws = workspace(tmp_path)
    register(ws, "m", None, type_="uri_file", path="/x")
    assert (tmp_path / "reg" / "assets.yaml").exists()
    (tmp_path / "reg" / "assets.yaml").write_text("data_assets: [1, 2]\n")
    with pytest.raises(WorkspaceError, match=r"asset registry .*assets.yaml: expected"):
        workspace(tmp_path)


def _register_many(ws_path: str, count: int) -> None:
    ws = Workspace.load(Path(ws_path), ENV)
    for _ in range(count):
        register(ws, "shared", None, type_="uri_folder", path="/p/")


def test_concurrent_registrations_are_all_kept(tmp_path: Path) -> None:
    workspace(tmp_path)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_register_many, args=(str(tmp_path / "ws.yaml"), 8)) for _ in "ab"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    versions = [v.version for v in workspace(tmp_path).config.data_assets["shared"]]
    assert versions == [str(n) for n in range(1, 17)]
    assert not list(tmp_path.glob(".ws.assets.yaml.*.tmp"))


def test_next_version() -> None:
    assert next_version([]) == "1"
    assert next_version(["1", "9", "10", "beta"]) == "11"
