"""Download from the other source kinds: a public https file (parallel ranges
when the server has them, one streamed GET when it does not) and a local
folder."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from datamount.storage import open_store
from datamount.storage.location import StorageKind, StorageLocation
from datamount.storage.retry import RetryPolicy
from datamount.transfer.downloader import Downloader, DownloadOptions
from test_storage_http import QuietServer, Site, make_handler

pytestmark = pytest.mark.unit

RANGE = 64 * 1024
BODY = random.Random(9).randbytes(5 * RANGE + 17)


@pytest.fixture
def site() -> Iterator[tuple[Site, str]]:
    site = Site()
    site.publish("/pub/data.bin", BODY)
    server = QuietServer(("127.0.0.1", 0), make_handler(site))
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    yield site, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def options() -> DownloadOptions:
    return DownloadOptions(threads=4, range_size=RANGE, reserved_free_disk_space=0)


@pytest.mark.parametrize("ranges", [True, False], ids=["ranges", "no-ranges"])
def test_public_file(site: tuple[Site, str], tmp_path: Path, ranges: bool) -> None:
    s, root = site
    s.ranges = ranges
    location = StorageLocation(StorageKind.HTTP, f"{root}/pub/data.bin")
    store = open_store(location, retry=RetryPolicy(retries=2, sleep=lambda x: None))
    result = Downloader(store, options()).download(
        location.key, tmp_path, is_file=True, source_id="u"
    )
    assert result.path == tmp_path / "data.bin"
    assert result.path.read_bytes() == BODY
    gets = [r for r in s.requests if r[0] == "GET"]
    if ranges:  # six 64 KiB ranges, each a bounded Range request
        assert len(gets) == 6
        assert all(r[2] and r[2].startswith("bytes=") and not r[2].endswith("-") for r in gets)
    else:  # one streamed GET, never the whole body once per range
        assert len(gets) == 1 and gets[0][2] is None


def test_local_folder(tmp_path: Path) -> None:
    src = tmp_path / "src"
    files = {"a.bin": BODY, "sub/b.txt": b"b", "sub/deeper/c": b"", "space name/ü.txt": b"u"}
    for rel, body in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(body)
    location = StorageLocation(StorageKind.LOCAL, f"{src}/")
    store = open_store(location)
    dest = tmp_path / "dest"
    result = Downloader(store, options()).download(location.key, dest, is_file=False, source_id="l")
    assert result.files == len(files)
    for rel, body in files.items():
        assert (dest / rel).read_bytes() == body
