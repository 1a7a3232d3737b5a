"""rw_mount through the CLI: real FUSE over real Azurite (optionally behind
the fault-injecting proxy). What is written through the mount is what the
container holds, byte for byte, with its Content-MD5; names change in
storage; fsync is durable; failed uploads are EIO to the writer, named at
unmount (exit code 4) and re-uploaded by the next mount with the same cache;
the free-space reserve gives ENOSPC. Every mount point goes through the
`mounts` fixture, which detaches and kills whatever a test leaves behind.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import store_on
from datamount.mount.control import alive, state_file
from datamount.storage import ObjectStore
from datamount.transfer.uploader import BLOCK_SIZE
from faultproxy import FaultProxy
from fuse_helpers import EXE, Mounts, datamount, mount_env, mounted, wait_for

pytestmark = [pytest.mark.azurite, pytest.mark.fuse]

rng = random.Random(23)
MiB = 1024 * 1024


def output_spec(tmp_path: Path, path: str = "out/") -> Path:
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "outputs:\n"
        f"  model: {{type: uri_folder, path: 'azureml://datastores/store/paths/{path}', "
        "mode: rw_mount}\n"
    )
    return spec


def env_for(azurite, tmp_path: Path, container, *, via=None, **extra: str) -> dict[str, str]:  # noqa: ANN001
    service = azurite
    if via is not None:
        service = SimpleNamespace(account=azurite.account, key=azurite.key, endpoint=via.endpoint)
    base = {
        "AZUREML_DATASET_HTTP_RETRY_COUNT": "3",
        "DATAMOUNT_RETRY_MIN_SECONDS": "0",
        "DATASET_UNMOUNT_TIMEOUT_SECONDS": "10",
    }
    return mount_env(service, tmp_path, container.container_name, **{**base, **extra})


def mount_ok(tmp_path: Path, mp: Path, env: dict[str, str]) -> None:
    out = datamount("mount", str(output_spec(tmp_path)), str(mp), env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"{mp}\n"
    assert mounted(mp)


def unmount(mounts: Mounts, mp: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    pid = mounts.daemon(mp)
    out = datamount("unmount", str(mp), env=env)
    assert not mounted(mp)
    assert wait_for(lambda: not alive(pid)), f"daemon {pid} still running"
    assert not state_file(mounts.cache_dir, mp).exists()
    return out


def unmount_ok(mounts: Mounts, mp: Path, env: dict[str, str]) -> None:
    out = unmount(mounts, mp, env)
    assert out.returncode == 0, out.stderr


def blob(store: ObjectStore, key: str) -> bytes:
    info = store.stat(key)
    return store.read(key, 0, info.size + 1) if info.size else b""


def md5(data: bytes) -> bytes:
    return hashlib.md5(data, usedforsecurity=False).digest()


def runtime_log(mounts: Mounts) -> str:
    return (mounts.cache_dir / "logs" / "datamount-runtime.log").read_text()


def staging_dir(mounts: Mounts) -> Path:
    (folder,) = (mounts.cache_dir / "staging").iterdir()
    return folder


SIZES = [0, 1, BLOCK_SIZE, BLOCK_SIZE + 1, 2 * BLOCK_SIZE + 3 * MiB + 7]


@pytest.mark.slow
def test_write_sizes_sequential_and_random_read_back(
    azurite, container, azure_store: ObjectStore, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    azurite.seed(container, {"out/existing.txt": b"0123456789"})
    env = env_for(azurite, tmp_path, container)
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(tmp_path, mp, env)
    bodies = {}
    for size in SIZES:
        body = rng.randbytes(size)
        bodies[f"seq-{size}.bin"] = body
        with open(mp / f"seq-{size}.bin", "wb") as f:
            for off in range(0, size, MiB):
                f.write(body[off : off + MiB])
        if size:
            rand = rng.randbytes(size)
            bodies[f"rand-{size}.bin"] = rand
            pieces = [(off, rand[off : off + 300_000]) for off in range(0, size, 300_000)]
            rng.shuffle(pieces)
            fd = os.open(mp / f"rand-{size}.bin", os.O_CREAT | os.O_WRONLY, 0o644)
            try:
                for off, piece in pieces:
                    assert os.pwrite(fd, piece, off) == len(piece)
            finally:
                os.close(fd)
    # an existing blob opened without O_TRUNC: its bytes are kept around the write
    with open(mp / "existing.txt", "r+b") as f:
        f.seek(3)
        f.write(b"abc")
    bodies["existing.txt"] = b"012abc6789"

    assert sorted(os.listdir(mp)) == sorted(bodies)
    for name, body in bodies.items():
        assert os.stat(mp / name).st_size == len(body), name
        assert (mp / name).read_bytes() == body, name
        assert blob(azure_store, "out/" + name) == body, name
        assert azure_store.stat("out/" + name).content_md5 == md5(body), name
    # the largest file went up as staged blocks (Put Block + Put Block List)
    big = f"out/seq-{SIZES[-1]}.bin"
    blocks = container.get_blob_client(big).get_block_list("committed")[0]
    assert [b.size for b in blocks] == [BLOCK_SIZE, BLOCK_SIZE, 3 * MiB + 7]
    unmount_ok(mounts, mp, env)
    fs = mounts.stats("model")["fs"]
    assert fs["files_uploaded"] == len(bodies)
    assert fs["bytes_uploaded"] == sum(len(b) for b in bodies.values())
    assert fs["upload_failures"] == 0 and fs["uploads_pending"] == 0
    log = runtime_log(mounts)
    assert "rw_mount " in log and f"uploaded {big}: {SIZES[-1]} bytes" in log


def test_names_change_in_storage(
    azurite, container, azure_store: ObjectStore, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    azurite.seed(container, {"out/d/a.txt": b"a", "out/d/sub/b.txt": b"bb", "out/f.txt": b"f"})
    env = env_for(azurite, tmp_path, container)
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(tmp_path, mp, env)

    def keys() -> list[str]:
        return sorted(b.name for b in container.list_blobs(name_starts_with="out/"))

    os.mkdir(mp / "empty")
    assert os.listdir(mp / "empty") == []
    assert "out/empty/" in keys()  # the folder marker
    os.makedirs(mp / "x" / "y")
    (mp / "x" / "y" / "z.txt").write_bytes(b"zzz")
    os.rename(mp / "f.txt", mp / "g.txt")
    os.rename(mp / "d", mp / "e")
    with pytest.raises(OSError) as caught:
        os.rmdir(mp / "e")
    assert caught.value.errno == errno.ENOTEMPTY
    os.unlink(mp / "e" / "a.txt")
    os.rmdir(mp / "empty")
    assert keys() == ["out/e/sub/b.txt", "out/g.txt", "out/x/", "out/x/y/", "out/x/y/z.txt"]
    assert sorted(os.listdir(mp)) == ["e", "g.txt", "x"]
    assert (mp / "e" / "sub" / "b.txt").read_bytes() == b"bb"
    assert not (mp / "d").exists()
    # a file written then renamed while open (the usual "write tmp, rename" pattern)
    with open(mp / "ckpt.tmp", "wb") as f:
        f.write(b"checkpoint")
        os.rename(mp / "ckpt.tmp", mp / "ckpt")
    assert blob(azure_store, "out/ckpt") == b"checkpoint"
    assert "out/ckpt.tmp" not in keys()
    # unlinked while open: the handle keeps working, nothing reaches storage
    with open(mp / "scratch", "w+b") as f:
        f.write(b"scratch")
        os.unlink(mp / "scratch")
        f.write(b" more")
        f.seek(0)
        assert f.read() == b"scratch more"
        assert not (mp / "scratch").exists()
    assert not [k for k in keys() if "scratch" in k or "fuse_hidden" in k]
    # chmod / utime: accepted and ignored
    os.chmod(mp / "g.txt", 0o600)
    os.utime(mp / "g.txt", (0, 0))
    assert (mp / "g.txt").read_bytes() == b"f"
    unmount_ok(mounts, mp, env)


def test_backslash_refused_and_scripts_run_from_the_mount(
    azurite, container, azure_store: ObjectStore, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    env = env_for(azurite, tmp_path, container)
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(tmp_path, mp, env)
    for make in (lambda p: p.write_bytes(b"x"), os.mkdir):
        with pytest.raises(OSError) as caught:
            make(mp / "back\\slash")
        assert caught.value.errno == errno.EINVAL
    (mp / "ok.txt").write_bytes(b"ok")
    with pytest.raises(OSError) as caught:
        os.rename(mp / "ok.txt", mp / "a\\b")
    assert caught.value.errno == errno.EINVAL
    assert os.listdir(mp) == ["ok.txt"]
    assert [b.name for b in container.list_blobs()] == ["out/ok.txt"]
    # a script written to the output runs from it (files show 0755; chmod is ignored)
    script = mp / "run.sh"
    script.write_text("#!/bin/sh\necho ran $1\n")
    os.chmod(script, 0o755)
    assert os.stat(script).st_mode & 0o7777 == 0o755
    assert os.stat(mp).st_mode & 0o7777 == 0o755
    done = subprocess.run([str(script), "here"], capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout) == (0, "ran here\n")
    unmount_ok(mounts, mp, env)


def test_local_output_folders_are_directories(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    """rw_mount of a local path: mkdir, mkdir -p, writes below and mv of a
    folder work as on any directory (no folder marker files)."""
    target = tmp_path / "x" / "localout"  # does not exist yet
    spec = tmp_path / "local.yaml"
    spec.write_text(f"outputs:\n  lo: {{type: uri_folder, path: '{target}/', mode: rw_mount}}\n")
    env = env_for(azurite, tmp_path, container)
    mp = mounts.point(tmp_path / "mnt")
    out = datamount("mount", str(spec), str(mp), env=env)
    assert out.returncode == 0, out.stderr
    os.mkdir(mp / "d2")
    assert (target / "d2").is_dir() and (mp / "d2").is_dir()
    done = subprocess.run(["mkdir", "-p", str(mp / "x" / "y" / "z")], capture_output=True,
                          text=True, timeout=30)  # fmt: skip
    assert done.returncode == 0, done.stderr
    (mp / "x" / "y" / "z" / "f.txt").write_bytes(b"deep")
    os.mkdir(mp / "x" / "empty")
    done = subprocess.run(["mv", str(mp / "x"), str(mp / "x2")], capture_output=True,
                          text=True, timeout=30)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(mp)) == ["d2", "x2"]
    assert sorted(os.listdir(mp / "x2")) == ["empty", "y"]
    assert (mp / "x2" / "y" / "z" / "f.txt").read_bytes() == b"deep"
    assert (target / "x2" / "y" / "z" / "f.txt").read_bytes() == b"deep"
    assert (target / "x2" / "empty").is_dir() and not (target / "x").exists()
    os.rmdir(mp / "d2")
    assert sorted(os.listdir(target)) == ["x2"]
    unmount_ok(mounts, mp, env)


def test_fsync_is_durable_before_close(
    azurite, container, azure_store: ObjectStore, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    env = env_for(azurite, tmp_path, container)
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(tmp_path, mp, env)
    first, second = rng.randbytes(3 * MiB), rng.randbytes(MiB + 1)
    fd = os.open(mp / "log.bin", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.write(fd, first)
        os.fsync(fd)
        assert blob(azure_store, "out/log.bin") == first  # still open: durable already
        os.write(fd, second)
        assert os.pread(fd, 10, len(first)) == second[:10]  # reads see the writes
        with open(mp / "log.bin", "rb") as other:  # and so does another handle
            assert other.read() == first + second
        os.fsync(fd)
        assert blob(azure_store, "out/log.bin") == first + second
    finally:
        os.close(fd)
    unmount_ok(mounts, mp, env)


def test_transient_upload_failures_are_retried(
    azurite, container, azure_store: ObjectStore, tmp_path: Path, mounts: Mounts, proxy: FaultProxy
) -> None:  # noqa: ANN001
    env = env_for(azurite, tmp_path, container, via=proxy)
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(tmp_path, mp, env)
    small, big = rng.randbytes(1000), rng.randbytes(BLOCK_SIZE + 5)
    proxy.fail_writes(2)
    (mp / "small.bin").write_bytes(small)
    proxy.fail_writes(2)
    (mp / "big.bin").write_bytes(big)
    assert blob(azure_store, "out/small.bin") == small
    assert blob(azure_store, "out/big.bin") == big
    assert len([r for r in proxy.requests if r.injected == "fail"]) == 4
    unmount_ok(mounts, mp, env)
    assert mounts.stats("model")["fs"]["upload_failures"] == 0


def test_permanent_failure_eio_named_at_unmount_reuploaded_by_next_mount(
    azurite, container, tmp_path: Path, mounts: Mounts, proxy: FaultProxy
) -> None:  # noqa: ANN001
    env = env_for(azurite, tmp_path, container, via=proxy)
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(tmp_path, mp, env)
    body = rng.randbytes(2 * MiB + 1)
    proxy.deny_writes("out/model.bin")
    f = open(mp / "model.bin", "wb")  # noqa: SIM115
    f.write(body)
    with pytest.raises(OSError) as caught:
        os.fsync(f.fileno())
    assert caught.value.errno == errno.EIO
    with pytest.raises(OSError) as caught:
        f.close()
    assert caught.value.errno == errno.EIO
    (mp / "fine.txt").write_bytes(b"fine")  # other files still upload
    assert (mp / "model.bin").read_bytes() == body  # served from staging
    journal = json.loads((staging_dir(mounts) / "journal.json").read_text())["entries"]
    assert [(e["key"], e["state"]) for e in journal.values()] == [("out/model.bin", "failed")]

    out = unmount(mounts, mp, env)
    assert out.returncode == 4, out.stderr
    assert "out/model.bin" in out.stderr and "fine.txt" not in out.stderr
    assert "not uploaded, kept in staging" in runtime_log(mounts)
    store = store_on(azurite, container.container_name)
    try:
        assert [b.name for b in container.list_blobs()] == ["out/fine.txt"]
        # storage is fine again: the next mount with the same cache uploads it
        proxy.allow_writes("out/model.bin")
        mount_ok(tmp_path, mp, env)
        assert wait_for(lambda: "out/model.bin" in [b.name for b in container.list_blobs()])
        assert blob(store, "out/model.bin") == body
        assert store.stat("out/model.bin").content_md5 == md5(body)
        unmount_ok(mounts, mp, env)
    finally:
        store.close()
    assert "re-uploading out/model.bin" in runtime_log(mounts)
    assert mounts.stats("model")["fs"]["reuploads"] == 1
    assert list(staging_dir(mounts).glob("*.data")) == []


def test_sigkill_mid_write_then_remount_uploads_closed_files(
    azurite, container, tmp_path: Path, mounts: Mounts, proxy: FaultProxy
) -> None:  # noqa: ANN001
    env = env_for(azurite, tmp_path, container, via=proxy)
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(tmp_path, mp, env)
    a, b, c = rng.randbytes(5000), rng.randbytes(3 * MiB), b"half of a file"
    (mp / "a.bin").write_bytes(a)
    proxy.deny_writes("out/b.bin")  # storage refuses b for now: it stays staged
    with pytest.raises(OSError):
        (mp / "b.bin").write_bytes(b)
    writer = os.open(mp / "c.bin", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(writer, c)
    os.kill(mounts.daemon(mp), signal.SIGKILL)  # mid-write: c is still open
    with contextlib.suppress(OSError):
        os.close(writer)
    proxy.allow_writes("out/b.bin")
    assert wait_for(lambda: not alive(mounts.daemon(mp)))

    mount_ok(tmp_path, mp, env)  # clears the dead mount, re-uploads what was closed
    store = store_on(azurite, container.container_name)
    try:
        assert wait_for(lambda: "out/b.bin" in [x.name for x in container.list_blobs()])
        assert blob(store, "out/a.bin") == a and blob(store, "out/b.bin") == b
        assert (mp / "b.bin").read_bytes() == b
    finally:
        store.close()
    unmount_ok(mounts, mp, env)
    # c was never closed: not published, but kept in staging and named in the log
    assert "out/c.bin" not in [x.name for x in container.list_blobs()]
    assert [p.read_bytes() for p in staging_dir(mounts).glob("*.data")] == [c]
    assert "was still open for writing" in runtime_log(mounts)


@pytest.mark.slow
def test_unmount_of_a_killed_daemon_fails_and_names_what_is_staged(
    azurite, container, tmp_path: Path, mounts: Mounts, proxy: FaultProxy
) -> None:  # noqa: ANN001
    """kill -9 of an rw_mount daemon: `unmount` clears the stale mount, then
    exits 4 naming what its staging journal holds (a later mount with the
    same cache uploads the closed files); with nothing staged it still fails:
    writes in progress may be lost."""
    env = env_for(azurite, tmp_path, container, via=proxy)
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(tmp_path, mp, env)
    (mp / "a.bin").write_bytes(b"a")
    proxy.deny_writes("out/b.bin")  # closed, but storage refuses it: staged, to upload
    with pytest.raises(OSError):
        (mp / "b.bin").write_bytes(b"bbb")
    writer = os.open(mp / "c.bin", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(writer, b"half")
    pid = mounts.daemon(mp)
    os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.close(writer)
    assert wait_for(lambda: not alive(pid))
    out = datamount("unmount", str(mp), env=env)
    assert out.returncode == 4, out.stderr
    assert "cleared a stale mount" not in out.stdout
    err = out.stderr
    assert f"daemon (pid {pid}) died" in err and "a.bin" not in err, err
    assert "out/b.bin" in err and "uploads them" in err, err
    assert "out/c.bin ->" in err and "never closed" in err, err
    assert not mounted(mp) and not state_file(mounts.cache_dir, mp).exists()
    # the next mount with the same cache uploads b (closed), not c (never closed)
    proxy.allow_writes("out/b.bin")
    mount_ok(tmp_path, mp, env)
    assert wait_for(lambda: "out/b.bin" in [x.name for x in container.list_blobs()])
    unmount_ok(mounts, mp, env)
    assert sorted(x.name for x in container.list_blobs()) == ["out/a.bin", "out/b.bin"]

    # nothing staged at all: still not a clean unmount
    mount_ok(tmp_path, mp, env)
    (mp / "d.bin").write_bytes(b"d")
    pid = mounts.daemon(mp)
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: not alive(pid))
    out = datamount("unmount", str(mp), env=env)
    assert out.returncode == 4, out.stderr
    assert "died" in out.stderr and "may be lost" in out.stderr, out.stderr
    assert not mounted(mp)


def test_run_with_a_killed_rw_daemon_exits_4_and_registers_nothing(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    """`datamount run` whose rw_mount daemon dies under the command: the
    output is not a clean unmount, so the asset is not registered."""
    env = env_for(azurite, tmp_path, container)
    kill = (
        "import glob, json, os, signal\n"
        "for p in glob.glob(os.environ['DATAMOUNT_CACHE_DIR'] + '/mounts/*.json'):\n"
        "    if not p.endswith('.unsaved.json'):\n"
        "        os.kill(json.load(open(p))['pid'], signal.SIGKILL)\n"
    )
    (tmp_path / "kill.py").write_text(kill)
    job = tmp_path / "run.yaml"
    job.write_text(
        "type: command\nname: killed\n"
        f"command: echo x > ${{{{outputs.ckpt}}}}/f.txt && python3 {tmp_path / 'kill.py'} && sleep 1\n"
        "outputs:\n  ckpt: {type: uri_folder, mode: rw_mount, name: ckpt, "
        "path: 'azureml://datastores/store/paths/out/ckpt/'}\n"
    )
    workdir = tmp_path / "work"
    mp = mounts.point(workdir / "outputs" / "ckpt")
    out = datamount("run", str(job), "--workdir", str(workdir), env=env)
    assert out.returncode == 4, out.stderr
    assert "died before it was unmounted" in out.stderr, out.stderr
    assert "registered" not in out.stderr
    assert not (tmp_path / "ws.assets.yaml").exists()
    assert not mounted(mp)


@pytest.fixture
def small_cache(tmp_path: Path) -> Iterator[Path]:
    """The cache folder on its own 96 MiB tmpfs: free space that other work on
    the machine cannot move (the shared disk's moves by a GiB in seconds)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96m", "tmpfs", str(cache)], check=True)
    try:
        yield cache
    finally:
        subprocess.run(["umount", "-l", str(cache)], check=False)


@pytest.mark.slow
def test_reserve_reached_is_enospc_and_file_intact(
    azurite,
    container,
    azure_store: ObjectStore,
    tmp_path: Path,
    small_cache: Path,
    mounts: Mounts,
) -> None:  # noqa: ANN001
    env = env_for(azurite, tmp_path, container, DATASET_RESERVED_FREE_DISK_SPACE="40MB",
                  DATASET_MOUNT_BLOCK_FILE_CACHE_ENABLED="false")  # fmt: skip
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(tmp_path, mp, env)
    st = os.statvfs(mp)
    assert 40 * MiB < st.f_bavail * st.f_frsize < 57 * MiB  # df: what staging may use
    written = bytearray()
    fd = os.open(mp / "fill.bin", os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        with pytest.raises(OSError) as caught:
            for _ in range(100):  # 100 MiB: past the ~56 MiB left above the reserve
                chunk = rng.randbytes(MiB)
                written += chunk[: os.write(fd, chunk)]
        assert caught.value.errno == errno.ENOSPC
    finally:
        os.close(fd)  # what was written before the limit is uploaded, whole
    assert 40 * MiB < len(written) <= 56 * MiB
    assert blob(azure_store, "out/fill.bin") == bytes(written)
    assert (mp / "fill.bin").read_bytes() == bytes(written)
    unmount_ok(mounts, mp, env)


def test_sigterm_with_unsaved_writes_exits_4(
    azurite, container, tmp_path: Path, mounts: Mounts, proxy: FaultProxy
) -> None:  # noqa: ANN001
    env = env_for(azurite, tmp_path, container, via=proxy)
    mp = mounts.point(tmp_path / "mnt")
    proc = subprocess.Popen(
        [EXE, "mount", str(output_spec(tmp_path)), str(mp), "--foreground"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == f"{mp}\n"  # printed once the mount answers
        proxy.deny_writes("out/x.bin")
        with pytest.raises(OSError):
            (mp / "x.bin").write_bytes(b"x")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 4, err
    assert "out/x.bin" in err
    assert not mounted(mp)


def test_attribute_ttl_is_finite_by_default(
    azurite, container, azure_store: ObjectStore, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    env = env_for(azurite, tmp_path, container)
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(tmp_path, mp, env)
    (mp / "mine.txt").write_bytes(b"1")
    assert not (mp / "theirs.txt").exists()
    azure_store.put("out/theirs.txt", b"written elsewhere")  # another writer
    started = time.monotonic()
    assert wait_for(lambda: (mp / "theirs.txt").exists(), 10)
    assert time.monotonic() - started < 5  # 2 s in the daemon and the kernel
    assert (mp / "theirs.txt").read_bytes() == b"written elsewhere"
    unmount_ok(mounts, mp, env)


def test_concurrent_writers_and_readers(
    azurite, container, azure_store: ObjectStore, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    from concurrent.futures import ThreadPoolExecutor

    env = env_for(azurite, tmp_path, container)
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(tmp_path, mp, env)
    bodies = {f"w{t}/f{i}.bin": random.Random(t * 100 + i).randbytes(i * 70_001) for t in range(6)
              for i in range(8)}  # fmt: skip
    for t in range(6):
        os.mkdir(mp / f"w{t}")

    def work(t: int) -> None:
        for i in range(8):
            name = f"w{t}/f{i}.bin"
            with open(mp / name, "wb") as f:
                f.write(bodies[name])
            assert (mp / name).read_bytes() == bodies[name]

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(work, range(6)))
    for name, body in bodies.items():
        assert blob(azure_store, "out/" + name) == body, name
    unmount_ok(mounts, mp, env)


@pytest.mark.slow
def test_unmount_with_a_file_still_open_names_it_and_exits_4(
    azurite, container, azure_store: ObjectStore, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    env = env_for(azurite, tmp_path, container)
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(tmp_path, mp, env)
    (mp / "done.txt").write_bytes(b"done")
    fd = os.open(mp / "busy.bin", os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.write(fd, b"first")
        pid = mounts.daemon(mp)
        # Starting a process closes its copy of fd (close-on-exec): a flush, so
        # "first" is uploaded; what is written after it is not, once forced.
        proc = subprocess.Popen(
            [EXE, "unmount", str(mp), "--timeout", "2"], env=env, stderr=subprocess.PIPE, text=True
        )
        time.sleep(0.5)
        os.write(fd, b" and more")
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 4, err
        assert "out/busy.bin" in err and "done.txt" not in err
        assert wait_for(lambda: not alive(pid))
        assert not mounted(mp)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    assert blob(azure_store, "out/busy.bin") == b"first"
    assert blob(azure_store, "out/done.txt") == b"done"
    (staged,) = staging_dir(mounts).glob("*.data")
    assert staged.read_bytes() == b"first and more"
    # The message says what happens: never closed, kept there, not uploaded by a later mount.
    assert "never closed" in err and "not uploaded automatically" in err, err
    assert f"out/busy.bin -> {staged}" in err and "uploads them" not in err, err
    # ... and so it is: the next mount with the same cache leaves it alone.
    mount_ok(tmp_path, mp, env)
    unmount_ok(mounts, mp, env)
    assert blob(azure_store, "out/busy.bin") == b"first"
    assert staged.read_bytes() == b"first and more"
    assert "was still open for writing" in runtime_log(mounts)


def test_uri_file_output(
    azurite, container, azure_store: ObjectStore, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    azurite.seed(container, {"out/sibling.txt": b"not in this mount"})
    env = env_for(azurite, tmp_path, container)
    spec = tmp_path / "file.yaml"
    spec.write_text(
        "outputs:\n  model: {type: uri_file, "
        "path: 'azureml://datastores/store/paths/out/model.pkl', mode: rw_mount}\n"
    )
    mp = mounts.point(tmp_path / "mnt")
    out = datamount("mount", str(spec), str(mp), env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"{mp / 'model.pkl'}\n"
    assert os.listdir(mp) == []
    body = rng.randbytes(BLOCK_SIZE + 10)
    (mp / "model.pkl").write_bytes(body)
    assert os.listdir(mp) == ["model.pkl"]
    with pytest.raises(PermissionError):
        (mp / "other.txt").write_bytes(b"x")
    assert blob(azure_store, "out/model.pkl") == body
    assert azure_store.stat("out/model.pkl").content_md5 == md5(body)
    unmount_ok(mounts, mp, env)


def test_names_that_are_not_utf8_are_eilseq_named_once_and_never_staged(
    azurite, container, azure_store: ObjectStore, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    env = env_for(azurite, tmp_path, container)
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(tmp_path, mp, env)
    root = os.fsencode(mp)
    (mp / "a.txt").write_bytes(b"a")
    attempts = {
        "create": lambda: os.open(root + b"/\xff\xfe.bin", os.O_CREAT | os.O_WRONLY, 0o644),
        "mkdir": lambda: os.mkdir(root + b"/caf\xe9"),
        "rename": lambda: os.rename(root + b"/a.txt", root + b"/\x80.txt"),
    }
    for op, attempt in attempts.items():
        with pytest.raises(OSError) as info:
            attempt()
        assert info.value.errno == errno.EILSEQ, op
    with pytest.raises(FileNotFoundError):
        os.stat(root + b"/\xff")  # no blob can hold the name: a plain ENOENT
    assert sorted(os.listdir(mp)) == ["a.txt"]
    assert not any(staging_dir(mounts).glob("*.data"))  # nothing staged
    unmount_ok(mounts, mp, env)
    assert sorted(o.key for p in azure_store.list_pages("out/") for o in p.objects) == ["out/a.txt"]
    lines = [line for line in runtime_log(mounts).splitlines() if "EILSEQ" in line]
    assert [line.split("datamount.fuse: ")[1] for line in lines] == [
        "create: [Errno 84] name is not valid UTF-8, as Azure blob names must be: "
        "b'/\\xff\\xfe.bin' (errno EILSEQ)",
        "mkdir: [Errno 84] name is not valid UTF-8, as Azure blob names must be: "
        "b'/caf\\xe9' (errno EILSEQ)",
        "rename: [Errno 84] name is not valid UTF-8, as Azure blob names must be: "
        "b'/\\x80.txt' (errno EILSEQ)",
    ]
    assert "unexpected" not in runtime_log(mounts)
