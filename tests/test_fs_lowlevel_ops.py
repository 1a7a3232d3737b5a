"""What the native loop calls (fs.lowlevel.Ops), without a mount: one errno
funnel (an OSError keeps its errno, anything else is EIO with its traceback
logged), keep_cache from the ops' decision, the mount options, and a
writable filesystem's names and writes."""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Iterator

import pytest

from datamount.fs import _lowlevel
from datamount.fs.lowlevel import Ops, _options
from datamount.fs.namespace import Namespace
from datamount.fs.ops import ReadOnlyFS
from datamount.read.reader import DirectReader
from datamount.storage.base import ListPage
from datamount.storage.memory import MemoryStore

pytestmark = pytest.mark.unit


class Broken(MemoryStore):
    def list_pages(self, prefix: str, *, delimiter: str | None = None) -> Iterator[ListPage]:
        raise RuntimeError("a bug, not an OSError")


def read_only(store: MemoryStore, ttl: float | None = None) -> ReadOnlyFS:
    return ReadOnlyFS(Namespace(store, "ds", ttl=ttl), DirectReader(store), store_id="mem")


def test_oserrors_keep_their_errno() -> None:
    ops = Ops(read_only(MemoryStore({"ds/f": b"x"})), on_ready=lambda: None)
    assert ops.getattr("/missing") == -errno.ENOENT
    assert ops.mkdir("/d", 0o755) == -errno.EROFS
    assert ops.write(1, b"x", 0) == -errno.EROFS
    assert ops.rename("/f", "/g") == -errno.EROFS
    assert ops.setattr("/f", 0, _lowlevel.SET_ATTR_MODE, 0o600, 0, 0, 0) == -errno.EROFS


def test_unexpected_exceptions_become_eio_with_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ops = Ops(read_only(Broken({"ds/f": b"x"})), on_ready=lambda: None)
    with caplog.at_level(logging.ERROR, logger="datamount.fuse"):
        assert ops.getattr("/f") == -errno.EIO
        dh = ops.opendir("/")  # the root needs no request
        assert ops.readdir(dh, 0, 4096, True) == -errno.EIO  # raised while listing
    assert "RuntimeError: a bug, not an OSError" in caplog.text  # the traceback is logged


def test_open_sets_keep_cache_and_read_uses_the_handle() -> None:
    ops = Ops(read_only(MemoryStore({"ds/f": b"hello world"})), on_ready=lambda: None)
    fh, keep, changed, blocks = ops.open("/f", os.O_RDONLY)
    assert (keep, changed, blocks) == (False, None, None)  # first open of this version
    buf = bytearray(5)
    assert ops.read_into(fh, 6, memoryview(buf)) == 5 and buf == b"world"
    second, keep, _, _ = ops.open("/f", os.O_RDONLY)
    assert keep is True and second != fh
    assert ops.release(fh) == 0 and ops.release(second) == 0


def test_mount_options_follow_the_filesystem(tmp_path) -> None:  # noqa: ANN001
    assert _options(read_only(MemoryStore({})), "a,b\\c").split(",")[-1] == "ro"
    assert "fsname=a\\,b\\\\c" in _options(read_only(MemoryStore({})), "a,b\\c")
    assert "ro" not in _options(writable(MemoryStore({}), tmp_path), "out").split(",")


def writable(store: MemoryStore, tmp_path) -> ReadOnlyFS:  # noqa: ANN001
    from datamount.fs.writable import WritableFS
    from datamount.write.writeback import WriteBack, WriteBackOptions

    writeback = WriteBack(store, tmp_path / "staging", WriteBackOptions())
    return WritableFS(Namespace(store, "ds", ttl=2.0), DirectReader(store), writeback,
                      store_id="m")  # fmt: skip


def test_a_writable_filesystem_through_ops(tmp_path) -> None:  # noqa: ANN001
    store = MemoryStore({"ds/f": b"x"})
    ops = Ops(writable(store, tmp_path), on_ready=lambda: None)
    fh, entry = ops.create("/new", 0o100644, os.O_WRONLY | os.O_CREAT)
    assert fh and entry[1] == 0 and entry[6] is None  # empty, nothing served natively
    assert ops.write(fh, b"hello", 0) == 5
    assert ops.fsync(fh) == 0
    assert store.data("ds/new") == b"hello"
    after = ops.setattr("/new", fh, _lowlevel.SET_ATTR_SIZE, 0, 0, 0, 2)  # ftruncate
    assert after[1] == 2
    assert ops.flush(fh) == 0 and ops.release(fh) == 0
    assert store.data("ds/new") == b"he"
    assert ops.mkdir("/d", 0o755)[0] & 0o170000 == 0o040000 and ops.rmdir("/d") == 0
    assert ops.rename("/new", "/renamed") == 0 and ops.unlink("/renamed") == 0
    ignored = _lowlevel.SET_ATTR_MODE | _lowlevel.SET_ATTR_TIMES  # accepted, ignored
    assert ops.setattr("/f", 0, ignored, 0o600, 0, 0, 0)[1] == 1
    assert ops.rmdir("/f") == -errno.ENOTDIR
    assert ops.link("/l", 0) == ops.symlink("/s", 0) == -errno.EPERM
    assert ops.mknod("/n", 0o10644) == ops.setxattr("/f") == -errno.EOPNOTSUPP
    assert ops.lookup("/f")[1] is None  # no folder handed to the native table
    assert sorted(o.key for p in store.list_pages("ds/") for o in p.objects) == ["ds/f"]


@pytest.mark.fuse
def test_take_opens_waits_without_the_gil_and_answers_none_after_exit(tmp_path, mounts) -> None:  # noqa: ANN001
    """The thread that hands native opens to the file-ahead prefetch waits in
    take_opens with the GIL released, and ends when the session does; a path
    the table does not hold is never handed over."""
    mp = mounts.point(tmp_path / "mnt")
    mp.mkdir()
    session = _lowlevel.Session(object(), str(mp), "ro,fsname=t,subtype=datamount", timeout=1.0,
                                attr_ttl=1.0, max_threads=1)  # fmt: skip
    try:
        assert session.take_opens(0.0) == []
        assert session.cached(b"/nothing/here", None) is False
        assert session.counters()["native_prefetched"] == 0
        ticks: list[float] = []

        def tick() -> None:  # runs only if take_opens let the GIL go
            for _ in range(30):
                ticks.append(time.monotonic())
                time.sleep(0.01)

        ticker = threading.Thread(target=tick)
        stopper = threading.Timer(0.5, session.exit)
        start = time.monotonic()
        ticker.start()
        stopper.start()
        assert session.take_opens(30.0) is None
        waited = time.monotonic() - start
        ticker.join()
        assert 0.45 <= waited < 5.0
        assert sum(t < start + 0.45 for t in ticks) >= 10
        assert session.take_opens(30.0) is None  # and stays so, at once
    finally:
        del session  # unmounts
