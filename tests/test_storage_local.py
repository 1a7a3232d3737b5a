"""LocalStore specifics: atomic writes, hidden staging, key safety, symlinks,
directories, and the factory for local locations."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from datamount.errors import BadRequest, VersionChanged
from datamount.storage import open_store
from datamount.storage.local import LocalStore
from datamount.storage.location import StorageKind, StorageLocation

pytestmark = pytest.mark.unit


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_commit_is_atomic_and_leaves_nothing_behind(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put("out/model.bin", b"old")
    store.stage_block("out/model.bin", "01", b"new ")
    store.stage_block("out/model.bin", "02", b"bytes")
    # Staging is invisible: the old file is intact and listings skip the parts.
    assert (tmp_path / "out/model.bin").read_bytes() == b"old"
    assert [o.key for p in store.list_pages("out/") for o in p.objects] == ["out/model.bin"]
    store.commit_blocks("out/model.bin", ["01", "02"])
    assert (tmp_path / "out/model.bin").read_bytes() == b"new bytes"
    assert tree(tmp_path) == ["out", "out/model.bin"]


def test_failed_commit_keeps_the_old_file(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put("f", b"keep me")
    store.stage_block("f", "01", b"x")
    with pytest.raises(BadRequest):
        store.commit_blocks("f", ["01", "02"])
    assert (tmp_path / "f").read_bytes() == b"keep me"
    assert not any(".datamount.tmp" in p for p in tree(tmp_path))


def test_keys_cannot_escape_the_root(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "root")
    for key in ("../secret", "a/../../b", "x\x00y"):
        with pytest.raises(BadRequest) as info:
            store.stat(key)
        assert info.value.errno == errno.EINVAL


def test_directories_stat_as_dirs(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    info = LocalStore(tmp_path).stat("d")
    assert info.is_dir and info.size == 0


def test_symlink_loops_do_not_hang_listing(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a/file").write_bytes(b"x")
    (tmp_path / "a/loop").symlink_to(tmp_path / "a")
    (tmp_path / "a/dangling").symlink_to(tmp_path / "nowhere")
    keys = [o.key for p in LocalStore(tmp_path).list_pages("") for o in p.objects]
    assert keys == ["a/file"]


def test_in_place_change_during_pinned_reads_is_estale(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    info = store.put("f", b"0123456789")
    with open(tmp_path / "f", "r+b") as f:  # same inode, same size, new mtime
        f.write(b"X")
    os.utime(tmp_path / "f", ns=(5, 5))
    with pytest.raises(VersionChanged):
        store.read("f", 0, 4, etag=info.etag)


def test_pages_are_bounded(tmp_path: Path) -> None:
    for i in range(25):
        (tmp_path / f"{i:02d}").write_bytes(b"")
    pages = list(LocalStore(tmp_path, page_size=10).list_pages(""))
    assert [len(p.objects) for p in pages] == [10, 10, 5]


def test_open_store_for_a_local_location(tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_bytes(b"local bytes")
    location = StorageLocation(StorageKind.LOCAL, str(tmp_path / "data.txt"))
    store = open_store(location)
    assert isinstance(store, LocalStore)
    assert store.read(location.key, 6, 100) == b"bytes"
    folder = StorageLocation(StorageKind.LOCAL, str(tmp_path) + "/")
    assert [o.key for p in store.list_pages(folder.key) for o in p.objects] == [location.key]
