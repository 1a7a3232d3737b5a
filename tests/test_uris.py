"""Every path form of docs/specs.md parses into the right Location; malformed
ones raise UriError naming the input."""

import pytest

from datamount.errors import UriError
from datamount.jobspec.uris import Location, LocationKind, parse

pytestmark = pytest.mark.unit

K = LocationKind


@pytest.mark.parametrize(
    ("raw", "kind", "fields"),
    [
        ("./data", K.LOCAL, {"path": "./data"}),
        ("data/train.csv", K.LOCAL, {"path": "data/train.csv"}),
        ("/abs/folder/", K.LOCAL, {"path": "/abs/folder/"}),
        ("file:///tmp/a%20b.csv", K.LOCAL, {"path": "/tmp/a b.csv"}),
        (
            "https://example.com/files/iris.csv",
            K.HTTP,
            {"path": "https://example.com/files/iris.csv"},
        ),
        (
            "http://127.0.0.1:8080/x.bin",
            K.HTTP,
            {"path": "http://127.0.0.1:8080/x.bin", "secure": False},
        ),
        (
            "https://acct1.blob.core.windows.net/data/train/",
            K.BLOB,
            {"account": "acct1", "container": "data", "path": "train/"},
        ),
        (
            "https://acct1.blob.core.windows.net/data/a%20b/c%23d%25e.csv",
            K.BLOB,
            {"account": "acct1", "container": "data", "path": "a b/c#d%e.csv"},
        ),
        (
            "https://acct1.dfs.core.windows.net/fs1/p/q",
            K.ADLS,
            {"account": "acct1", "container": "fs1", "path": "p/q"},
        ),
        (
            "wasbs://data@acct1.blob.core.windows.net/train",
            K.BLOB,
            {"account": "acct1", "container": "data", "path": "train", "secure": True},
        ),
        (
            "wasb://data@acct1.blob.core.windows.net/train/",
            K.BLOB,
            {"account": "acct1", "container": "data", "path": "train/", "secure": False},
        ),
        (
            "wasbs://data@acct1.blob.core.chinacloudapi.cn//deep//x.csv",
            K.BLOB,
            {"endpoint_suffix": "core.chinacloudapi.cn", "path": "deep/x.csv"},
        ),
        ("wasbs://data@acct1.blob.core.windows.net", K.BLOB, {"path": ""}),
        (
            "abfss://fs1@acct1.dfs.core.windows.net/events/2024/",
            K.ADLS,
            {"account": "acct1", "container": "fs1", "path": "events/2024/"},
        ),
        (
            "abfs://fs1@acct1.dfs.core.windows.net/x",
            K.ADLS,
            {"container": "fs1", "path": "x", "secure": False},
        ),
        (
            "azureml://datastores/workspaceblobstore/paths/cifar/",
            K.DATASTORE,
            {"datastore": "workspaceblobstore", "path": "cifar/"},
        ),
        (
            "azureml://datastores/ds/paths/",
            K.DATASTORE,
            {"datastore": "ds", "path": ""},
        ),
        (
            "azureml://subscriptions/0000-1111/resourcegroups/rg/workspaces/ws1/datastores/ds/paths/p/q.csv",
            K.DATASTORE,
            {"datastore": "ds", "path": "p/q.csv", "workspace": "ws1"},
        ),
        (
            "azureml://subscriptions/s/resourceGroups/rg/workspaces/ws1/data/titanic/versions/3",
            K.ASSET,
            {"asset_name": "titanic", "asset_version": "3", "workspace": "ws1"},
        ),
        ("azureml:titanic:1", K.ASSET, {"asset_name": "titanic", "asset_version": "1"}),
        (
            "azureml:my-data.v2:2024.01",
            K.ASSET,
            {"asset_name": "my-data.v2", "asset_version": "2024.01"},
        ),
        ("azureml:titanic@latest", K.ASSET, {"asset_name": "titanic", "asset_version": None}),
        (
            "azureml:wasbs://data@acct1.blob.core.windows.net/train",
            K.BLOB,
            {"account": "acct1", "container": "data", "path": "train"},
        ),
        (
            "azureml:abfss://fs1@acct1.dfs.core.windows.net/x/",
            K.ADLS,
            {"container": "fs1", "path": "x/"},
        ),
        (
            "azureml:azureml://datastores/ds/paths/x",
            K.DATASTORE,
            {"datastore": "ds", "path": "x"},
        ),
    ],
)
def test_parse_forms(raw: str, kind: LocationKind, fields: dict) -> None:
    loc = parse(raw)
    assert isinstance(loc, Location)
    assert loc.kind is kind
    assert loc.raw == raw
    for name, value in fields.items():
        assert getattr(loc, name) == value, name


def test_trailing_slash_marks_folder() -> None:
    assert parse("wasbs://data@acct1.blob.core.windows.net/train/").is_folder
    assert not parse("wasbs://data@acct1.blob.core.windows.net/train").is_folder


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ("", "expected a path or URI"),
        ("wasbs://data/x", "not a valid wasbs URI"),
        ("wasbs://data@acct1.dfs.core.windows.net/x", "not a valid wasbs URI"),
        ("abfss://fs@acct1.blob.core.windows.net/x", "not a valid abfss URI"),
        ("wasbs://Data@acct1.blob.core.windows.net/x", "not a valid container name"),
        ("wasbs://data@ACCT_1.blob.core.windows.net/x", "not a storage account name"),
        ("https://acct1.blob.core.windows.net/", "no container"),
        ("https://acct1.blob.core.windows.net/data/x?sv=2020&sig=abc", "SAS tokens"),
        ("azureml://foo/bar", "not a valid azureml URI"),
        ("azureml://subscriptions/s/workspaces/w/datastores/d/paths/p", "azureml://subscriptions/"),
        ("azureml://datastores//paths/x", "empty datastore name"),
        ("azureml:titanic", "needs a version"),
        ("azureml:titanic:", "expected azureml:<name>:<version>"),
        ("azureml:titanic@v3", "only @latest"),
        ("azureml:ti tanic:1", "not a data asset name"),
        ("s3://bucket/key", "unsupported scheme 's3'"),
        ("file://otherhost/x", "must be local"),
        ("wasbs://data@acct1.blob.core.windows.net/a/../b", "'..' is not allowed"),
    ],
)
def test_malformed_names_input(raw: str, fragment: str) -> None:
    with pytest.raises(UriError) as info:
        parse(raw, "inputs.train.path")
    message = str(info.value)
    assert message.startswith("inputs.train.path: "), message
    assert fragment in message
    assert info.value.exit_code == 2


def test_non_string_path() -> None:
    with pytest.raises(UriError, match=r"outputs.model.path: expected a path or URI, got 3"):
        parse(3, "outputs.model.path")
