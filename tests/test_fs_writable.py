"""WritableFS and WriteBack without a kernel, over a MemoryStore: what is
written is what storage holds (bytes equal, content MD5 set), reads of a file
being written see the writes, names change in storage, failed uploads are EIO
and stay staged in the journal, a new WriteBack over the same folder uploads
them, and the free-space reserve gives ENOSPC without changing the file."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import stat
from pathlib import Path

import pytest

from datamount.fs.access import mount_access
from datamount.fs.folders import LocalFolders, MarkerFolders, folders_for
from datamount.fs.namespace import Namespace
from datamount.fs.writable import WritableFS
from datamount.read.reader import DirectReader
from datamount.storage.base import ObjectStore
from datamount.storage.local import LocalStore
from datamount.storage.memory import MemoryStore
from datamount.write.journal import Leftovers, journal_leftovers
from datamount.write.writeback import JOURNAL, WriteBack, WriteBackOptions
from faults import FaultPlan, FaultyStore, forbidden

pytestmark = pytest.mark.unit

BLOCK = 1024
rng = random.Random(11)
W = os.O_WRONLY


def make(
    store: ObjectStore, staging: Path, *, reserve: int = 0, ttl: float | None = 2.0
) -> WritableFS:
    writeback = WriteBack(
        store,
        staging,
        WriteBackOptions(block_size=BLOCK, threads=4, reserved_free_disk_space=reserve),
    )
    namespace = Namespace(store, "out", ttl=ttl)
    return WritableFS(namespace, DirectReader(store), writeback, store_id="mem",
                      access=mount_access(writable=True, uid=0, gid=0))  # fmt: skip


def errno_of(fn, *args) -> int:  # noqa: ANN001
    with pytest.raises(OSError) as caught:
        fn(*args)
    return caught.value.errno


def write_file(fs: WritableFS, path: str, body: bytes, chunk: int = 700) -> None:
    fh = fs.create(path, 0o644, W).fh
    for off in range(0, len(body), chunk):
        assert fs.write(path, body[off : off + chunk], off, fh) == len(body[off : off + chunk])
    fs.flush(fh)
    fs.release(fh)


def md5(data: bytes) -> bytes:
    return hashlib.md5(data, usedforsecurity=False).digest()


@pytest.mark.parametrize("size", [0, 1, BLOCK, BLOCK + 1, 5 * BLOCK + 3])
def test_sizes_sequential_and_random(tmp_path: Path, size: int) -> None:
    store = MemoryStore()
    fs = make(store, tmp_path / "staging")
    body = rng.randbytes(size)
    write_file(fs, "/seq.bin", body)
    assert store.data("out/seq.bin") == body
    assert store.stat("out/seq.bin").content_md5 == md5(body)
    assert store.requests["stage_block"] == (0 if size <= BLOCK else -(-size // BLOCK))
    # random offsets: pieces written out of order
    fh = fs.create("/rand.bin", 0o644, W).fh
    pieces = [(off, body[off : off + 333]) for off in range(0, size, 333)]
    rng.shuffle(pieces)
    for off, piece in pieces:
        fs.write("/rand.bin", piece, off, fh)
    assert fs.read(fh, 0, size + 10) == body  # the same handle reads its writes
    fs.flush(fh)
    fs.release(fh)
    assert store.data("out/rand.bin") == body
    assert fs.getattr("/rand.bin")["st_size"] == size
    opened = fs.open("/rand.bin", os.O_RDONLY)
    assert fs.read(opened.fh, 0, size + 1) == body
    fs.release(opened.fh)
    assert list((tmp_path / "staging").glob("*.data")) == []  # nothing left staged


def test_reads_of_a_file_being_written_from_another_handle(tmp_path: Path) -> None:
    store = MemoryStore({"out/a.txt": b"old content"})
    fs = make(store, tmp_path / "s")
    before = fs.open("/a.txt", os.O_RDONLY).fh  # opened before the writer
    writer = fs.open("/a.txt", os.O_RDWR).fh  # no O_TRUNC: the old bytes copied in
    fs.write("/a.txt", b"NEW", 0, writer)
    other = fs.open("/a.txt", os.O_RDONLY).fh
    assert fs.read(other, 0, 100) == b"NEW content"
    assert fs.read(before, 0, 100) == b"NEW content"
    assert fs.read(writer, 0, 100) == b"NEW content"
    assert store.data("out/a.txt") == b"old content"  # nothing uploaded before the flush
    assert fs.getattr("/a.txt")["st_size"] == 11
    fs.fsync(writer)
    assert store.data("out/a.txt") == b"NEW content"
    for fh in (before, writer, other):
        fs.release(fh)
    assert store.requests["put"] == 1  # released clean: no second upload


def test_open_flags_append_trunc_and_truncate(tmp_path: Path) -> None:
    store = MemoryStore({"out/f": b"0123456789"})
    fs = make(store, tmp_path / "s")
    fh = fs.open("/f", os.O_WRONLY | os.O_APPEND).fh
    fs.write("/f", b"AB", 10, fh)  # the kernel gives O_APPEND writes the end offset
    fs.flush(fh)
    fs.release(fh)
    assert store.data("out/f") == b"0123456789AB"
    fs.truncate("/f", 4)  # no handle open: published at once
    assert store.data("out/f") == b"0123"
    fs.truncate("/f", 6)
    assert store.data("out/f") == b"0123\0\0"
    fh = fs.open("/f", os.O_WRONLY | os.O_TRUNC).fh
    fs.flush(fh)
    fs.release(fh)
    assert store.data("out/f") == b""
    fh = fs.open("/f", os.O_RDWR).fh  # opened for writing, nothing written: no upload
    puts = store.requests["put"]
    fs.flush(fh)
    fs.release(fh)
    assert store.requests["put"] == puts


def test_mkdir_rmdir_unlink_rename(tmp_path: Path) -> None:
    store = MemoryStore({"out/d/x": b"x", "out/d/sub/y": b"yy", "out/f": b"f"})
    fs = make(store, tmp_path / "s")
    fs.mkdir("/empty", 0o755)
    assert store.stat("out/empty/").size == 0  # the folder marker
    assert fs.getattr("/empty")["st_mode"] & 0o040000
    assert "empty" in [n for n, _, _ in fs.readdir(fs.opendir("/"), 0)]
    assert errno_of(fs.mkdir, "/empty", 0o755) == errno.EEXIST
    assert errno_of(fs.mkdir, "/nope/x", 0o755) == errno.ENOENT
    assert errno_of(fs.rmdir, "/d") == errno.ENOTEMPTY
    assert errno_of(fs.rmdir, "/f") == errno.ENOTDIR
    assert errno_of(fs.unlink, "/d") == errno.EISDIR
    fs.rmdir("/empty")
    assert errno_of(fs.getattr, "/empty") == errno.ENOENT
    assert [o.key for p in store.list_pages("out/empty") for o in p.objects] == []

    fs.rename("/f", "/g")
    assert store.data("out/g") == b"f"
    assert errno_of(store.stat, "out/f") == errno.ENOENT
    fs.rename("/d", "/e")
    keys = sorted(o.key for p in store.list_pages("out/") for o in p.objects)
    assert keys == ["out/e/sub/y", "out/e/x", "out/g"]
    assert fs.getattr("/e/sub/y")["st_size"] == 2
    assert errno_of(fs.getattr, "/d/x") == errno.ENOENT
    fs.mkdir("/t", 0o755)
    assert errno_of(fs.rename, "/g", "/t") == errno.EISDIR
    assert errno_of(fs.rename, "/e", "/g") == errno.ENOTDIR
    fs.rename("/e", "/t")  # onto an empty folder: replaces it
    assert store.data("out/t/x") == b"x"
    fs.unlink("/g")
    assert errno_of(store.stat, "out/g") == errno.ENOENT
    assert errno_of(fs.unlink, "/g") == errno.ENOENT
    # chmod / chown / utimens: accepted, ignored
    assert fs.chmod("/t/x", 0o600) == fs.chown("/t/x", 1, 1) == fs.utimens("/t/x", None) == 0


def test_backslash_names_are_einval_and_files_show_the_mount_modes(tmp_path: Path) -> None:
    store = MemoryStore({"out/f": b"f"})
    fs = make(store, tmp_path / "s")
    assert errno_of(fs.create, "/back\\slash", 0o644, W) == errno.EINVAL
    assert errno_of(fs.mkdir, "/back\\dir", 0o755) == errno.EINVAL
    assert errno_of(fs.rename, "/f", "/g\\h") == errno.EINVAL
    assert [o.key for p in store.list_pages("out/") for o in p.objects] == ["out/f"]
    assert [n for n, _, _ in fs.readdir(fs.opendir("/"), 0) if n not in (".", "..")] == ["f"]
    # blobs have no mode: files show 0755 (a script written here can run), as do folders
    write_file(fs, "/run.sh", b"#!/bin/sh\necho hi\n")
    fs.mkdir("/d", 0o700)
    assert fs.getattr("/run.sh")["st_mode"] == stat.S_IFREG | 0o755
    assert fs.getattr("/f")["st_mode"] == stat.S_IFREG | 0o755
    assert fs.getattr("/d")["st_mode"] == stat.S_IFDIR | 0o755
    assert fs.chmod("/run.sh", 0o600) == 0  # accepted, changes nothing
    assert fs.getattr("/run.sh")["st_mode"] == stat.S_IFREG | 0o755


def test_local_store_folders_are_directories(tmp_path: Path) -> None:
    """On a local output path a folder is a directory: no marker blobs."""
    root = tmp_path / "root"
    store = LocalStore(root)
    fs = make(store, tmp_path / "s")
    fs.mkdir("/d2", 0o755)  # the output folder itself did not exist yet
    assert (root / "out" / "d2").is_dir()
    assert fs.getattr("/d2")["st_mode"] & 0o040000
    for p in ("/x", "/x/y", "/x/y/z"):
        fs.mkdir(p, 0o755)
    write_file(fs, "/x/y/z/f.txt", b"deep")
    fs.mkdir("/x/empty", 0o755)
    fs.rename("/x", "/x2")
    assert not (root / "out" / "x").exists()
    assert (root / "out" / "x2" / "y" / "z" / "f.txt").read_bytes() == b"deep"
    assert (root / "out" / "x2" / "empty").is_dir()  # empty folders move too
    assert sorted(n for n, _, _ in fs.readdir(fs.opendir("/x2"), 0) if n not in (".", "..")) == [
        "empty",
        "y",
    ]
    assert errno_of(fs.getattr, "/x/y") == errno.ENOENT
    write_file(fs, "/a.txt", b"a")
    fs.rename("/a.txt", "/d2/b.txt")
    assert (root / "out" / "d2" / "b.txt").read_bytes() == b"a"
    assert errno_of(fs.rmdir, "/d2") == errno.ENOTEMPTY
    fs.unlink("/d2/b.txt")
    fs.rmdir("/d2")
    fs.rmdir("/x2/empty")
    assert sorted(os.listdir(root / "out")) == ["x2"]
    assert sorted(os.listdir(root / "out" / "x2")) == ["y"]


def test_folders_follow_the_stores_declared_local_path(tmp_path: Path) -> None:
    local = LocalStore(tmp_path / "root")
    chosen = folders_for(local)
    assert isinstance(chosen, LocalFolders)
    chosen.make("out/new")  # a directory, not a marker blob
    assert (tmp_path / "root" / "out" / "new").is_dir()
    assert local.local_path("out/new") == str(tmp_path / "root" / "out" / "new")
    assert isinstance(folders_for(MemoryStore()), MarkerFolders)
    # A fault wrapper declares no local path: its folders go through its requests.
    assert isinstance(folders_for(FaultyStore(local)), MarkerFolders)


def test_rename_and_unlink_of_open_files(tmp_path: Path) -> None:
    store = MemoryStore()
    fs = make(store, tmp_path / "s")
    fh = fs.create("/tmp.part", 0o644, W).fh
    fs.write("/tmp.part", b"data", 0, fh)
    fs.rename("/tmp.part", "/final")  # still open, never uploaded: nothing to copy
    assert fs.getattr("/final")["st_size"] == 4
    fs.flush(fh)
    fs.release(fh)
    assert store.data("out/final") == b"data"
    assert errno_of(store.stat, "out/tmp.part") == errno.ENOENT
    fh = fs.create("/gone", 0o644, W).fh
    fs.write("/gone", b"zz", 0, fh)
    fs.unlink("/gone")
    fs.write("/gone", b"!", 2, fh)
    assert fs.read(fh, 0, 10) == b"zz!"  # the open handle keeps its bytes
    fs.flush(fh)
    fs.release(fh)
    assert errno_of(store.stat, "out/gone") == errno.ENOENT
    assert not fs.finish_writes(1.0)  # nothing pending: it was unlinked
    assert list((tmp_path / "s").glob("*.data")) == []


def test_failed_upload_is_eio_kept_in_journal_and_recovered(tmp_path: Path) -> None:
    inner = MemoryStore()
    plan = FaultPlan().fail("put", times=None, error=forbidden())
    fs = make(FaultyStore(inner, plan), tmp_path / "s")
    fh = fs.create("/model.pt", 0o644, W).fh
    fs.write("/model.pt", b"weights", 0, fh)
    assert errno_of(fs.flush, fh) == errno.EIO
    fs.release(fh)
    assert fs.counters()["upload_failures"] >= 1
    journal = json.loads((tmp_path / "s" / JOURNAL).read_text())["entries"]
    assert [e["key"] for e in journal.values()] == ["out/model.pt"]
    assert [e["state"] for e in journal.values()] == ["failed"]
    opened = fs.open("/model.pt", os.O_RDONLY)  # still readable from staging
    assert fs.read(opened.fh, 0, 100) == b"weights"
    fs.release(opened.fh)
    left = fs.finish_writes(1.0)
    assert [k for k, _ in left.to_upload] == ["out/model.pt"] and not left.never_closed
    assert "a new mount of this output with the same cache folder uploads them" in left.describe()
    fs.close()
    assert journal_leftovers(tmp_path / "s") == left  # what `unmount` reads after a crash

    # the next mount with the same staging folder uploads it
    fs2 = make(inner, tmp_path / "s")
    assert fs2.start_recovery() == 1
    assert not fs2.finish_writes(5.0)
    assert inner.data("out/model.pt") == b"weights"
    assert fs2.counters()["reuploads"] == 1
    assert json.loads((tmp_path / "s" / JOURNAL).read_text())["entries"] == {}
    assert list((tmp_path / "s").glob("*.data")) == []


def test_transient_failures_are_retried(tmp_path: Path) -> None:
    from datamount.storage.retry import RetryPolicy

    inner = MemoryStore()
    plan = FaultPlan().fail("stage_block", times=2).fail("commit_blocks", times=1)
    store = FaultyStore(inner, plan, retry=RetryPolicy(retries=3, sleep=lambda s: None))
    fs = make(store, tmp_path / "s")
    body = rng.randbytes(4 * BLOCK + 5)
    write_file(fs, "/x", body)
    assert inner.data("out/x") == body
    assert store.failures["stage_block"] == 2 and store.failures["commit_blocks"] == 1


def test_open_when_daemon_died_is_kept_not_uploaded(tmp_path: Path) -> None:
    store = MemoryStore()
    fs = make(store, tmp_path / "s")
    fh = fs.create("/half", 0o644, W).fh
    fs.write("/half", b"half written", 0, fh)
    # a forced unmount: the file is still open, so it is named as never closed,
    # where its bytes are, and that no later mount uploads it
    left = fs.finish_writes(0.5)
    (staged,) = (tmp_path / "s").glob("*.data")
    assert left == Leftovers(never_closed=(("out/half", str(staged)),))
    message = left.describe()
    assert "never closed" in message and "not uploaded automatically" in message
    assert f"out/half -> {staged}" in message and "uploads them" not in message
    fs.close()  # the daemon stops with the file open
    assert journal_leftovers(tmp_path / "s") == left
    fs2 = make(store, tmp_path / "s")
    assert fs2.start_recovery() == 0
    assert not fs2.finish_writes(1.0)  # abandoned: named in the log, not pending
    assert errno_of(store.stat, "out/half") == errno.ENOENT
    assert [p.read_bytes() for p in (tmp_path / "s").glob("*.data")] == [b"half written"]


def test_reserve_gives_enospc_and_keeps_the_file(tmp_path: Path) -> None:
    store = MemoryStore({"out/keep": b"original"})
    st = os.statvfs(tmp_path)
    free = st.f_bavail * st.f_frsize
    fs = make(store, tmp_path / "s", reserve=free - 8 * 1024 * 1024)
    fh = fs.open("/keep", os.O_RDWR).fh
    fs.write("/keep", b"ORIG", 0, fh)
    assert errno_of(fs.write, "/keep", b"x" * (64 * 1024 * 1024), 4, fh) == errno.ENOSPC
    assert fs.read(fh, 0, 100) == b"ORIGinal"  # the failed write changed nothing
    fs.flush(fh)
    fs.release(fh)
    assert store.data("out/keep") == b"ORIGinal"
    assert fs.statfs()["f_bavail"] * 4096 < 16 * 1024 * 1024


def test_links_and_special_files_are_refused(tmp_path: Path) -> None:
    store = MemoryStore({"out/f": b"f"})
    fs = make(store, tmp_path / "s")
    assert errno_of(fs.link, "/l", "/f") == errno.EPERM
    assert errno_of(fs.symlink, "/s", "/f") == errno.EPERM
    assert errno_of(fs.mknod, "/n", 0o644, 0) == errno.EOPNOTSUPP
    assert errno_of(fs.fallocate, "/f", 0, 0, 10) == errno.EOPNOTSUPP
    assert store.requests["put"] == 0


def test_copy_in_failure_leaves_nothing_staged(tmp_path: Path) -> None:
    inner = MemoryStore({"out/a": b"secret"})
    store = FaultyStore(inner, FaultPlan().fail("read", times=None, error=forbidden()))
    fs = make(store, tmp_path / "s")
    assert errno_of(fs.open, "/a", os.O_RDWR) == errno.EACCES
    assert list((tmp_path / "s").glob("*.data")) == []
    assert fs.getattr("/a")["st_size"] == 6
    fh = fs.open("/a", os.O_WRONLY | os.O_TRUNC).fh  # no copy needed: works
    fs.write("/a", b"new", 0, fh)
    fs.flush(fh)
    fs.release(fh)
    assert inner.data("out/a") == b"new"


@pytest.mark.parametrize("seed", range(5))
def test_random_operations_match_a_model(tmp_path: Path, seed: int) -> None:
    """Writes, truncates, flushes and reads over several handles of one file
    behave like a bytearray; storage holds the model after every flush."""
    r = random.Random(seed)
    store = MemoryStore({"out/f": r.randbytes(r.randrange(0, 3 * BLOCK))})
    fs = make(store, tmp_path / "s")
    model = bytearray(store.data("out/f"))
    handles = [fs.open("/f", os.O_RDWR).fh for _ in range(3)]
    reader = fs.open("/f", os.O_RDONLY).fh
    for _ in range(60):
        op = r.random()
        fh = r.choice(handles)
        if op < 0.5:
            off = r.randrange(0, len(model) + BLOCK)
            data = r.randbytes(r.randrange(1, 2 * BLOCK))
            fs.write("/f", data, off, fh)
            if off > len(model):
                model.extend(b"\0" * (off - len(model)))
            model[off : off + len(data)] = data
        elif op < 0.6:
            length = r.randrange(0, len(model) + BLOCK)
            fs.truncate("/f", length)
            model = model[:length] + b"\0" * max(0, length - len(model))
        elif op < 0.75:
            fs.flush(fh)
            assert store.data("out/f") == bytes(model)
        else:
            off = r.randrange(0, len(model) + 1)
            n = r.randrange(0, 3 * BLOCK)
            assert fs.read(r.choice([*handles, reader]), off, n) == bytes(model[off : off + n])
        assert fs.getattr("/f")["st_size"] == len(model)
    for fh in [*handles, reader]:
        fs.release(fh)
    assert store.data("out/f") == bytes(model)
    assert store.stat("out/f").content_md5 == md5(bytes(model))
    assert list((tmp_path / "s").glob("*.data")) == []


def test_uri_file_mount_holds_its_one_name(tmp_path: Path) -> None:
    store = MemoryStore({"out/other.txt": b"not shown"})
    writeback = WriteBack(store, tmp_path / "s", WriteBackOptions(block_size=BLOCK))
    namespace = Namespace(store, "", file_key="out/model.pkl", ttl=2.0)
    fs = WritableFS(namespace, DirectReader(store), writeback, store_id="mem")
    assert [n for n, _, _ in fs.readdir(fs.opendir("/"), 0)] == [".", ".."]
    write_file(fs, "/model.pkl", b"v1")
    assert store.data("out/model.pkl") == b"v1"
    assert [n for n, _, _ in fs.readdir(fs.opendir("/"), 0)] == [".", "..", "model.pkl"]
    fh = fs.open("/model.pkl", os.O_WRONLY | os.O_APPEND).fh
    fs.write("/model.pkl", b"+v2", 2, fh)
    fs.flush(fh)
    fs.release(fh)
    assert store.data("out/model.pkl") == b"v1+v2"
    assert errno_of(fs.create, "/other.txt", 0o644, W) == errno.EACCES
    assert errno_of(fs.mkdir, "/d", 0o755) == errno.EACCES
    assert errno_of(fs.rename, "/model.pkl", "/m2") == errno.EACCES
    assert errno_of(fs.getattr, "/other.txt") == errno.ENOENT
    fs.unlink("/model.pkl")
    assert errno_of(store.stat, "out/model.pkl") == errno.ENOENT


def test_one_daemon_per_staging_folder(tmp_path: Path) -> None:
    from datamount.errors import OutputError

    first = WriteBack(MemoryStore(), tmp_path / "s", WriteBackOptions())
    with pytest.raises(
        OutputError, match=f"in use by another mount of this output \\(pid {os.getpid()}\\)"
    ):
        WriteBack(MemoryStore(), tmp_path / "s", WriteBackOptions())
    first.close()
    WriteBack(MemoryStore(), tmp_path / "s", WriteBackOptions()).close()


def test_one_handle_table_and_the_write_side_for_the_daemon(tmp_path: Path) -> None:
    store = MemoryStore({"out/f": b"stored"})
    fs = make(store, tmp_path / "s")
    assert fs.writes is fs  # what the daemon finishes at unmount
    reading = fs.open("/f", os.O_RDONLY).fh
    writing = fs.create("/g", 0o644, W).fh
    assert fs.write("/g", b"staged bytes", 0, writing) == 12
    # a read-only handle refuses writes; a staged handle reads into a buffer
    assert errno_of(fs.write, "/f", b"x", 0, reading) == errno.EBADF
    assert errno_of(fs.ftruncate, reading, 0) == errno.EBADF
    buf = bytearray(20)
    assert fs.read_into(writing, 7, memoryview(buf)) == 5 and buf[:5] == b"bytes"
    assert fs.read_into(reading, 0, memoryview(buf)) == 6 and buf[:6] == b"stored"
    assert fs.fgetattr(writing)["st_size"] == 12 and fs.fgetattr(reading)["st_size"] == 6
    c = fs.counters()
    assert c["open_files"] == 2 and c["opens"] == 2 and c["writes"] == 1
    assert not fs.wait_idle(0.05)  # open handles, staged or not, keep the mount busy
    # flush / fsync / release of a handle that is not open: nothing to do
    for call in (fs.flush, fs.fsync, fs.release):
        call(999)
    assert errno_of(fs.write, "/g", b"x", 0, 999) == errno.EBADF
    assert errno_of(fs.fgetattr, 999) == errno.EBADF
    fs.release(writing)  # the last handle of a dirty file uploads it
    fs.release(reading)
    assert store.data("out/g") == b"staged bytes" and fs.wait_idle(1)
    assert not fs.finish_writes(1)
    fs.close()
