"""The datasets over a real ro_mount of Azurite: FileDataset's bytes equal the
blobs, and RecordDataset's two ranks, one of them interrupted and restored,
read every record of the mounted CSV files exactly once."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from datamount.data import FileDataset, RecordDataset
from fuse_helpers import Mounts, datamount, mount_env, mounted, spec_file, wait_for

pytestmark = [pytest.mark.azurite, pytest.mark.fuse]


def test_datasets_over_a_mount(azurite, container, tmp_path: Path, mounts: Mounts) -> None:  # noqa: ANN001
    rng = random.Random(14)
    blobs = {f"ds/bin/{i:02}.bin": rng.randbytes(rng.randrange(0, 300_000)) for i in range(6)}
    for f in range(5):
        rows = "".join(f"{f * 100 + i},{rng.random()}\n" for i in range(40))
        blobs[f"ds/csv/part-{f}.csv"] = ("id,x\n" + rows).encode()
    azurite.seed(container, blobs)
    env = mount_env(azurite, tmp_path, container.container_name, DATAMOUNT_STORAGE_LEVEL="memory")
    spec = spec_file(tmp_path, "input", "uri_folder", "azureml://datastores/store/paths/ds/")
    mp = mounts.point(tmp_path / "mnt")
    out = datamount("mount", str(spec), str(mp), env=env)
    assert out.returncode == 0, out.stderr
    try:
        files = FileDataset(mp)
        assert files.paths == sorted(k.removeprefix("ds/") for k in blobs)
        for i in range(len(files)):
            path, body = files[i]
            assert body == blobs[f"ds/{path}"]

        union: list[int] = []
        for rank in range(2):
            ds = RecordDataset(
                mp / "csv", seed=7, shuffle=True, rank=rank, world_size=2, buffer_size=16
            )
            it = iter(ds)
            first = [int(next(it)["id"]) for _ in range(25)]
            state = ds.state_dict()
            again = RecordDataset(
                mp / "csv", seed=7, shuffle=True, rank=rank, world_size=2, buffer_size=16
            )
            again.load_state_dict(state)
            rest = [int(r["id"]) for r in again]
            assert first + rest == [int(r["id"]) for r in RecordDataset(
                mp / "csv", seed=7, shuffle=True, rank=rank, world_size=2, buffer_size=16
            )]  # fmt: skip
            union.extend(first + rest)
        assert sorted(union) == [f * 100 + i for f in range(5) for i in range(40)]
    finally:
        out = datamount("unmount", str(mp), env=env)
        assert out.returncode == 0, out.stderr
        assert wait_for(lambda: not mounted(mp))
