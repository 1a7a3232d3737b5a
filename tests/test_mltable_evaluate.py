"""MLTable evaluation to a file list: local and remote MLTable files, `**`
patterns across folders, two containers and two storage accounts (real
Azurite), file-level take/skip/take_random_sample, listing bounded by the
fixed prefix, eval layout paths."""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path

import pytest
from azure.storage.blob import BlobServiceClient, ContainerClient

from azurite import KEY, SECOND, SECOND_KEY, Azurite
from datamount.errors import DataError
from datamount.jobspec.uris import parse
from datamount.mltable import MLTableError, evaluate, load
from datamount.mltable.evalmode import evaluated_store
from datamount.mltable.evaluate import locate, sample_mask
from datamount.storage.location import StorageKind
from datamount.workspace.datastores import AssetVersion, Workspace
from mltable_support import Counts, azurite_workspace, counting_factory

DATA = {
    "tables/t1/data/2024/01/a.csv": b"x\n1\n",
    "tables/t1/data/2024/01/b.txt": b"not csv\n",
    "tables/t1/data/2024/02/c.csv": b"x\n2\n",
    "tables/t1/data/2025/d.csv": b"x\n3\n",
    "tables/t1/data/top.csv": b"x\n0\n",
    "tables/common/s.csv": b"x\n9\n",
    **{f"tables/t1/noise/{i:03d}.csv": b"x\n" for i in range(40)},
}


def put(container: ContainerClient, blobs: dict[str, bytes]) -> None:
    for name, data in blobs.items():
        container.upload_blob(name, data, overwrite=True)


def mltable_yaml(*entries: str, steps: str = "") -> bytes:
    text = "paths:\n" + "".join(f"  - {e}\n" for e in entries)
    if steps:
        text += "transformations:\n" + "".join(f"  - {s}\n" for s in steps.split(";"))
    return text.encode()


@pytest.fixture
def seeded(azurite: Azurite, container: ContainerClient) -> tuple[str, Workspace]:
    put(container, DATA)
    ws = azurite_workspace(azurite.endpoint, azurite.key, {"main": container.container_name})
    return container.container_name, ws


def test_remote_mltable_relative_patterns_and_layout(
    azurite: Azurite, container: ContainerClient, seeded: tuple[str, Workspace]
) -> None:
    name, ws = seeded
    put(
        container,
        {
            "tables/t1/MLTable": mltable_yaml(
                "pattern: ./data/**/*.csv", "file: ../common/s.csv", "file: data/top.csv"
            )
        },
    )
    counts = Counts()
    files = evaluate("azureml://datastores/main/paths/tables/t1/", ws, counting_factory(counts))
    assert [f.path for f in files] == [
        "tables/t1/data/2024/01/a.csv",
        "tables/t1/data/2024/02/c.csv",
        "tables/t1/data/2025/d.csv",
        "tables/t1/data/top.csv",  # matched by **/ (zero folders); the later file: is a duplicate
        "tables/common/s.csv",
    ]
    first = files[0]
    assert (first.account, first.container, first.size) == (azurite.account, name, 4)
    assert first.etag and first.location.credential.kind.value == "account_key"
    assert first.eval_path == f"{azurite.account}/{name}/tables/t1/data/2024/01/a.csv"
    assert first.uri == f"{azurite.endpoint}/{name}/tables/t1/data/2024/01/a.csv"
    assert [f.entry for f in files] == ["paths[0]"] * 4 + ["paths[1]"]
    # The pattern listed only its fixed prefix (never the noise/ folder).
    assert ("tables/t1/data/", None) in counts["prefixes"]
    assert all(not p.startswith("tables/t1/noise") and p for p, _ in counts["prefixes"])
    assert counts["listed"] == 5  # the five objects under tables/t1/data/


def test_listing_is_bounded_by_the_fixed_prefix(
    container: ContainerClient, seeded: tuple[str, Workspace]
) -> None:
    _, ws = seeded
    put(container, {"tables/t1/MLTable": mltable_yaml("pattern: ./data/2024/0[1-2]/*.csv")})
    counts = Counts()
    files = evaluate("azureml://datastores/main/paths/tables/t1", ws, counting_factory(counts))
    assert [f.path.rsplit("/", 1)[1] for f in files] == ["a.csv", "c.csv"]
    assert counts["prefixes"] == [("tables/t1/data/2024/0", None)]
    assert counts["pages"] == ["tables/t1/data/2024/0"]  # one request
    assert counts["listed"] == 3
    counts = Counts()
    put(container, {"tables/t1/MLTable": mltable_yaml("pattern: ./noise/00?.csv")})
    files = evaluate("azureml://datastores/main/paths/tables/t1", ws, counting_factory(counts))
    assert len(files) == 10
    # No wildcard in a folder: one delimited level under the prefix.
    assert counts["prefixes"] == [("tables/t1/noise/00", "/")]
    assert counts["listed"] == 10


def test_two_containers_and_folder_entries(
    azurite: Azurite, container: ContainerClient, seeded: tuple[str, Workspace]
) -> None:
    name, _ = seeded
    other = azurite.create_container(f"o{uuid.uuid4().hex[:20]}")
    try:
        put(other, {"more/z.csv": b"x\n7\n", "more/sub/y.csv": b"x\n8\n", "more/": b""})
        ws = azurite_workspace(
            azurite.endpoint, azurite.key, {"main": name, "second": other.container_name}
        )
        put(
            container,
            {
                "tables/t1/MLTable": mltable_yaml(
                    "folder: azureml://datastores/second/paths/more/",
                    f"pattern: wasbs://{name}@{azurite.account}.blob.core.windows.net/tables/t1/data/*.csv",
                    "folder: ./data/2025",
                )
            },
        )
        files = evaluate(
            "azureml://datastores/main/paths/tables/t1/MLTable", ws, counting_factory(Counts())
        )
        assert [(f.container, f.path) for f in files] == [
            (other.container_name, "more/sub/y.csv"),
            (other.container_name, "more/z.csv"),
            (name, "tables/t1/data/top.csv"),
            (name, "tables/t1/data/2025/d.csv"),
        ]
        assert files[0].eval_path == f"{azurite.account}/{other.container_name}/more/sub/y.csv"
    finally:
        other.delete_container()


def test_file_level_take_skip_and_seeded_sample(
    container: ContainerClient, seeded: tuple[str, Workspace]
) -> None:
    _, ws = seeded
    factory = counting_factory(Counts())
    base = "azureml://datastores/main/paths/tables/t1/"

    def paths(steps: str) -> list[str]:
        put(container, {"tables/t1/MLTable": mltable_yaml("pattern: ./noise/*.csv", steps=steps)})
        return [f.path.rsplit("/", 1)[1] for f in evaluate(base, ws, factory)]

    every = [f"{i:03d}.csv" for i in range(40)]
    assert paths("take: 5") == every[:5]
    assert paths("skip: 37") == every[37:]
    assert paths("skip: 3;take: 2") == every[3:5]
    sample = paths("take_random_sample: {probability: 0.3, seed: 7}")
    assert sample == paths("take_random_sample: {probability: 0.3, seed: 7}")  # deterministic
    keep = sample_mask(40, 0.3, 7)
    assert sample == [f for f, k in zip(every, keep, strict=True) if k]
    assert 0 < len(sample) < 40
    assert sample != paths("take_random_sample: {probability: 0.3, seed: 8}")
    # Row-level steps (after a read) leave the file list alone.
    assert paths("read_delimited: {};take: 1") == every


@pytest.mark.unit
def test_local_mltable_layout_and_relative_resolution(tmp_path: Path) -> None:
    table = tmp_path / "tbl"
    for rel in ("data/a/1.csv", "data/a/2.csv", "data/b/c/3.csv", "data/x.txt"):
        (table / rel).parent.mkdir(parents=True, exist_ok=True)
        (table / rel).write_text("x\n1\n")
    outside = tmp_path / "elsewhere.csv"
    outside.write_text("x\n2\n")
    (table / "MLTable").write_text(
        "paths:\n  - pattern: ./data/**/[0-9].csv\n  - file: ../elsewhere.csv\n  - folder: data/a/\n"
    )
    files = evaluate(str(table), None, counting_factory(Counts()))
    assert [f.eval_path for f in files] == [
        "local/data/a/1.csv",
        "local/data/a/2.csv",
        "local/data/b/c/3.csv",
        f"local/_abs/{str(outside).lstrip('/')}",
    ]
    assert files[0].location.kind is StorageKind.LOCAL
    assert files[0].path == str(table / "data/a/1.csv")
    assert (files[0].account, files[0].container, files[0].size) == ("", "", 4)
    # The MLTable file itself may be named, and a relative path resolves from base_dir.
    again = evaluate("tbl/MLTable", None, counting_factory(Counts()), base_dir=tmp_path)
    assert [f.path for f in again] == [f.path for f in files]


def test_evaluation_errors_name_the_file_and_entry(
    container: ContainerClient, seeded: tuple[str, Workspace], tmp_path: Path
) -> None:
    name, ws = seeded
    factory = counting_factory(Counts())
    base = "azureml://datastores/main/paths/tables/t1/"
    src = f"MLTable {ws.config.datastores['main'].endpoint}/{name}/tables/t1/MLTable"
    cases = {
        "file: ./missing.csv": f"{src}: paths[0]: file './missing.csv' not found",
        "pattern: ./data/*.parquet": f"{src}: paths[0]: pattern './data/*.parquet' matches no file",
        "folder: ./nothing/": f"{src}: paths[0]: folder './nothing/' holds no file",
        "file: ../../../x.csv": f"{src}: paths[0].file: '../../../x.csv' leads outside the container",
        "file: azureml://datastores/nope/paths/x.csv": f"{src}: paths[0].file: datastore 'nope' is not in the workspace (datastores: main)",
    }
    for entry, message in cases.items():
        put(container, {"tables/t1/MLTable": mltable_yaml(entry)})
        with pytest.raises((DataError, MLTableError)) as info:
            evaluate(base, ws, factory)
        assert str(info.value) == message
    with pytest.raises(DataError) as info:
        evaluate("azureml://datastores/main/paths/tables/none/", ws, factory)
    assert (
        str(info.value)
        == f"MLTable {ws.config.datastores['main'].endpoint}/{name}/tables/none/MLTable: no MLTable file there"
    )
    (tmp_path / "MLTable").write_text("paths: [{file: a.csv}]\nbogus: 1\n")
    with pytest.raises(MLTableError) as info:
        evaluate(str(tmp_path), None, factory)
    assert str(info.value) == (
        f"MLTable {tmp_path}/MLTable: unknown key 'bogus' (allowed: paths, transformations, type, $schema)"
    )


# -- a second storage account ----------------------------------------------------


def test_paths_on_two_storage_accounts(two_accounts: Azurite) -> None:
    endpoint2 = f"http://127.0.0.1:{two_accounts.port}/{SECOND}"
    second = BlobServiceClient(
        endpoint2, credential={"account_name": SECOND, "account_key": SECOND_KEY}
    )
    first = two_accounts.create_container("first")
    other = second.create_container("other")
    try:
        put(
            first,
            {
                "t/MLTable": mltable_yaml(
                    "pattern: ./part-*.csv",
                    f"file: wasbs://other@{SECOND}.blob.core.windows.net/far/away.csv",
                ),
                "t/part-1.csv": b"x\n1\n",
                "t/part-2.csv": b"x\n2\n",
            },
        )
        put(other, {"far/away.csv": b"x\n3\n"})
        ws = azurite_workspace(
            two_accounts.endpoint, KEY, {"main": "first"}, {SECOND: (endpoint2, SECOND_KEY)}
        )
        files = evaluate("azureml://datastores/main/paths/t", ws, counting_factory(Counts()))
        assert [f.eval_path for f in files] == [
            "devstoreaccount1/first/t/part-1.csv",
            "devstoreaccount1/first/t/part-2.csv",
            f"{SECOND}/other/far/away.csv",
        ]
        assert files[2].uri == f"{endpoint2}/other/far/away.csv"
    finally:
        with contextlib.suppress(Exception):
            other.delete_container()
        second.close()


# -- a remote MLTable may not reach node-local files -----------------------------


def test_remote_mltable_cannot_reference_local_files(
    azurite: Azurite, container: ContainerClient, tmp_path: Path
) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "env.sh").write_text("export KEY=hunter2\n")
    name = container.container_name
    ws = azurite_workspace(azurite.endpoint, azurite.key, {"main": name})
    ws.config.data_assets["nodefiles"] = [
        AssetVersion(version="1", type="uri_folder", path=f"{secret}/")
    ]
    put(container, {"t/ok.csv": b"x\n1\n"})
    src = f"MLTable {azurite.endpoint}/{name}/t/MLTable"
    factory = counting_factory(Counts())
    entries = [
        f"file: {secret}/env.sh",
        f"file: file://{secret}/env.sh",
        f"pattern: {secret}/*.sh",
        f"folder: {secret}/",
        "folder: azureml:nodefiles:1",
    ]
    for entry in entries:
        kind, value = entry.split(": ", 1)
        # The bad entry comes second: the first (remote) one is fine.
        put(container, {"t/MLTable": mltable_yaml("file: ./ok.csv", entry)})
        message = (
            f"{src}: paths[1].{kind}: {value!r}: a remote MLTable cannot reference local files"
        )
        with pytest.raises(MLTableError) as info:
            evaluate("azureml://datastores/main/paths/t/", ws, factory)
        assert str(info.value) == message
        # eval_download / eval_mount evaluate through the same code.
        with pytest.raises(MLTableError) as info:
            evaluated_store(
                ws.resolve(parse("azureml://datastores/main/paths/t/")), ws, factory
            ).close()
        assert str(info.value) == message
        # load: the MLTable parses; evaluating its paths fails, nothing is read.
        table = load("azureml://datastores/main/paths/t/", ws, store_factory=factory)
        with pytest.raises(MLTableError) as info:
            table.to_pandas_dataframe()
        assert str(info.value) == message


def test_local_mltable_may_reference_local_and_remote_files(
    azurite: Azurite, container: ContainerClient, tmp_path: Path
) -> None:
    name = container.container_name
    ws = azurite_workspace(azurite.endpoint, azurite.key, {"main": name})
    put(container, {"r/remote.csv": b"x\n2\n"})
    elsewhere = tmp_path / "elsewhere.csv"
    elsewhere.write_text("x\n1\n")
    table = tmp_path / "tbl"
    table.mkdir()
    (table / "MLTable").write_bytes(
        mltable_yaml(
            f"file: file://{elsewhere}",
            "file: azureml://datastores/main/paths/r/remote.csv",
            steps="read_delimited: {}",
        )
    )
    files = evaluate(str(table), ws, counting_factory(Counts()))
    assert [(f.location.kind, f.path) for f in files] == [
        (StorageKind.LOCAL, str(elsewhere)),
        (StorageKind.BLOB, "r/remote.csv"),
    ]
    df = load(table, ws).to_pandas_dataframe()
    assert df["x"].tolist() == [1, 2]


@pytest.mark.unit
@pytest.mark.parametrize(
    "subsetting",
    ["take: 0", "skip: 5", "take_random_sample: {probability: 0.0, seed: 1}"],
)
@pytest.mark.parametrize("read", ["read_delimited", None])
def test_an_evaluation_that_keeps_no_file_still_loads(
    tmp_path: Path, subsetting: str, read: str | None
) -> None:
    """eval_download / eval_mount of an MLTable whose subsetting keeps no file:
    the layout's MLTable loads as an empty table (it used to say `paths: []`,
    which load rejects)."""
    table = tmp_path / "tbl"
    (table / "d").mkdir(parents=True)
    (table / "d" / "a.csv").write_text("x\n1\n")
    steps = [subsetting, read] if read else [subsetting]
    (table / "MLTable").write_text(
        "paths: [{folder: ./d}]\ntransformations:\n" + "".join(f"  - {s}\n" for s in steps)
    )
    location = locate(str(table), Workspace.empty, None)
    store = evaluated_store(location, Workspace.empty(), counting_factory(Counts()))
    layout = tmp_path / "layout"
    layout.mkdir()
    try:
        for page in store.list_pages(""):
            for obj in page.objects:
                (layout / obj.key).parent.mkdir(parents=True, exist_ok=True)
                (layout / obj.key).write_bytes(store.read(obj.key, 0, obj.size))
    finally:
        store.close()
    assert sorted(p.name for p in layout.rglob("*") if p.is_file()) == ["MLTable"]
    df = load(str(layout)).to_pandas_dataframe()
    assert len(df) == 0
    assert list(df.columns) == ([] if read else ["Path"])
