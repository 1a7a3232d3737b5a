"""The baseline contenders, one per process so the benchmark can measure each one's
CPU and peak RSS alone. Run by benchmarks/transfer.py, never imported by it:

    python benchmarks/_workers.py sdk-download   CONTAINER PREFIX DEST [--file]
    python benchmarks/_workers.py adlfs-download CONTAINER PREFIX DEST [--file]
    python benchmarks/_workers.py limit-read     ENDPOINT CONTAINER PREFIX [--file]
    python benchmarks/_workers.py sdk-upload     SRC CONTAINER PREFIX

Secrets come from the environment, never argv: BENCH_CONNECTION_STRING (SDK, adlfs)
and BENCH_SAS (the limit reader). Over HTTPS every contender trusts the benchmark's
CA through SSL_CERT_FILE / REQUESTS_CA_BUNDLE. PREFIX is the blob name with --file (written to
DEST/<basename>), else a folder prefix ending in "/" (the tree lands under DEST).
Threads: 16 workers in every contender, as the brief of each baseline says.
Imports the Azure SDK and adlfs; nothing from datamount.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import queue
import threading
import urllib.parse
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _http import connection

THREADS = 16
RANGE = 8 * 1024 * 1024  # the limit reader's range size for big blobs (docs/design/download.md)


def _local_path(dest: Path, prefix: str, name: str, is_file: bool) -> Path:
    return dest / (Path(name).name if is_file else name[len(prefix) :])


def sdk_download(container: str, prefix: str, dest: Path, is_file: bool) -> None:
    """azure-storage-blob: download_blob(max_concurrency=16).readinto(file), 16 blobs at a time."""
    from azure.storage.blob import ContainerClient

    client = ContainerClient.from_connection_string(
        os.environ["BENCH_CONNECTION_STRING"], container
    )
    names = [prefix] if is_file else [b.name for b in client.list_blobs(name_starts_with=prefix)]

    def get(name: str) -> None:
        path = _local_path(dest, prefix, name, is_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as out:
            client.download_blob(name, max_concurrency=16).readinto(out)

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(get, names))


def adlfs_download(container: str, prefix: str, dest: Path, is_file: bool) -> None:
    """adlfs: AzureBlobFileSystem(...).get(remote, local, recursive=True)."""
    from adlfs import AzureBlobFileSystem

    fs = AzureBlobFileSystem(
        account_name="devstoreaccount1", connection_string=os.environ["BENCH_CONNECTION_STRING"]
    )
    dest.mkdir(parents=True, exist_ok=True)
    if is_file:
        fs.get(f"{container}/{prefix}", str(dest / Path(prefix).name))
    else:  # a trailing "/" on both sides: the folder's contents land directly in dest
        fs.get(f"{container}/{prefix}", f"{dest}/", recursive=True)


def _list(
    conn: http.client.HTTPConnection, base: str, prefix: str, sas: str
) -> list[tuple[str, int]]:
    """(name, size) of every blob under `prefix`: List Blobs pages, followed by marker."""
    blobs: list[tuple[str, int]] = []
    marker = ""
    while True:
        query = f"restype=container&comp=list&prefix={urllib.parse.quote(prefix)}&{sas}"
        conn.request("GET", f"{base}?{query}&marker={urllib.parse.quote(marker)}")
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise SystemExit(f"list {prefix}: HTTP {resp.status}: {body[:200]!r}")
        root = ET.fromstring(body)
        for blob in root.iter("Blob"):
            size = int(blob.findtext("Properties/Content-Length") or 0)
            blobs.append((blob.findtext("Name") or "", size))
        marker = root.findtext("NextMarker") or ""
        if not marker:
            return blobs


def limit_read(endpoint: str, container: str, prefix: str, is_file: bool) -> None:
    """The storage limit: 16 threads, one keep-alive connection each, SAS-authenticated
    GETs (no signing per request): 8 MiB ranges of big blobs, small blobs whole. Bytes
    are read into one reusable buffer per thread and discarded; prints the byte count."""
    url = urllib.parse.urlsplit(endpoint)
    base = f"{url.path.rstrip('/')}/{container}"
    sas = os.environ["BENCH_SAS"]
    lister = connection(url)
    blobs = [b for b in _list(lister, base, prefix, sas) if not is_file or b[0] == prefix]
    lister.close()
    tasks: queue.SimpleQueue[tuple[str, int, int] | None] = queue.SimpleQueue()
    for name, size in blobs:
        if size <= RANGE:
            tasks.put((name, 0, 0))  # whole blob, no Range header
            continue
        for offset in range(0, size, RANGE):
            tasks.put((name, offset, min(RANGE, size - offset)))
    for _ in range(THREADS):
        tasks.put(None)
    counts = [0] * THREADS
    errors: list[str] = []

    def work(index: int) -> None:
        conn = connection(url)
        view = memoryview(bytearray(RANGE))
        while (task := tasks.get()) is not None:
            name, offset, length = task
            headers = {"Range": f"bytes={offset}-{offset + length - 1}"} if length else {}
            try:
                conn.request("GET", f"{base}/{urllib.parse.quote(name)}?{sas}", headers=headers)
                resp = conn.getresponse()
                if resp.status not in (200, 206):
                    errors.append(f"{name}@{offset}: HTTP {resp.status}")
                    resp.read()
                    continue
                while got := resp.readinto(view):
                    counts[index] += got
            # No retries: a failed GET voids the limit run rather than slowing it.
            except (OSError, http.client.HTTPException) as exc:
                errors.append(f"{name}@{offset}: {exc}")
                conn.close()
        conn.close()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"{len(errors)} failed GETs, first: {errors[0]}")
    print(json.dumps({"bytes": sum(counts), "blobs": len(blobs)}))


def sdk_upload(src: Path, container: str, prefix: str) -> None:
    """azure-storage-blob: upload_blob(data=file, max_concurrency=16, overwrite=True),
    16 files at a time."""
    from azure.storage.blob import ContainerClient

    client = ContainerClient.from_connection_string(
        os.environ["BENCH_CONNECTION_STRING"], container
    )
    files = sorted(p for p in src.rglob("*") if p.is_file())

    def put(path: Path) -> None:
        with open(path, "rb") as data:
            name = prefix + path.relative_to(src).as_posix()
            client.upload_blob(name, data=data, max_concurrency=16, overwrite=True)

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(put, files))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("contender")
    parser.add_argument("args", nargs=3)
    parser.add_argument("--file", action="store_true", help="PREFIX names one blob")
    opts = parser.parse_args()
    a, b, c = opts.args
    if opts.contender == "sdk-download":
        sdk_download(a, b, Path(c), opts.file)
    elif opts.contender == "adlfs-download":
        adlfs_download(a, b, Path(c), opts.file)
    elif opts.contender == "limit-read":
        limit_read(a, b, c, opts.file)
    elif opts.contender == "sdk-upload":
        sdk_upload(Path(a), b, c)
    else:
        parser.error(f"unknown contender {opts.contender!r}")


if __name__ == "__main__":
    main()
