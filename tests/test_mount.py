"""ro_mount through the CLI: real FUSE (/dev/fuse, fusermount3) over real
Azurite. Every mount point goes through the `mounts` fixture, which detaches
and kills whatever a test leaves behind, and fails the test if anything was.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from datamount.mount.control import alive, is_stale, state_file
from fuse_helpers import (
    EXE,
    Mounts,
    daemons_of,
    datamount,
    mount_env,
    mounted,
    spec_file,
    wait_for,
)

pytestmark = [pytest.mark.azurite, pytest.mark.fuse]

rng = random.Random(5)
BIG = rng.randbytes(3 * 1024 * 1024 + 17)  # several 1 MiB FUSE reads, an odd tail
TREE = {
    "ds/a.txt": b"alpha\n",
    "ds/big.bin": BIG,
    "ds/empty.bin": b"",
    "ds/dir with space/naïve 日本.txt": b"unicode\n",
    "ds/sub/deeper/c.bin": rng.randbytes(70_000),
    "ds/sub/d.txt": b"d",
    "ds/marker/": b"",  # a folder marker with no children: an empty directory
    "ds/marked/": b"",  # a folder marker over real children: one directory
    "ds/marked/x.txt": b"x",
    "ds/": b"",  # the mounted folder's own marker: invisible
}
ROOT = ["a.txt", "big.bin", "dir with space", "empty.bin", "marked", "marker", "sub"]
FILES = {k[3:]: v for k, v in TREE.items() if not k.endswith("/")}


def folder_spec(tmp_path: Path, path: str = "ds/") -> Path:
    return spec_file(tmp_path, "input", "uri_folder", f"azureml://datastores/store/paths/{path}")


def mount_ok(spec: Path, mp: Path, env: dict[str, str], *extra: str) -> str:
    out = datamount("mount", str(spec), str(mp), *extra, env=env)
    assert out.returncode == 0, out.stderr
    assert mounted(mp)
    return out.stdout


def unmount_ok(mounts: Mounts, mp: Path, env: dict[str, str], *extra: str) -> int:
    pid = mounts.daemon(mp)
    out = datamount("unmount", str(mp), *extra, env=env)
    assert out.returncode == 0, out.stderr
    assert not mounted(mp)
    assert wait_for(lambda: not alive(pid)), f"daemon {pid} still running"
    assert not state_file(mounts.cache_dir, mp).exists()
    return pid


def test_folder_tree_ls_stat_read_unmount(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    azurite.seed(container, TREE)
    env = mount_env(azurite, tmp_path, container.container_name)
    mp = mounts.point(tmp_path / "mnt")
    assert mount_ok(folder_spec(tmp_path), mp, env) == f"{mp}\n"
    assert mounts.stats()["pid"] == mounts.daemon(mp)  # written as soon as it is mounted

    assert sorted(os.listdir(mp)) == ROOT
    kinds = {e.name: e.is_dir() for e in os.scandir(mp)}
    assert kinds == {n: "." not in n for n in ROOT}  # markers and prefixes are directories
    assert os.listdir(mp / "marker") == []
    assert os.listdir(mp / "marked") == ["x.txt"]
    assert sorted(os.listdir(mp / "sub")) == ["d.txt", "deeper"]
    for rel, body in FILES.items():
        st = os.stat(mp / rel)
        assert st.st_size == len(body), rel
        assert (mp / rel).read_bytes() == body, rel
    walked = {str(Path(d, f).relative_to(mp)) for d, _, files in os.walk(mp) for f in files}
    assert walked == set(FILES)
    # Positional reads of the big file: each equals its slice of the source.
    with open(mp / "big.bin", "rb", buffering=0) as f:
        for _ in range(20):
            off = rng.randrange(len(BIG))
            n = rng.randrange(1, 300_000)
            assert os.pread(f.fileno(), n, off) == BIG[off : off + n]

    # Read-only: every write is EROFS; missing names are ENOENT.
    for attempt in (
        lambda: open(mp / "new.txt", "w"),  # noqa: SIM115
        lambda: open(mp / "a.txt", "r+b"),  # noqa: SIM115
        lambda: os.mkdir(mp / "newdir"),
        lambda: os.unlink(mp / "a.txt"),
        lambda: os.rename(mp / "a.txt", mp / "b.txt"),
        lambda: os.truncate(mp / "a.txt", 0),
        lambda: os.chmod(mp / "a.txt", 0o777),
    ):
        with pytest.raises(OSError) as caught:
            attempt()
        assert caught.value.errno == errno.EROFS
    with pytest.raises(FileNotFoundError):
        os.stat(mp / "no such file")
    with pytest.raises(FileNotFoundError):
        os.listdir(mp / "sub" / "nope")

    pid = unmount_ok(mounts, mp, env)
    logs = tmp_path / "cache" / "logs"
    activity = (logs / "data-capability.log").read_text()
    assert "ActivityCompleted: Activity=mount, HowEnded=Success" in activity
    assert "ActivityCompleted: Activity=unmount, HowEnded=Success" in activity
    runtime = (logs / "datamount-runtime.log").read_text()
    assert f"mount stats {mp}" in runtime and azurite.key not in runtime
    stats = mounts.stats()
    assert stats["pid"] == pid and stats["fs"]["open_files"] == 0
    assert stats["fs"]["bytes_read"] >= sum(map(len, FILES.values()))
    assert "ram_hits" in stats["cache"]


def test_ls_l_costs_listing_requests_only(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    blobs = {f"ls/f{i:04d}.txt": b"%d" % i for i in range(300)}
    azurite.seed(container, blobs, threads=32)
    env = mount_env(azurite, tmp_path, container.container_name)
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(folder_spec(tmp_path, "ls/"), mp, env)
    listing = subprocess.run(["ls", "-l", str(mp)], capture_output=True, text=True, check=True)
    assert len(listing.stdout.splitlines()) == 301  # "total" + 300 files
    sizes = {e.name: e.stat().st_size for e in os.scandir(mp)}
    assert sizes == {k[3:]: len(v) for k, v in blobs.items()}
    unmount_ok(mounts, mp, env)
    # One listing page at the check before mounting is the parent's; the
    # daemon made one listing request for the folder, none per entry.
    fs = mounts.stats()["fs"]
    assert fs["metadata_requests"] == 1
    # readdirplus: the entries came with their attributes, so the kernel made
    # (almost) no lookups of its own: nowhere near one per file.
    assert fs["getattrs"] < 10


def test_uri_file_mount_prints_the_file_and_sigterm_unmounts(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    body = rng.randbytes(123_457)
    azurite.seed(container, {"models/v1/model weights.bin": body, "models/v1/other.bin": b"o"})
    env = mount_env(azurite, tmp_path, container.container_name)
    mp = mounts.point(tmp_path / "mnt")
    spec = spec_file(tmp_path, "model", "uri_file",
                     "azureml://datastores/store/paths/models/v1/model weights.bin")  # fmt: skip
    assert mount_ok(spec, mp, env) == f"{mp / 'model weights.bin'}\n"
    assert os.listdir(mp) == ["model weights.bin"]
    assert (mp / "model weights.bin").read_bytes() == body
    with pytest.raises(FileNotFoundError):
        os.stat(mp / "other.bin")

    pid = mounts.daemon(mp)
    os.kill(pid, signal.SIGTERM)
    assert wait_for(lambda: not alive(pid)), "daemon ignored SIGTERM"
    assert not mounted(mp)
    activity = (tmp_path / "cache" / "logs" / "data-capability.log").read_text()
    assert "Activity=unmount, HowEnded=Success" in activity and "reason=SIGTERM" in activity


def test_missing_data_is_an_error_before_mounting(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    azurite.seed(container, {"there/x.txt": b"x"})
    env = mount_env(azurite, tmp_path, container.container_name)
    mp = mounts.point(tmp_path / "mnt")
    out = datamount("mount", str(folder_spec(tmp_path, "not-there/")), str(mp), env=env)
    assert out.returncode == 3
    assert out.stderr.startswith("datamount: error: ") and "no such folder" in out.stderr
    assert len(out.stderr.splitlines()) == 1 and "Traceback" not in out.stderr
    spec = spec_file(tmp_path, "f", "uri_file", "azureml://datastores/store/paths/there/nope.bin")
    out = datamount("mount", str(spec), str(mp), env=env)
    assert out.returncode == 3 and "not found" in out.stderr
    assert not mounted(mp) and not daemons_of(mp)
    activity = (tmp_path / "cache" / "logs" / "data-capability.log").read_text()
    assert "Activity=mount, HowEnded=Failure" in activity


def test_busy_or_non_empty_mount_point_is_an_error(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    azurite.seed(container, {"ds/a.txt": b"a"})
    env = mount_env(azurite, tmp_path, container.container_name)
    full = mounts.point(tmp_path / "full")
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    out = datamount("mount", str(folder_spec(tmp_path)), str(full), env=env)
    assert out.returncode == 3 and "is not empty" in out.stderr
    assert (full / "keep.txt").read_text() == "mine"

    mp = mounts.point(tmp_path / "mnt")
    mount_ok(folder_spec(tmp_path), mp, env)
    out = datamount("mount", str(folder_spec(tmp_path)), str(mp), env=env)
    assert out.returncode == 3 and "is busy: already mounted" in out.stderr
    assert len(daemons_of(mp)) == 2  # the first mount's supervisor and daemon only
    # A reader holds a file open: `unmount` waits for it, then forces the unmount.
    held = open(mp / "a.txt", "rb")  # noqa: SIM115
    try:
        pid = mounts.daemon(mp)
        started = time.monotonic()
        out = datamount("unmount", str(mp), "--timeout", "1", env=env)
        assert out.returncode == 0, out.stderr
        assert "forced" in out.stderr and time.monotonic() - started >= 1.0
        assert not mounted(mp)
        assert wait_for(lambda: not alive(pid))
    finally:
        with contextlib.suppress(OSError):  # ENOTCONN: the forced unmount cut it off
            held.close()


def test_sigterm_drains_an_open_file_first(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    azurite.seed(container, {"ds/a.txt": b"a" * 10_000})
    env = mount_env(azurite, tmp_path, container.container_name)
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(folder_spec(tmp_path), mp, env)
    pid = mounts.daemon(mp)
    f = open(mp / "a.txt", "rb", buffering=0)  # noqa: SIM115
    os.kill(pid, signal.SIGTERM)
    time.sleep(0.5)
    assert alive(pid) and mounted(mp)  # draining: the open file is still served
    assert os.pread(f.fileno(), 5, 100) == b"aaaaa"
    threading.Timer(0.2, f.close).start()
    assert wait_for(lambda: not alive(pid)), "daemon did not finish after the file closed"
    assert not mounted(mp)


def test_sigterm_forces_the_unmount_after_the_drain_timeout(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    azurite.seed(container, {"ds/a.txt": b"a"})
    env = mount_env(azurite, tmp_path, container.container_name,
                    DATASET_UNMOUNT_TIMEOUT_SECONDS="1")  # fmt: skip
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(folder_spec(tmp_path), mp, env)
    pid = mounts.daemon(mp)
    held = open(mp / "a.txt", "rb")  # noqa: SIM115  (never closed before the deadline)
    try:
        started = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        assert wait_for(lambda: not alive(pid)), "daemon still running after its drain timeout"
        assert 1.0 <= time.monotonic() - started < 8
        assert not mounted(mp)
    finally:
        with contextlib.suppress(OSError):
            held.close()
    runtime = (tmp_path / "cache" / "logs" / "datamount-runtime.log").read_text()
    assert "forcing the unmount" in runtime


def test_sigkill_then_mount_recovers_the_stale_mount(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    azurite.seed(container, {"ds/a.txt": b"first"})
    # No restart in place (test_mount_heal.py): the mount stays stale, as before.
    env = mount_env(azurite, tmp_path, container.container_name, DATAMOUNT_MOUNT_MAX_RESTARTS="0")
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(folder_spec(tmp_path), mp, env)
    pid = mounts.daemon(mp)
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: not alive(pid))
    assert is_stale(mp)  # ENOTCONN: the kernel still has the mount, nobody serves it
    mount_ok(folder_spec(tmp_path), mp, env)
    assert (mp / "a.txt").read_bytes() == b"first"
    assert mounts.daemon(mp) != pid
    runtime = (tmp_path / "cache" / "logs" / "datamount-runtime.log").read_text()
    assert "stale mount" in runtime
    unmount_ok(mounts, mp, env)


def test_attribute_ttl_expiry_picks_up_new_files(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    azurite.seed(container, {"ds/a.txt": b"a"})
    env = mount_env(azurite, tmp_path, container.container_name)
    never = mounts.point(tmp_path / "never")
    short = mounts.point(tmp_path / "short")
    mount_ok(folder_spec(tmp_path), never, env)
    mount_ok(folder_spec(tmp_path), short, {**env, "DATASET_MOUNT_ATTRIBUTE_CACHE_TTL": "300"})
    for mp in (never, short):
        assert os.listdir(mp) == ["a.txt"]
        with pytest.raises(FileNotFoundError):
            os.stat(mp / "b.txt")  # remembered as missing
    azurite.seed(container, {"ds/b.txt": b"bee"})
    time.sleep(0.6)
    assert sorted(os.listdir(short)) == ["a.txt", "b.txt"]
    assert (short / "b.txt").read_bytes() == b"bee"
    # Unset TTL: as in Azure ML, what the mount has seen never expires.
    assert os.listdir(never) == ["a.txt"]
    with pytest.raises(FileNotFoundError):
        os.stat(never / "b.txt")
    for mp in (never, short):
        unmount_ok(mounts, mp, env)


def test_foreground_stays_attached_and_sigint_unmounts(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    azurite.seed(container, {"ds/a.txt": b"fg"})
    env = mount_env(azurite, tmp_path, container.container_name)
    mp = mounts.point(tmp_path / "mnt")
    proc = subprocess.Popen(
        [EXE, "mount", str(folder_spec(tmp_path)), str(mp), "--foreground"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == f"{mp}\n"  # printed once the mount answers
        assert (mp / "a.txt").read_bytes() == b"fg"
        assert mounts.daemon(mp) == proc.pid
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
        assert not mounted(mp)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
