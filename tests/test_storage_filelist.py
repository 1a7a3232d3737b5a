"""FileListStore: a fixed list of files from several stores under names of
its own (what eval_mount serves). Unit tests over counting MemoryStores."""

from __future__ import annotations

import errno

import pytest

from datamount.errors import ReadOnlyError, VersionChanged
from datamount.storage.filelist import FileListStore, ListedFile
from datamount.storage.memory import MemoryStore

pytestmark = pytest.mark.unit


def listed(store: MemoryStore, key: str, shown: str) -> ListedFile:
    info = store.stat(key)
    return ListedFile(shown, store, key, info.size, info.etag, info.last_modified)


@pytest.fixture
def sources() -> tuple[MemoryStore, MemoryStore]:
    a = MemoryStore({"cam1/img1.jpg": b"A" * 1000, "cam1/img2.jpg": b"B" * 10, "other": b"x"})
    b = MemoryStore({"annotations.csv": b"id,label\n1,cat\n"})
    return a, b


def build(a: MemoryStore, b: MemoryStore, page_size: int = 5000) -> FileListStore:
    files = [
        listed(a, "cam1/img1.jpg", "acct-a/c1/cam1/img1.jpg"),
        listed(a, "cam1/img2.jpg", "acct-a/c1/cam1/img2.jpg"),
        listed(b, "annotations.csv", "acct-b/c1/annotations.csv"),
    ]
    store = FileListStore(files, inline={"MLTable": b"type: mltable\n"}, page_size=page_size)
    a.requests.clear()
    b.requests.clear()
    return store


def test_listings_and_stats_come_from_the_list(sources) -> None:  # noqa: ANN001
    a, b = sources
    store = build(a, b)
    root = next(store.list_pages("", delimiter="/"))
    assert [o.key for o in root.objects] == ["MLTable"]
    assert root.prefixes == ["acct-a/", "acct-b/"]
    page = next(store.list_pages("acct-a/c1/cam1/", delimiter="/"))
    assert [(o.key, o.size) for o in page.objects] == [
        ("acct-a/c1/cam1/img1.jpg", 1000), ("acct-a/c1/cam1/img2.jpg", 10),
    ]  # fmt: skip
    assert store.stat("acct-b/c1/annotations.csv").etag == b.stat("annotations.csv").etag
    everything = [o.key for p in store.list_pages("") for o in p.objects]
    assert len(everything) == len(store) == 4
    assert a.total_requests == 0 and b.total_requests == 1  # only the b.stat above
    with pytest.raises(FileNotFoundError):
        store.stat("acct-a/c1/other")  # in the source store, not in the list


def test_pages_split_at_page_size(sources) -> None:  # noqa: ANN001
    store = build(*sources, page_size=2)
    pages = list(store.list_pages("", delimiter="/"))
    assert [len(p.objects) + len(p.prefixes) for p in pages] == [2, 1]
    assert [len(p.objects) for p in store.list_pages("nothing/")] == [0]


def test_reads_go_to_the_source_pinned_to_the_listed_version(sources) -> None:  # noqa: ANN001
    a, b = sources
    store = build(a, b)
    assert store.read("acct-a/c1/cam1/img1.jpg", 990, 100) == b"A" * 10
    buf = bytearray(8)
    assert store.read_into("acct-b/c1/annotations.csv", 3, memoryview(buf)) == 8
    assert bytes(buf) == b"label\n1,"
    assert (a.requests["read"], b.requests["read"]) == (1, 1)
    assert store.read("MLTable", 0, 4) == b"type"  # inline: no request
    a.put("cam1/img2.jpg", b"changed")
    with pytest.raises(VersionChanged):
        store.read("acct-a/c1/cam1/img2.jpg", 0, 5)


def test_writes_are_refused(sources) -> None:  # noqa: ANN001
    store = build(*sources)
    # EROFS, as every read-only store (it was EACCES, 403, before the stores
    # shared one refusal: issue 11, "one error in one place").
    with pytest.raises(ReadOnlyError) as info:
        store.put("acct-a/c1/new", b"x")
    assert info.value.errno == errno.EROFS
    with pytest.raises(ReadOnlyError):
        store.delete("MLTable")
    with pytest.raises(FileNotFoundError):
        store.read("acct-a/c1/nope", 0, 1)
