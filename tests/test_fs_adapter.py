"""The FUSE adapter without a mount: one errno funnel, kernel timeouts that
follow the attribute TTL, keep_cache from the ops' decision."""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterator
from types import SimpleNamespace

import mfusepy
import pytest

from datamount.fs.fuse_adapter import MAX_IO, NEVER_SECONDS, Adapter
from datamount.fs.namespace import Namespace
from datamount.fs.ops import ReadOnlyFS
from datamount.read.reader import DirectReader
from datamount.storage.base import ListPage
from datamount.storage.memory import MemoryStore

pytestmark = pytest.mark.unit


class Broken(MemoryStore):
    def list_pages(self, prefix: str, *, delimiter: str | None = None) -> Iterator[ListPage]:
        raise RuntimeError("a bug, not an OSError")


def adapter(store: MemoryStore, ttl: float | None = None) -> Adapter:
    fs = ReadOnlyFS(Namespace(store, "ds", ttl=ttl), DirectReader(store), store_id="mem")
    return Adapter(fs, ttl_seconds=ttl, on_ready=lambda: None)


def fuse_errno(fn, *args) -> int:  # noqa: ANN001
    with pytest.raises(mfusepy.FuseOSError) as caught:
        result = fn(*args)
        if isinstance(result, Iterator):
            list(result)
    return caught.value.errno


def test_oserrors_keep_their_errno() -> None:
    a = adapter(MemoryStore({"ds/f": b"x"}))
    assert fuse_errno(a.getattr, "/missing") == errno.ENOENT
    assert fuse_errno(a.mkdir, "/d", 0o755) == errno.EROFS
    # raw_fi=True: mfusepy hands write its fuse_file_info
    assert fuse_errno(a.write, "/f", b"x", 0, SimpleNamespace(fh=1)) == errno.EROFS


def test_unexpected_exceptions_become_eio_with_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    a = adapter(Broken({"ds/f": b"x"}))
    with caplog.at_level(logging.ERROR, logger="datamount.fuse"):
        assert fuse_errno(a.getattr, "/f") == errno.EIO
        dh = a.opendir("/")  # the root needs no request
        assert fuse_errno(a.readdir_with_offset, "/", 0, dh) == errno.EIO  # raised mid-stream
    assert "RuntimeError: a bug, not an OSError" in caplog.text  # the traceback is logged


def test_open_sets_keep_cache_and_read_uses_the_handle() -> None:
    a = adapter(MemoryStore({"ds/f": b"hello world"}))
    fi = SimpleNamespace(flags=os.O_RDONLY, fh=0, keep_cache=1, direct_io=1)
    assert a.open("/f", fi) == 0
    assert (fi.keep_cache, fi.direct_io) == (0, 0)  # first open of this version
    assert a.read("/f", 5, 6, fi) == b"world"
    second = SimpleNamespace(flags=os.O_RDONLY, fh=0, keep_cache=0, direct_io=0)
    a.open("/f", second)
    assert second.keep_cache == 1 and second.fh != fi.fh
    assert a.release("/f", fi) == 0 and a.release("/f", second) == 0


@pytest.mark.parametrize("ttl,expected", [(None, NEVER_SECONDS), (0.25, 0.25), (0.0, 0.0)])
def test_kernel_timeouts_follow_the_attribute_ttl(ttl: float | None, expected: float) -> None:
    ready: list[bool] = []
    store = MemoryStore({})
    fs = ReadOnlyFS(Namespace(store, "ds", ttl=ttl), DirectReader(store), store_id="mem")
    a = Adapter(fs, ttl_seconds=ttl, on_ready=lambda: ready.append(True))
    config = SimpleNamespace(attr_timeout=1.0, entry_timeout=1.0, negative_timeout=0.0,
                             kernel_cache=1, direct_io=1)  # fmt: skip
    conn = SimpleNamespace(proto_major=7, proto_minor=45, max_readahead=131072, max_write=4096,
                           max_read=0, capable=0, want=0)  # fmt: skip
    a.init_with_config(conn, config)
    assert config.attr_timeout == config.entry_timeout == config.negative_timeout == expected
    assert config.kernel_cache == 0 and config.direct_io == 0  # keep_cache is per open
    assert conn.max_write == MAX_IO and ready == [True]


def test_writable_fs_through_the_adapter(tmp_path) -> None:  # noqa: ANN001
    from datamount.fs.writable import WritableFS
    from datamount.write.writeback import WriteBack, WriteBackOptions

    store = MemoryStore({"ds/f": b"x"})
    writeback = WriteBack(store, tmp_path / "staging", WriteBackOptions())
    fs = WritableFS(Namespace(store, "ds", ttl=2.0), DirectReader(store), writeback, store_id="m")
    a = Adapter(fs, ttl_seconds=2.0, on_ready=lambda: None)
    fi = SimpleNamespace(flags=os.O_WRONLY | os.O_CREAT, fh=0, keep_cache=1, direct_io=1)
    assert a.create("/new", 0o100644, fi) == 0
    assert fi.fh and (fi.keep_cache, fi.direct_io) == (0, 0)
    assert a.write("/new", b"hello", 0, fi) == 5
    assert a.fsync("/new", 0, fi) == 0
    assert store.data("ds/new") == b"hello"
    assert a.flush("/new", fi) == 0 and a.release("/new", fi) == 0
    assert a.mkdir("/d", 0o755) == 0 and a.rmdir("/d") == 0
    assert a.rename("/new", "/renamed") == 0 and a.unlink("/renamed") == 0
    assert a.chmod("/f", 0o600) == a.chown("/f", 0, 0) == a.utimens("/f", None) == 0
    assert fuse_errno(a.rmdir, "/f") == errno.ENOTDIR
    assert sorted(k for p in store.list_pages("ds/") for k in [o.key for o in p.objects]) == [
        "ds/f"
    ]
