"""ReadOnlyFS without a kernel: reads equal slices of the source, handles are
pinned to a version, directories stream with offsets, writes are EROFS."""

from __future__ import annotations

import errno
import os
import random
import stat
import threading
from collections.abc import Iterator

import pytest

from datamount.fs.access import mount_access
from datamount.fs.namespace import Namespace
from datamount.fs.ops import NS, ReadOnlyFS
from datamount.read.reader import DirectReader
from datamount.storage.base import ListPage
from datamount.storage.memory import MemoryStore

pytestmark = pytest.mark.unit

rng = random.Random(7)
BODY = rng.randbytes(300_001)


def make(objects: dict[str, bytes], **kw: object) -> tuple[MemoryStore, ReadOnlyFS]:
    store = MemoryStore(objects, **kw)  # type: ignore[arg-type]
    fs = ReadOnlyFS(Namespace(store, "ds"), DirectReader(store), store_id="mem",
                    access=mount_access(writable=False, uid=1, gid=2))  # fmt: skip
    return store, fs


def errno_of(fn, *args) -> int:  # noqa: ANN001
    with pytest.raises(OSError) as caught:
        fn(*args)
    return caught.value.errno


def test_getattr_and_statfs() -> None:
    store, fs = make({"ds/f.bin": BODY, "ds/sub/x": b"x"})
    st = fs.getattr("/f.bin")
    info = store.stat("ds/f.bin")
    assert st["st_mode"] == stat.S_IFREG | 0o444 and st["st_size"] == len(BODY)
    assert st["st_mtime"] == int(info.last_modified * NS)  # type: ignore[operator]
    assert (st["st_uid"], st["st_gid"], st["st_nlink"]) == (1, 2, 1)
    assert fs.getattr("/sub")["st_mode"] == stat.S_IFDIR | 0o555
    assert fs.getattr("/")["st_mode"] == stat.S_IFDIR | 0o555
    assert errno_of(fs.getattr, "/nope") == errno.ENOENT
    assert fs.statfs()["f_namemax"] == 255
    fs.access("/f.bin", os.R_OK)
    assert errno_of(fs.access, "/f.bin", os.W_OK) == errno.EROFS


def test_reads_are_slices_of_the_source() -> None:
    store, fs = make({"ds/f.bin": BODY, "ds/empty": b""})
    fh = fs.open("/f.bin", os.O_RDONLY).fh
    for _ in range(200):
        off = rng.randrange(len(BODY) + 10)
        size = rng.randrange(0, 140_000)
        assert fs.read(fh, off, size) == BODY[off : off + size]
    fs.release(fh)
    fh = fs.open("/empty", os.O_RDONLY).fh
    assert fs.read(fh, 0, 4096) == b""
    fs.release(fh)
    c = fs.counters()
    assert c["opens"] == 2 and c["open_files"] == 0 and c["reads"] == 201


def test_concurrent_reads_on_independent_handles() -> None:
    store, fs = make({f"ds/f{i}": rng.randbytes(50_000 + i) for i in range(4)})
    errors: list[BaseException] = []

    def reader(i: int) -> None:
        try:
            body = store.data(f"ds/f{i}")
            fh = fs.open(f"/f{i}", os.O_RDONLY).fh
            r = random.Random(i)
            for _ in range(100):
                off, size = r.randrange(len(body)), r.randrange(1, 9000)
                assert fs.read(fh, off, size) == body[off : off + size]
            fs.release(fh)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(i % 4,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_handle_pinned_to_its_version_then_estale() -> None:
    store, fs = make({"ds/f.bin": b"old version!"})
    first = fs.open("/f.bin", os.O_RDONLY)
    assert not first.keep_cache  # nothing of this version in the page cache yet
    assert fs.read(first.fh, 0, 3) == b"old"
    again = fs.open("/f.bin", os.O_RDONLY)
    assert again.keep_cache  # same version as the last open: keep the kernel's pages
    store.put("ds/f.bin", b"NEW VERSION, LONGER")
    # Never a mix: the pinned handle fails rather than serve new bytes.
    assert errno_of(fs.read, first.fh, 3, 5) == errno.ESTALE
    assert fs.counters()["stale_reads"] == 1
    # The stale name was forgotten: the next open pins the new version, with
    # the kernel's pages of the old one dropped.
    fresh = fs.open("/f.bin", os.O_RDONLY)
    assert not fresh.keep_cache
    assert fs.read(fresh.fh, 0, 100) == b"NEW VERSION, LONGER"
    assert fs.getattr("/f.bin")["st_size"] == 19
    store.delete("ds/f.bin")
    assert errno_of(fs.read, fresh.fh, 0, 1) == errno.ESTALE
    for h in (first, again, fresh):
        fs.release(h.fh)


def test_open_errors() -> None:
    store, fs = make({"ds/f.bin": b"x", "ds/d/y": b"y"})
    for flags in (os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_TRUNC, os.O_RDONLY | os.O_APPEND):
        assert errno_of(fs.open, "/f.bin", flags) == errno.EROFS
    assert errno_of(fs.open, "/d", os.O_RDONLY) == errno.EISDIR
    assert errno_of(fs.open, "/missing", os.O_RDONLY) == errno.ENOENT
    assert errno_of(fs.opendir, "/f.bin") == errno.ENOTDIR
    assert errno_of(fs.read, 999, 0, 1) == errno.EBADF
    fs.release(999)  # unknown handles are ignored


@pytest.mark.parametrize(
    "op,args",
    [
        ("write", ("/f.bin", b"x", 0, 1)),
        ("create", ("/new", 0o644)),
        ("mkdir", ("/newdir", 0o755)),
        ("mknod", ("/node", 0o644, 0)),
        ("unlink", ("/f.bin",)),
        ("rmdir", ("/d",)),
        ("rename", ("/f.bin", "/g.bin")),
        ("link", ("/l", "/f.bin")),
        ("symlink", ("/s", "/f.bin")),
        ("truncate", ("/f.bin", 0)),
        ("chmod", ("/f.bin", 0o777)),
        ("chown", ("/f.bin", 0, 0)),
        ("utimens", ("/f.bin", None)),
        ("setxattr", ("/f.bin", "user.x", b"1", 0)),
        ("removexattr", ("/f.bin", "user.x")),
        ("fallocate", ("/f.bin", 0, 0, 10)),
    ],
)
def test_every_write_is_erofs(op: str, args: tuple[object, ...]) -> None:
    store, fs = make({"ds/f.bin": b"x", "ds/d/y": b"y"})
    assert errno_of(getattr(fs, op), *args) == errno.EROFS
    assert store.requests["put"] == store.requests["delete"] == 0


def test_readdir_offsets_stream_and_resume() -> None:
    store, fs = make({f"ds/big/{i:05d}": b"" for i in range(20_000)}, page_size=1000)
    dh = fs.opendir("/big")
    entries = fs.readdir(dh, 0)
    head = [next(entries) for _ in range(12)]
    assert [name for name, _, _ in head[:3]] == [".", "..", "00000"]
    assert [off for _, _, off in head] == list(range(1, 13))
    # Streaming: the caller has entries while 19 of 20 pages are not asked for yet.
    assert store.requests["list"] == 2  # the lookup of 'big' and the first page
    # The kernel resumes from the offset of the last entry it kept...
    resumed = fs.readdir(dh, 7)
    assert next(resumed)[0] == head[7][0]
    # ...or rewinds; both replay the same entries.
    names = [name for name, _, _ in fs.readdir(dh, 0)]
    assert names[:2] == [".", ".."] and names[2:] == [f"{i:05d}" for i in range(20_000)]
    fs.releasedir(dh)
    assert errno_of(fs.readdir, dh, 0) == errno.EBADF


def test_readdir_carries_attributes() -> None:
    store, fs = make({"ds/f.bin": b"12345", "ds/d/x": b""})
    dh = fs.opendir("/")
    entries = {name: st for name, st, _ in fs.readdir(dh, 0)}
    assert entries["f.bin"]["st_size"] == 5
    assert stat.S_ISDIR(entries["d"]["st_mode"]) and stat.S_ISDIR(entries["."]["st_mode"])


class FailingSecondPage(MemoryStore):
    def list_pages(self, prefix: str, *, delimiter: str | None = None) -> Iterator[ListPage]:
        for n, page in enumerate(super().list_pages(prefix, delimiter=delimiter)):
            if n == 1:
                raise OSError(errno.EIO, "listing failed")
            yield page


def test_a_failed_listing_page_fails_readdir_every_time() -> None:
    store = FailingSecondPage({f"ds/{i:03d}": b"" for i in range(10)}, page_size=4)
    fs = ReadOnlyFS(Namespace(store, "ds"), DirectReader(store), store_id="mem")
    dh = fs.opendir("/")
    got = []
    with pytest.raises(OSError) as caught:
        for name, _, _ in fs.readdir(dh, 0):
            got.append(name)
    # '.', '..' and page one (its last file waits to know it is not shadowed by 'name/').
    assert caught.value.errno == errno.EIO and got == [".", "..", "000", "001", "002"]
    assert errno_of(lambda: list(fs.readdir(dh, 5))) == errno.EIO  # not a silent short listing


def test_wait_idle_drains_open_files() -> None:
    store, fs = make({"ds/f.bin": b"x"})
    fh = fs.open("/f.bin", os.O_RDONLY).fh
    assert not fs.wait_idle(0.05)
    threading.Timer(0.1, fs.release, args=(fh,)).start()
    assert fs.wait_idle(5)


def test_no_write_side_and_blob_metadata_is_erofs() -> None:
    store, fs = make({"ds/f.bin": b"x"})
    assert fs.writes is None  # the daemon has nothing to finish; mounted ro
    for call, args in [(fs.chmod, ("/f.bin", 0o777)), (fs.chown, ("/f.bin", 1, 1)),
                       (fs.utimens, ("/f.bin", None)), (fs.link, ("/l", "/f.bin")),
                       (fs.symlink, ("/s", "/f.bin")), (fs.mknod, ("/n", 0o644, 0)),
                       (fs.setxattr, ("/f.bin", "user.a", b"1", 0)),
                       (fs.removexattr, ("/f.bin", "user.a")),
                       (fs.fallocate, ("/f.bin", 0, 0, 1))]:  # fmt: skip
        assert errno_of(call, *args) == errno.EROFS
    fh = fs.open("/f.bin", os.O_RDONLY).fh
    buf = bytearray(4)
    assert fs.read_into(fh, 0, memoryview(buf)) == 1 and buf[:1] == b"x"
    fs.release(fh)


def test_a_name_that_is_not_utf8_is_not_there_without_a_request() -> None:
    store, fs = make({"ds/a.txt": b"a"})
    store.requests.clear()
    bad = os.fsdecode(b"/\xff\xfe.bin")  # FUSE hands paths over with surrogateescape
    assert errno_of(fs.getattr, bad) == errno.ENOENT  # was EIO: the request could not encode
    assert errno_of(fs.open, bad, os.O_RDONLY) == errno.ENOENT
    assert store.total_requests == 0
    assert fs.getattr("/a.txt")["st_size"] == 1
