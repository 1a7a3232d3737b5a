"""Workspace registry: loading, ${VAR} expansion, and resolution of every path
form through datastores, accounts and versioned data assets (no network)."""

from pathlib import Path

import pytest

from datamount.errors import WorkspaceError
from datamount.jobspec.uris import parse
from datamount.storage.credentials import CredentialKind
from datamount.storage.location import StorageKind
from datamount.workspace.datastores import Workspace, find_workspace, version_key

pytestmark = pytest.mark.unit

KEY = "c2VjcmV0LWtleS1mb3ItdGVzdHM="
SAS = "sv=2024-05-04&ss=b&sig=AbCdEf%2Bsecret"
ENV = {"AZ_KEY": KEY, "AZ_SAS": SAS}

WORKSPACE = """
datastores:
  workspaceblobstore:
    type: azure_blob
    account_name: devstoreaccount1
    container_name: data
    endpoint: http://127.0.0.1:10000/devstoreaccount1
    credentials: {account_key: "${AZ_KEY}"}
  lake:
    type: azure_data_lake_gen2
    account_name: lakeacct
    filesystem: events
    credentials: {sas_token: "${AZ_SAS}"}
  public:
    account_name: pandemicdatalake
    container_name: public
accounts:
  devstoreaccount1: {endpoint: http://127.0.0.1:10000/devstoreaccount1, account_key: "${AZ_KEY}"}
  sasacct: {sas_token: "${AZ_SAS}"}
data_assets:
  titanic:
    - {version: "1", type: uri_file, path: azureml://datastores/workspaceblobstore/paths/titanic.csv}
    - {version: "2", type: uri_file, path: azureml://datastores/workspaceblobstore/paths/t2.csv}
    - {version: "10", type: uri_file, path: azureml://datastores/workspaceblobstore/paths/t10.csv}
  alias:
    - {version: "1", type: uri_file, path: "azureml:titanic:2"}
  loop:
    - {version: "1", type: uri_folder, path: "azureml:loop:1"}
  lakefolder:
    - {version: "1", type: uri_folder, path: "abfss://events@lakeacct.dfs.core.windows.net/2024/"}
"""


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    path = tmp_path / "workspace.yaml"
    path.write_text(WORKSPACE)
    return Workspace.load(path, ENV)


def resolve(ws: Workspace, raw: str, **kw):  # noqa: ANN201
    return ws.resolve(parse(raw), **kw)


def test_datastore_blob(ws: Workspace) -> None:
    loc = resolve(ws, "azureml://datastores/workspaceblobstore/paths/cifar/")
    assert loc.kind is StorageKind.BLOB
    assert (loc.account, loc.container, loc.path) == ("devstoreaccount1", "data", "cifar/")
    assert loc.endpoint == "http://127.0.0.1:10000/devstoreaccount1"
    assert loc.credential.kind is CredentialKind.ACCOUNT_KEY
    assert loc.credential.secret is not None and loc.credential.secret.reveal() == KEY
    assert loc.uri() == "http://127.0.0.1:10000/devstoreaccount1/data/cifar/"


def test_long_datastore_form(ws: Workspace) -> None:
    raw = "azureml://subscriptions/s/resourcegroups/rg/workspaces/w/datastores/workspaceblobstore/paths/a b.csv"
    assert resolve(ws, raw).uri() == "http://127.0.0.1:10000/devstoreaccount1/data/a%20b.csv"


def test_datastore_adls_prints_abfss(ws: Workspace) -> None:
    loc = resolve(ws, "azureml://datastores/lake/paths/2024/01/")
    assert loc.kind is StorageKind.ADLS
    assert loc.endpoint == "https://lakeacct.blob.core.windows.net"
    assert loc.credential.kind is CredentialKind.SAS
    assert loc.uri() == "abfss://events@lakeacct.dfs.core.windows.net/2024/01/"


def test_datastore_without_credentials_is_anonymous(ws: Workspace) -> None:
    loc = resolve(ws, "azureml://datastores/public/paths/covid/")
    assert loc.credential.kind is CredentialKind.ANONYMOUS
    assert loc.uri() == "https://pandemicdatalake.blob.core.windows.net/public/covid/"


def test_wasbs_uses_accounts_section(ws: Workspace) -> None:
    loc = resolve(ws, "wasbs://other@devstoreaccount1.blob.core.windows.net/x.bin")
    assert loc.endpoint == "http://127.0.0.1:10000/devstoreaccount1"
    assert loc.credential.kind is CredentialKind.ACCOUNT_KEY
    assert loc.uri() == "http://127.0.0.1:10000/devstoreaccount1/other/x.bin"
    sas = resolve(ws, "https://sasacct.blob.core.windows.net/cont1/y")
    assert sas.credential.kind is CredentialKind.SAS
    assert sas.uri() == "https://sasacct.blob.core.windows.net/cont1/y"


def test_unknown_account_is_anonymous_default_endpoint(ws: Workspace) -> None:
    loc = resolve(ws, "wasbs://cont1@someacct.blob.core.usgovcloudapi.net/a/")
    assert loc.endpoint == "https://someacct.blob.core.usgovcloudapi.net"
    assert loc.credential.kind is CredentialKind.ANONYMOUS
    # wasb:// (and abfs://) are read over HTTPS too, as Azure ML does (issue 17:
    # accounts refuse plain HTTP by default); it was http:// before.
    plain = resolve(ws, "wasb://cont1@someacct.blob.core.windows.net/a")
    assert plain.endpoint == "https://someacct.blob.core.windows.net"
    assert plain.uri() == "https://someacct.blob.core.windows.net/cont1/a"
    lake = resolve(ws, "abfs://fs1@someacct.dfs.core.windows.net/a")
    assert lake.endpoint == "https://someacct.blob.core.windows.net"
    assert lake.uri() == "abfss://fs1@someacct.dfs.core.windows.net/a"


def test_abfss_uri_borrows_matching_datastore_credential(ws: Workspace) -> None:
    loc = resolve(ws, "abfss://events@lakeacct.dfs.core.windows.net/raw/")
    assert loc.kind is StorageKind.ADLS
    assert loc.credential.kind is CredentialKind.SAS
    assert loc.uri() == "abfss://events@lakeacct.dfs.core.windows.net/raw/"


def test_url_under_configured_endpoint_is_blob(ws: Workspace) -> None:
    loc = resolve(ws, "http://127.0.0.1:10000/devstoreaccount1/data/dir/f.csv")
    assert loc.kind is StorageKind.BLOB
    assert (loc.container, loc.path) == ("data", "dir/f.csv")
    assert loc.credential.kind is CredentialKind.ACCOUNT_KEY


def test_public_http_file(ws: Workspace) -> None:
    loc = resolve(ws, "https://example.com/iris.csv")
    assert loc.kind is StorageKind.HTTP
    assert loc.uri() == "https://example.com/iris.csv"


def test_local_relative_resolves_against_base(ws: Workspace, tmp_path: Path) -> None:
    loc = resolve(ws, "./data/train/", base_dir=tmp_path)
    assert loc.kind is StorageKind.LOCAL
    assert loc.uri() == f"{tmp_path}/data/train/"
    assert resolve(ws, "/abs/x.csv").uri() == "/abs/x.csv"
    # A relative base (a spec named by a relative path) still gives an absolute path.
    assert resolve(ws, "./t/", base_dir=Path("configs")).uri() == f"{Path.cwd()}/configs/t/"


def test_asset_versions_and_latest(ws: Workspace) -> None:
    assert resolve(ws, "azureml:titanic:1").path == "titanic.csv"
    assert resolve(ws, "azureml:titanic:2").path == "t2.csv"
    assert resolve(ws, "azureml:titanic@latest").path == "t10.csv"  # numeric-aware: 10 > 2
    long = "azureml://subscriptions/s/resourcegroups/rg/workspaces/w/data/titanic/versions/2"
    assert resolve(ws, long).path == "t2.csv"


def test_asset_resolves_recursively(ws: Workspace) -> None:
    assert resolve(ws, "azureml:alias:1").path == "t2.csv"
    lake = resolve(ws, "azureml:lakefolder@latest")
    assert lake.uri() == "abfss://events@lakeacct.dfs.core.windows.net/2024/"


def test_asset_cycle(ws: Workspace) -> None:
    with pytest.raises(WorkspaceError, match=r"inputs.a.path: data asset cycle: loop:1 -> loop:1"):
        resolve(ws, "azureml:loop:1", where="inputs.a.path")


def test_asset_type_mismatch(ws: Workspace) -> None:
    with pytest.raises(
        WorkspaceError, match="titanic:1 is a uri_file, but the spec declares type uri_folder"
    ):
        resolve(ws, "azureml:titanic:1", expected_type="uri_folder")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            "azureml://datastores/nope/paths/x",
            "inputs.a.path: datastore 'nope' is not in the workspace (datastores: lake, public, workspaceblobstore)",
        ),
        (
            "azureml:missing:1",
            "inputs.a.path: data asset 'missing' is not registered in the workspace "
            "(registered: alias, lakefolder, loop, titanic)",
        ),
        (
            "azureml:titanic:3",
            "inputs.a.path: data asset 'titanic' has no version '3' (versions: 1, 2, 10)",
        ),
    ],
)
def test_missing_things(ws: Workspace, raw: str, message: str) -> None:
    with pytest.raises(WorkspaceError) as info:
        resolve(ws, raw, where="inputs.a.path")
    assert str(info.value) == message


def test_identity_replaces_stored_credentials(ws: Workspace) -> None:
    user = resolve(ws, "azureml://datastores/workspaceblobstore/paths/x", identity="user_identity")
    assert user.credential.kind is CredentialKind.USER_IDENTITY
    assert user.credential.secret is None
    managed = resolve(
        ws,
        "wasbs://cont1@acct1.blob.core.windows.net/x",
        identity="managed_identity",
        client_id="abc",
    )
    assert managed.credential.kind is CredentialKind.MANAGED_IDENTITY
    assert managed.credential.client_id == "abc"
    token = resolve(ws, "azureml://datastores/workspaceblobstore/paths/x", identity="aml_token")
    assert token.credential.kind is CredentialKind.ACCOUNT_KEY


def test_missing_env_var_is_clear(tmp_path: Path) -> None:
    path = tmp_path / "ws.yaml"
    path.write_text(WORKSPACE)
    with pytest.raises(WorkspaceError) as info:
        Workspace.load(path, {"AZ_KEY": KEY})
    assert info.value.problems == [
        f"workspace file {path}: datastores.lake.credentials.sas_token: environment variable AZ_SAS is not set",
        f"workspace file {path}: accounts.sasacct.sas_token: environment variable AZ_SAS is not set",
    ]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("datastores:\n  d: {account_name: a}\n", "datastores.d: missing 'container_name'"),
        (
            "datastores:\n  d: {account_name: a, container_name: c, colour: red}\n",
            "datastores.d.colour",
        ),
        (
            "datastores:\n  d: {account_name: a, container_name: c, credentials: {account_key: k, sas_token: s}}\n",
            "give account_key or sas_token, not both",
        ),
        ("data_assets:\n  t: [{version: '1', type: csv, path: x}]\n", "data_assets.t.0.type"),
        ("- a\n- b\n", "expected a mapping at the top level"),
        ("datastores: {a: [\n", "not valid YAML"),
    ],
)
def test_bad_workspace_files(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "ws.yaml"
    path.write_text(text)
    with pytest.raises(WorkspaceError) as info:
        Workspace.load(path, {})
    assert fragment in str(info.value)
    assert str(info.value).startswith(f"workspace file {path}")


def test_missing_workspace_file(tmp_path: Path) -> None:
    with pytest.raises(
        WorkspaceError, match="not found \\(use --workspace FILE or DATAMOUNT_WORKSPACE\\)"
    ):
        Workspace.load(tmp_path / "nope.yaml", {})


def test_secrets_never_in_repr(ws: Workspace) -> None:
    loc = resolve(ws, "azureml://datastores/workspaceblobstore/paths/x")
    sas = resolve(ws, "azureml://datastores/lake/paths/x")
    for text in (repr(loc), str(loc), repr(sas), str(sas), repr(ws.config), str(ws.config)):
        assert KEY not in text
        assert "AbCdEf" not in text


def test_find_workspace_order(tmp_path: Path) -> None:
    assert find_workspace("a.yaml", {"DATAMOUNT_WORKSPACE": "b.yaml"}, tmp_path) == Path("a.yaml")
    assert find_workspace(None, {"DATAMOUNT_WORKSPACE": "b.yaml"}, tmp_path) == Path("b.yaml")
    assert find_workspace(None, {}, tmp_path) == tmp_path / "configs" / "workspace.yaml"


def test_version_key_numeric_aware() -> None:
    versions = ["1", "10", "2", "1.10", "1.9", "beta"]
    assert sorted(versions, key=version_key) == ["beta", "1", "1.9", "1.10", "2", "10"]
