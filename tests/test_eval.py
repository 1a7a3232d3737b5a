"""eval_download (and `run` with it): an MLTable whose files live on two
storage accounts with different credentials, evaluated and laid out as
`<account>/<container>/<path>` (real Azurite serving both accounts)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from azure.storage.blob import BlobServiceClient

from azurite import KEY, SECOND, SECOND_KEY, Azurite
from datamount.mltable import load
from fuse_helpers import Mounts, datamount, mounted

pytestmark = pytest.mark.azurite

FIRST_BLOBS = {
    "t/MLTable": (
        b"paths:\n"
        b"  - pattern: ./data/**/*.csv\n"
        b"  - file: wasbs://{other}@mlsecond.blob.core.windows.net/far/away.csv\n"
        b"transformations:\n"
        b"  - skip: 1\n"
        b"  - read_delimited: {delimiter: ','}\n"
    ),
    "t/data/2024/a.csv": b"x,y\n1,a\n",
    "t/data/2024/b.csv": b"x,y\n2,b\n",
    "t/data/2025/deep/c.csv": b"x,y\n3,c\n" + b"".join(b"%d,z\n" % i for i in range(20_000)),
    "t/data/readme.txt": b"not matched\n",
}
SECOND_BLOBS = {"far/away.csv": b"x,y\n4,d\n", "far/unused.csv": b"x,y\n5,e\n"}


@pytest.fixture
def two_containers(two_accounts: Azurite) -> Iterator[tuple[str, str]]:
    first = two_accounts.create_container()
    endpoint2 = f"http://127.0.0.1:{two_accounts.port}/{SECOND}"
    service2 = BlobServiceClient(
        endpoint2, credential={"account_name": SECOND, "account_key": SECOND_KEY}
    )
    other = service2.create_container(first.container_name + "x")
    blobs = dict(FIRST_BLOBS)
    blobs["t/MLTable"] = blobs["t/MLTable"].replace(b"{other}", other.container_name.encode())
    for name, data in blobs.items():
        first.upload_blob(name, data)
    for name, data in SECOND_BLOBS.items():
        other.upload_blob(name, data)
    try:
        yield first.container_name, other.container_name
    finally:
        with contextlib.suppress(Exception):
            first.delete_container()
            other.delete_container()
        service2.close()


def env_for(two_accounts: Azurite, tmp_path: Path, first: str) -> dict[str, str]:
    ws = tmp_path / "ws.yaml"
    endpoint = two_accounts.endpoint
    ws.write_text(
        "datastores:\n"
        f"  main: {{account_name: devstoreaccount1, container_name: {first}, "
        f"endpoint: '{endpoint}', credentials: {{account_key: '{KEY}'}}}}\n"
        "accounts:\n"
        f"  {SECOND}: {{endpoint: 'http://127.0.0.1:{two_accounts.port}/{SECOND}', "
        f"account_key: '{SECOND_KEY}'}}\n"
    )
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("DATASET_", "RSLEX_"))}
    return {**keep, "DATAMOUNT_WORKSPACE": str(ws), "DATAMOUNT_CACHE_DIR": str(tmp_path / "cache")}


def expected_tree(first: str, other: str) -> dict[str, bytes]:
    return {
        # skip: 1 drops the first file (a.csv) before the read step
        f"devstoreaccount1/{first}/t/data/2024/b.csv": FIRST_BLOBS["t/data/2024/b.csv"],
        f"devstoreaccount1/{first}/t/data/2025/deep/c.csv": FIRST_BLOBS["t/data/2025/deep/c.csv"],
        f"{SECOND}/{other}/far/away.csv": SECOND_BLOBS["far/away.csv"],
    }


def eval_spec(tmp_path: Path, mode: str, path: str) -> Path:
    """A one-input spec: the MLTable under datastore `main` at `path`, in `mode`."""
    spec = tmp_path / "in.yaml"
    spec.write_text(f"type: mltable\nmode: {mode}\npath: azureml://datastores/main/paths/{path}\n")
    return spec


def tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".datamount-manifest.jsonl"
    }


def test_eval_download_lays_out_both_accounts(
    two_accounts: Azurite, two_containers: tuple[str, str], tmp_path: Path
) -> None:
    first, other = two_containers
    env = env_for(two_accounts, tmp_path, first)
    spec = eval_spec(tmp_path, "eval_download", "t/")
    dest = tmp_path / "dest"
    out = datamount("mount", str(spec), str(dest), env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(dest)
    got = tree(dest)
    mltable = got.pop("MLTable").decode()
    assert got == expected_tree(first, other)
    # The layout's MLTable reads the local copies, with the read step kept.
    assert f"file: ./{SECOND}/{other}/far/away.csv" in mltable and "skip" not in mltable
    frame = load(str(dest)).to_pandas_dataframe()
    assert frame["x"].tolist()[:2] == [2, 3] and frame["y"].tolist()[-1] == "d"
    assert len(frame) == 20_003

    again = datamount("mount", str(spec), str(dest), env=env)  # resumable: nothing re-fetched
    assert again.returncode == 0, again.stderr
    assert tree(dest) == {**expected_tree(first, other), "MLTable": mltable.encode()}


def test_eval_download_of_a_missing_mltable_is_one_clear_error(
    two_accounts: Azurite, two_containers: tuple[str, str], tmp_path: Path
) -> None:
    first, _ = two_containers
    env = env_for(two_accounts, tmp_path, first)
    spec = eval_spec(tmp_path, "eval_download", "no/")
    out = datamount("mount", str(spec), str(tmp_path / "dest"), env=env)
    assert out.returncode == 3
    assert out.stderr.count("\n") == 1 and "no MLTable file there" in out.stderr
    assert not (tmp_path / "dest").exists()


@pytest.mark.parametrize(
    "mode", ["eval_download", pytest.param("eval_mount", marks=pytest.mark.fuse)]
)
def test_run_with_an_evaluated_input(
    two_accounts: Azurite,
    two_containers: tuple[str, str],
    tmp_path: Path,
    mounts: Mounts,
    mode: str,
) -> None:
    first, other = two_containers
    env = env_for(two_accounts, tmp_path, first)
    job = tmp_path / "job.yaml"
    job.write_text(
        "command: cat ${{inputs.table}}/" + f"{SECOND}/{other}/far/away.csv && "
        "find ${{inputs.table}} -type f | sort\n"
        "inputs:\n"
        f"  table: {{type: mltable, mode: {mode}, path: azureml://datastores/main/paths/t/}}\n"
    )
    table = mounts.point(tmp_path / "w" / "inputs" / "table")
    out = datamount("run", str(job), "--workdir", str(tmp_path / "w"), env=env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:2] == SECOND_BLOBS["far/away.csv"].decode().splitlines()
    listed = {str(Path(line).relative_to(table)) for line in lines[2:]}
    assert listed - {"MLTable", ".datamount-manifest.jsonl"} == set(expected_tree(first, other))
    assert not mounted(table)


@pytest.mark.fuse
def test_eval_mount_shows_exactly_the_evaluated_files(
    two_accounts: Azurite, two_containers: tuple[str, str], tmp_path: Path, mounts: Mounts
) -> None:
    first, other = two_containers
    env = env_for(two_accounts, tmp_path, first)
    spec = eval_spec(tmp_path, "eval_mount", "t/")
    mp = mounts.point(tmp_path / "mnt")
    out = datamount("mount", str(spec), str(mp), env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(mp) and mounted(mp)
    assert sorted(p.name for p in mp.iterdir()) == ["MLTable", "devstoreaccount1", SECOND]
    got = tree(mp)
    mltable = got.pop("MLTable").decode()
    assert got == expected_tree(first, other)
    assert f"file: ./{SECOND}/{other}/far/away.csv" in mltable
    assert not (mp / "devstoreaccount1" / first / "t" / "data" / "2024" / "a.csv").exists()
    frame = load(str(mp)).to_pandas_dataframe()  # pandas straight off the mount
    assert len(frame) == 20_003 and frame["y"].tolist()[-1] == "d"
    with pytest.raises(OSError, match="Read-only"):
        (mp / "new.csv").write_text("x")

    pid = mounts.daemon(mp)
    done = datamount("unmount", str(mp), env=env)
    assert done.returncode == 0, done.stderr
    assert not mounted(mp)
    stats = mounts.stats()
    assert stats["pid"] == pid and stats["cache"]["bytes_fetched"] >= sum(
        len(v) for v in expected_tree(first, other).values()
    )


def test_eval_mount_of_a_missing_mltable_fails_before_mounting(
    two_accounts: Azurite, two_containers: tuple[str, str], tmp_path: Path, mounts: Mounts
) -> None:
    first, _ = two_containers
    env = env_for(two_accounts, tmp_path, first)
    spec = eval_spec(tmp_path, "eval_mount", "no/")
    mp = mounts.point(tmp_path / "mnt")
    out = datamount("mount", str(spec), str(mp), env=env)
    assert out.returncode == 3
    assert out.stderr.count("\n") == 1 and "no MLTable file there" in out.stderr
    assert not mounted(mp)
