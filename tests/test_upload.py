"""The Uploader: round trip through Azurite, content MD5 on every blob,
skip-unchanged by one listing, parallel blocks for large files, clear errors."""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from pathlib import Path

import pytest

from datamount.errors import AccessDenied, DatamountError
from datamount.storage import ObjectStore
from datamount.storage.memory import MemoryStore
from datamount.storage.retry import RetryPolicy
from datamount.transfer.downloader import Downloader, DownloadOptions
from datamount.transfer.uploader import Uploader, UploadOptions, block_id
from faults import FaultPlan, FaultyStore, forbidden, throttled

BLOCK = 64 * 1024
rng = random.Random(5)


def write_tree(root: Path, files: dict[str, bytes]) -> None:
    for rel, body in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)


TREE = {
    "empty.bin": b"",
    "small.txt": b"tiny",
    "exact-block.bin": rng.randbytes(BLOCK),
    "block-plus-one.bin": rng.randbytes(BLOCK + 1),
    "big/multi.bin": rng.randbytes(7 * BLOCK + 333),
    "space dir/ünï #%.txt": b"odd name",
    "a/b/c/deep.txt": b"deep",
}


class CountingStore:
    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> object:
        attr = getattr(self.inner, name)
        if callable(attr) and name in {"put", "stage_block", "commit_blocks", "stat", "list_pages"}:

            def counted(*a: object, **k: object) -> object:
                self.calls[name] += 1
                return attr(*a, **k)

            return counted
        return attr


def opts(**kw: object) -> UploadOptions:
    return UploadOptions(**{"threads": 4, "block_size": BLOCK, **kw})  # type: ignore[arg-type]


def test_round_trip_with_md5_and_skip(azure_store, container, tmp_path: Path) -> None:  # noqa: ANN001
    src = tmp_path / "src"
    write_tree(src, TREE)
    counting = CountingStore(azure_store)
    result = Uploader(counting, opts()).upload(src, "out/")  # type: ignore[arg-type]
    assert result.files == len(TREE)
    assert result.bytes == sum(map(len, TREE.values()))
    assert counting.calls["stage_block"] == 8 + 2  # multi.bin: 8 blocks; block-plus-one: 2
    assert counting.calls["commit_blocks"] == 2
    for rel, body in TREE.items():
        props = container.get_blob_client(f"out/{rel}").get_blob_properties()
        assert props.size == len(body)
        assert bytes(props.content_settings.content_md5) == hashlib.md5(body).digest(), rel
    # Download it elsewhere: the same tree.
    dest = tmp_path / "back"
    Downloader(
        azure_store, DownloadOptions(threads=4, range_size=BLOCK, reserved_free_disk_space=0)
    ).download("out/", dest, is_file=False, source_id="x")
    for rel, body in TREE.items():
        assert (dest / rel).read_bytes() == body
    # Unchanged: one listing, no writes.
    again = CountingStore(azure_store)
    result = Uploader(again, opts()).upload(src, "out/")  # type: ignore[arg-type]
    assert (result.files, result.skipped_files) == (0, len(TREE))
    assert again.calls["put"] == again.calls["stage_block"] == again.calls["commit_blocks"] == 0
    assert again.calls["list_pages"] == 1
    # One changed file (same size) is uploaded again, alone.
    (src / "small.txt").write_bytes(b"TINY")
    third = CountingStore(azure_store)
    result = Uploader(third, opts()).upload(src, "out/")  # type: ignore[arg-type]
    assert (result.files, result.skipped_files) == (1, len(TREE) - 1)
    assert third.calls["put"] == 1
    assert container.download_blob("out/small.txt").readall() == b"TINY"


def test_single_file_to_key_and_to_folder(azure_store, container, tmp_path: Path) -> None:  # noqa: ANN001
    path = tmp_path / "model.pt"
    path.write_bytes(rng.randbytes(3 * BLOCK))
    Uploader(azure_store, opts()).upload(path, "models/final.pt")
    Uploader(azure_store, opts()).upload(path, "models/")
    assert container.download_blob("models/final.pt").readall() == path.read_bytes()
    assert container.download_blob("models/model.pt").readall() == path.read_bytes()


@pytest.mark.unit
def test_empty_folder_uploads_nothing(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    store = MemoryStore()
    result = Uploader(store, opts()).upload(tmp_path / "empty", "x/")
    assert (result.files, result.bytes) == (0, 0)
    assert store.requests["put"] == 0


@pytest.mark.unit
def test_missing_source_is_clear(tmp_path: Path) -> None:
    with pytest.raises(DatamountError, match=r"no such file or folder to upload"):
        Uploader(MemoryStore(), opts()).upload(tmp_path / "nope", "x/")


@pytest.mark.unit
def test_transient_then_permanent(tmp_path: Path) -> None:
    write_tree(tmp_path / "s", {"a.bin": rng.randbytes(3 * BLOCK), "b.txt": b"b"})
    retry = RetryPolicy(retries=4, sleep=lambda s: None)
    inner = MemoryStore()
    plan = (
        FaultPlan()
        .fail("stage_block", times=2, error=throttled(0.0))
        .fail("put", times=1, error=throttled())
    )
    Uploader(FaultyStore(inner, plan, retry=retry), opts()).upload(tmp_path / "s", "p/")
    assert retry.stats.retries == 3
    assert inner.read("p/a.bin", 0, 10 * BLOCK) == (tmp_path / "s" / "a.bin").read_bytes()
    bad = FaultPlan().fail("*", times=None, error=forbidden())
    with pytest.raises(AccessDenied):
        Uploader(FaultyStore(MemoryStore(), bad, retry=retry), opts()).upload(tmp_path / "s", "p/")


@pytest.mark.unit
def test_block_ids_are_equal_length() -> None:
    assert len({len(block_id(i)) for i in (0, 9, 10, 49_999)}) == 1


@pytest.mark.unit
def test_what_cannot_be_a_blob_is_skipped_and_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import os

    src = tmp_path / "src"
    write_tree(src, {"a.txt": b"a", "sub/b.txt": b"b"})
    (src / "empty" / "deeper").mkdir(parents=True)
    (src / "dangling").symlink_to(tmp_path / "nowhere")
    (src / "to-folder").symlink_to(src / "sub")
    os.mkfifo(src / "pipe")
    store = MemoryStore()
    with caplog.at_level("INFO", logger="datamount.transfer.upload"):
        result = Uploader(store, opts()).upload(src, "out/")
    assert result.files == 2
    assert sorted(store.data(k) for k in ("out/a.txt", "out/sub/b.txt")) == [b"a", b"b"]
    text = caplog.text
    assert f"not uploaded: {src / 'dangling'} is a dangling symlink" in text
    assert f"not uploaded: {src / 'pipe'} is not a regular file" in text
    assert f"not uploaded: {src / 'to-folder'} is a symlink to a folder" in text
    assert "1 empty folders not uploaded" in text
