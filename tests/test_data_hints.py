"""Loader hints: the channel (a Unix socket per mount, one JSON line per
batch), finding the mount of a folder in mountinfo, and the datasets
sending their order to a real mount over real Azurite."""

from __future__ import annotations

import json
import random
import socket
from pathlib import Path

import pytest

from datamount.data import FileDataset, RecordDataset, hints
from datamount.mount.hintsocket import HintServer
from fuse_helpers import Mounts, datamount, mount_env, mounted, spec_file, wait_for


@pytest.mark.unit
def test_the_socket_takes_batches_and_refuses_bad_lines(tmp_path: Path) -> None:
    got: list[tuple[list[str], bool]] = []
    server = HintServer(tmp_path / "mnt", lambda paths, replace: got.append((list(paths), replace)))
    assert server.start()
    try:
        assert server.path == hints.hint_socket(tmp_path / "mnt")
        assert server.path.stat().st_mode & 0o777 == 0o600
        assert hints.send(server.path, ["a/1", "b/2"]) is True
        assert hints.send(server.path, ["c"], replace=True) is True
        assert got == [(["a/1", "b/2"], False), (["c"], True)]
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect(str(server.path))
            reader = conn.makefile("rb")
            for bad in (b"not json\n", b'{"files": "a"}\n', b'{"other": 1}\n'):
                conn.sendall(bad)
                reply = json.loads(reader.readline())
                assert reply["ok"] is False and "hint batch" in reply["error"]
            conn.sendall(b'{"files": ["x"]}\n')  # the same connection goes on
            assert json.loads(reader.readline()) == {"ok": True, "files": 1}
    finally:
        server.close()
    assert not server.path.exists()
    assert hints.send(server.path, ["a"]) is False  # nobody listens: nothing, no error


@pytest.mark.unit
def test_mounts_found_in_mountinfo(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(
        "22 1 0:21 / /proc rw - proc proc rw\n"
        "45 1 0:45 / /tmp/with\\040space/mnt rw,nosuid - fuse.datamount datamount:train "
        "rw,user_id=1234,group_id=1234\n"
    )
    assert hints.datamount_mounts(info) == [("/tmp/with space/mnt", 1234)]
    assert hints.datamount_mounts(tmp_path / "none") == []


@pytest.mark.unit
def test_no_mount_no_hint(tmp_path: Path) -> None:
    assert hints.mount_of(tmp_path) is None
    (tmp_path / "a.csv").write_text("x\n1\n")
    assert FileDataset(tmp_path).hint([0]) is False
    assert [r["x"] for r in RecordDataset(tmp_path, shuffle=True)] == [1]


@pytest.mark.fuse
def test_datasets_hint_their_order_to_the_mount(
    azurite, container, tmp_path, mounts: Mounts
) -> None:  # noqa: ANN001
    rng = random.Random(14)
    blobs = {}
    for f in range(12):
        rows = "".join(f"{f * 100 + i},{rng.random()}\n" for i in range(30))
        blobs[f"hints/csv/part-{f:02}.csv"] = ("id,x\n" + rows).encode()
    azurite.seed(container, blobs)
    env = mount_env(azurite, tmp_path, container.container_name)
    spec = spec_file(tmp_path, "input", "uri_folder", "azureml://datastores/store/paths/hints/")
    mp = mounts.point(tmp_path / "mnt")
    out = datamount("mount", str(spec), str(mp), env=env)
    assert out.returncode == 0, out.stderr
    try:
        assert hints.mount_of(mp / "csv") == (mp, Path("csv"))
        ds = RecordDataset(mp / "csv", seed=3, shuffle=True)
        ids = sorted(int(r["id"]) for r in ds)
        assert ids == [f * 100 + i for f in range(12) for i in range(30)]
        files = FileDataset(mp)
        assert files.hint([3, 1, 2]) is True
        for i in (3, 1, 2):
            assert files[i][1] == blobs[f"hints/{files.paths[i]}"]
    finally:
        out = datamount("unmount", str(mp), env=env)
        assert out.returncode == 0, out.stderr
        assert wait_for(lambda: not mounted(mp))
    stats = mounts.stats("input", mp)["cache"]
    assert stats["hinted_files"] == 12 + 3  # one epoch of the records, then the 3 files
    assert stats["files_prefetch_used"] >= 1


@pytest.mark.unit
def test_the_daemon_side_never_imports_torch() -> None:
    """datamount.data subclasses torch's datasets when torch is installed, so
    importing it imports torch (~1 s, hundreds of MB): the daemon and the CLI
    reach the hint socket's path through datamount.mountinfo instead."""
    import subprocess
    import sys

    code = (
        "import sys, datamount.cli.main, datamount.mount.daemon, datamount.mount.serve, "
        "datamount.mount.hintsocket; print(sorted(m for m in sys.modules if m == 'torch' "
        "or m == 'datamount.data' or m.startswith('datamount.data.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
